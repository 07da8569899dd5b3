#include "data/prepare/preparation_progress.hpp"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "core/error.hpp"
#include "core/file_io.hpp"

namespace gpt2 {

namespace fs = std::filesystem;

namespace {

// The recorded settings' keys and the flags that set them, in the order they are compared.
struct SettingFlag {
    const char* key;
    const char* flag;
};
constexpr SettingFlag kSettingFlags[] = {
    {"tokenizer", "--tokenizer"},
    {"vocab_size", "--vocab-size"},
    {"bpe_sample_mb", "--bpe-sample-mb"},
    {"eot_in_text", "--eot-in-text"},
    {"jsonl_field", "--text-field"},
    {"val_fraction", "--val-fraction"},
    {"val_documents", "--val-documents"},
    {"shard_tokens", "--shard-tokens"},
    {"loss_on", "--loss-on"},
};

// A recorded value as the command line writes it (0.1, not 0.10000000000000001).
std::string as_typed(const nlohmann::json& value) {
    if (value.is_string()) return value.get<std::string>();
    if (value.is_number_float()) {
        std::ostringstream out;
        out << value.get<double>();
        return out.str();
    }
    return value.dump();
}

std::string file_key(const std::string& path) {
    return fs::path(path).lexically_normal().string();
}

// How the corpus differs from the recorded files ([[path, bytes], ...]), or "".
std::string files_difference(const nlohmann::json& recorded, std::span<const CorpusFile> files,
                             std::string_view input_flag) {
    const std::string flag = std::string(input_flag) + ": ";
    std::vector<std::string> recorded_paths;
    for (const nlohmann::json& f : recorded)
        recorded_paths.push_back(file_key(f.at(0).get<std::string>()));
    for (const CorpusFile& f : files) {
        if (std::find(recorded_paths.begin(), recorded_paths.end(), file_key(f.path.string())) ==
            recorded_paths.end()) {
            return flag + f.path.string() + " is not one of the preparation's files";
        }
    }
    for (std::size_t i = 0; i < recorded.size(); ++i) {
        const bool listed = std::any_of(files.begin(), files.end(), [&](const CorpusFile& f) {
            return file_key(f.path.string()) == recorded_paths[i];
        });
        if (!listed) {
            return flag + "the preparation's file " + recorded[i].at(0).get<std::string>() +
                   " is not among the inputs";
        }
    }
    for (std::size_t i = 0; i < files.size(); ++i) {
        if (file_key(files[i].path.string()) != recorded_paths[i]) {
            return flag + "the files come in another order than the preparation's (" +
                   files[i].path.string() + " was not file " + std::to_string(i + 1) + ")";
        }
        const auto bytes = recorded[i].at(1).get<std::uintmax_t>();
        if (files[i].bytes != bytes) {
            return flag + files[i].path.string() + " has " + std::to_string(files[i].bytes) +
                   " bytes (the preparation's: " + std::to_string(bytes) + ")";
        }
    }
    return {};
}

}  // namespace

fs::path progress_path(const fs::path& dir, std::string_view name) {
    return dir / (std::string(name) + ".progress.json");
}

std::string record_settings(const PreparationSettings& settings,
                            std::span<const CorpusFile> files) {
    nlohmann::json j;
    j["tokenizer"] = settings.tokenizer;
    j["vocab_size"] = settings.vocab_size;
    j["bpe_sample_mb"] = settings.bpe_sample_mb;
    j["eot_in_text"] = settings.eot_in_text;
    j["jsonl_field"] = settings.text_field;  // the key of older files, so that they resume
    j["val_fraction"] = settings.val_fraction;
    j["val_documents"] = settings.val_documents;
    j["shard_tokens"] = settings.shard_tokens;
    j["loss_on"] = settings.loss_on;
    j["files"] = nlohmann::json::array();
    for (const CorpusFile& f : files)
        j["files"].push_back({f.path.string(), f.bytes});
    return j.dump();
}

std::optional<std::string> settings_difference(std::string_view recorded,
                                               const PreparationSettings& settings,
                                               std::span<const CorpusFile> files,
                                               std::string_view input_flag) {
    const nlohmann::json was = nlohmann::json::parse(recorded);
    const nlohmann::json now = nlohmann::json::parse(record_settings(settings, files));
    for (const SettingFlag& s : kSettingFlags) {
        // A key an older file lacks is not compared.
        if (!was.contains(s.key) || was.at(s.key) == now.at(s.key)) continue;
        return std::string(s.flag) + " " + as_typed(now.at(s.key)) +
               " (the preparation's: " + as_typed(was.at(s.key)) + ")";
    }
    std::string files_differ = files_difference(was.at("files"), files, input_flag);
    if (!files_differ.empty()) return files_differ;
    return std::nullopt;
}

void write_progress(const fs::path& path, std::string_view settings,
                    std::uint64_t tokenizer_checksum, const ShardWriter& train,
                    const ShardWriter& val, bool complete) {
    nlohmann::json j;
    j["settings"] = nlohmann::json::parse(settings);
    char checksum[17];
    std::snprintf(checksum, sizeof(checksum), "%016llx",
                  static_cast<unsigned long long>(tokenizer_checksum));
    j["tokenizer_checksum"] = checksum;
    j["complete"] = complete;
    for (const ShardWriter* w : {&train, &val}) {
        j[w == &train ? "train" : "val"] = {{"shards", w->shards()},
                                            {"tokens", w->tokens()},
                                            {"piece", w->next().piece},
                                            {"skip", w->next().skip}};
    }
    const std::string text = j.dump(1) + "\n";
    write_file_atomically(
        path, std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
}

std::optional<PreparationProgress> read_progress(const fs::path& path) {
    if (!fs::exists(path)) return std::nullopt;
    const std::vector<std::uint8_t> bytes = read_file_bytes(path);
    const nlohmann::json j = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
    const InputError not_progress(path.string() + ": not a prepare_data progress file");
    if (j.is_discarded() || !j.is_object()) throw not_progress;
    PreparationProgress progress;
    try {
        nlohmann::json settings;
        if (j.contains("settings")) {
            settings = j.at("settings");
        } else {
            // Before: one "fingerprint" string holding the same keys, but the vocabulary size was
            // the tokenizer's, not the flag's, and --bpe-sample-mb was not recorded.
            settings = nlohmann::json::parse(j.at("fingerprint").get<std::string>());
            settings.erase("vocab_size");
        }
        if (!settings.is_object() || !settings.at("files").is_array()) throw not_progress;
        for (const nlohmann::json& f : settings.at("files")) {
            if (!f.is_array() || f.size() != 2 || !f.at(0).is_string() ||
                !f.at(1).is_number_unsigned())
                throw not_progress;
        }
        progress.settings = settings.dump();
        if (j.contains("tokenizer_checksum")) {
            progress.tokenizer_checksum =
                std::stoull(j.at("tokenizer_checksum").get<std::string>(), nullptr, 16);
        }
        progress.complete = j.value("complete", false);
        for (SplitProgress* split : {&progress.train, &progress.val}) {
            const nlohmann::json& s = j.at(split == &progress.train ? "train" : "val");
            split->shards = s.at("shards").get<std::int64_t>();
            split->tokens = s.at("tokens").get<std::int64_t>();
            split->next = {s.at("piece").get<std::uint64_t>(), s.at("skip").get<std::uint64_t>()};
        }
    } catch (const nlohmann::json::exception&) {
        throw not_progress;
    } catch (const std::logic_error&) {  // std::stoull: not a hexadecimal number
        throw not_progress;
    }
    return progress;
}

}  // namespace gpt2
