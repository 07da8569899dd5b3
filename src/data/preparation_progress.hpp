// prepare_data's progress file, NAME.progress.json beside the shards, rewritten atomically after
// every shard: what --resume needs, the options and files it must match and where each split goes
// on.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "data/documents.hpp"
#include "data/shard_writer.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {

// The settings a resumed preparation must share with the interrupted one, besides the tokenizer
// and the files (not --skip-bad-lines: a run stopped by a bad line can go on with it, the lines
// before were read the same way).
struct PreparationSettings {
    std::string eot_in_text;
    std::string jsonl_field;
    double val_fraction = 0.0;
    std::int64_t val_documents = 0;
    std::int64_t shard_tokens = 0;
};

// One split as the file records it.
struct SplitProgress {
    std::int64_t shards = 0;
    std::int64_t tokens = 0;
    ShardPosition next;
};

struct PreparationProgress {
    std::string fingerprint;  // preparation_fingerprint() of the run that wrote it
    bool complete = false;
    SplitProgress train;
    SplitProgress val;
};

// dir/NAME.progress.json.
[[nodiscard]] std::filesystem::path progress_path(const std::filesystem::path& dir,
                                                  std::string_view name);

// What must not change between a preparation and its --resume, as one comparable string.
[[nodiscard]] std::string preparation_fingerprint(const Tokenizer& tokenizer,
                                                  const PreparationSettings& settings,
                                                  std::span<const CorpusFile> files);

// Writes the file atomically (InputError naming it on failure).
void write_progress(const std::filesystem::path& path, std::string_view fingerprint,
                    const ShardWriter& train, const ShardWriter& val, bool complete);

// The file at `path`, or nothing if there is none. InputError "not a prepare_data progress file"
// if it is not one (not JSON, a field missing or of the wrong type).
[[nodiscard]] std::optional<PreparationProgress> read_progress(const std::filesystem::path& path);

}  // namespace gpt2
