// prepare_data's progress file, NAME.progress.json beside the shards, written when a preparation
// starts and rewritten atomically after every shard: what --resume needs, the flags and files it
// must match and where each split goes on.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "data/documents.hpp"
#include "data/prepare/shard_writer.hpp"

namespace gpt2 {

// The flags that decide a preparation's output, as the user gave them: a resumed preparation must
// share them with the one it continues. Not --skip-bad-lines (a run stopped by a bad line goes on
// with it: the lines before were read the same way), nor --threads or --log-level.
struct PreparationSettings {
    std::string tokenizer;        // --tokenizer
    std::int64_t vocab_size = 0;  // --vocab-size, with --tokenizer bpe (else 0)
    double bpe_sample_mb = 0.0;   // --bpe-sample-mb, with --tokenizer bpe (else 0)
    std::string eot_in_text;
    std::string text_field;  // --text-field (recorded as "jsonl_field", its older name)
    double val_fraction = 0.0;
    std::int64_t val_documents = 0;
    std::int64_t shard_tokens = 0;
    std::string loss_on{};  // --loss-on as resolved: "response" or "all"
};

// One split as the file records it.
struct SplitProgress {
    std::int64_t shards = 0;
    std::int64_t tokens = 0;
    ShardPosition next;
};

struct PreparationProgress {
    std::string settings;  // record_settings() of the run that wrote it (JSON)
    // checksum64 of the tokenizer.bin the preparation wrote (0: not recorded, an older file).
    std::uint64_t tokenizer_checksum = 0;
    bool complete = false;
    SplitProgress train;
    SplitProgress val;

    [[nodiscard]] std::int64_t shards() const { return train.shards + val.shards; }
};

// dir/NAME.progress.json.
[[nodiscard]] std::filesystem::path progress_path(const std::filesystem::path& dir,
                                                  std::string_view name);

// The settings and the corpus files, as the progress file records them.
[[nodiscard]] std::string record_settings(const PreparationSettings& settings,
                                          std::span<const CorpusFile> files);

// The first way `settings` and `files` differ from `recorded` (record_settings), as the user would
// say it: "--tokenizer gpt2 (the preparation's: char)", "--data: FILE has N bytes (the
// preparation's: M)"; nothing when they agree. `input_flag` names the corpus flag.
[[nodiscard]] std::optional<std::string> settings_difference(std::string_view recorded,
                                                             const PreparationSettings& settings,
                                                             std::span<const CorpusFile> files,
                                                             std::string_view input_flag);

// Writes the file atomically (InputError naming it on failure).
void write_progress(const std::filesystem::path& path, std::string_view settings,
                    std::uint64_t tokenizer_checksum, const ShardWriter& train,
                    const ShardWriter& val, bool complete);

// The file at `path`, or nothing if there is none. InputError "not a prepare_data progress file"
// if it is not one (not JSON, a field missing or of the wrong type). A file from before the
// settings were recorded flag by flag reads as its settings but the requested vocabulary size.
[[nodiscard]] std::optional<PreparationProgress> read_progress(const std::filesystem::path& path);

}  // namespace gpt2
