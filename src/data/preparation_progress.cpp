#include "data/preparation_progress.hpp"

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/file_io.hpp"

namespace gpt2 {

namespace fs = std::filesystem;

fs::path progress_path(const fs::path& dir, std::string_view name) {
    return dir / (std::string(name) + ".progress.json");
}

std::string preparation_fingerprint(const Tokenizer& tokenizer, const PreparationSettings& settings,
                                    std::span<const CorpusFile> files) {
    nlohmann::json j;
    j["tokenizer"] = tokenizer_kind_name(tokenizer.kind());
    j["vocab_size"] = tokenizer.vocab_size();
    j["eot_in_text"] = settings.eot_in_text;
    j["jsonl_field"] = settings.jsonl_field;
    j["val_fraction"] = settings.val_fraction;
    j["val_documents"] = settings.val_documents;
    j["shard_tokens"] = settings.shard_tokens;
    for (const CorpusFile& f : files)
        j["files"].push_back({f.path.string(), f.bytes});
    return j.dump();
}

void write_progress(const fs::path& path, std::string_view fingerprint, const ShardWriter& train,
                    const ShardWriter& val, bool complete) {
    nlohmann::json j;
    j["fingerprint"] = std::string(fingerprint);
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
    if (j.is_discarded() || !j.contains("fingerprint")) throw not_progress;
    PreparationProgress progress;
    try {
        progress.fingerprint = j.at("fingerprint").get<std::string>();
        progress.complete = j.value("complete", false);
        for (SplitProgress* split : {&progress.train, &progress.val}) {
            const nlohmann::json& s = j.at(split == &progress.train ? "train" : "val");
            split->shards = s.at("shards").get<std::int64_t>();
            split->tokens = s.at("tokens").get<std::int64_t>();
            split->next = {s.at("piece").get<std::uint64_t>(), s.at("skip").get<std::uint64_t>()};
        }
    } catch (const nlohmann::json::exception&) {
        throw not_progress;
    }
    return progress;
}

}  // namespace gpt2
