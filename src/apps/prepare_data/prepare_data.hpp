// What the pieces of prepare_data share (private to this folder): the log's counts, the output
// folder and GPT-2's tokenizer, and each piece's entry: the checks, the preparation, its summary.
#pragma once

#include <spdlog/fmt/fmt.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "apps/prepare_data/options.hpp"
#include "core/clock.hpp"
#include "data/documents.hpp"
#include "data/prepare/corpus_split.hpp"
#include "data/prepare/shard_stream.hpp"
#include "data/prepare/shard_writer.hpp"
#include "threads/cpu_topology.hpp"
#include "threads/thread_pool.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2::prepare_data {

// "1 shard", "2 shards": the log's counts.
inline std::string count_of(std::uint64_t n, std::string_view noun) {
    return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s");
}

// --threads, 0 (the default) resolved as train_gpt2 does: the CPUs this process may run on.
inline int encoding_threads(const Options& o) {
    return o.threads > 0 ? o.threads : gpt2::available_cpus();
}

// main.cpp: what both modes (shards, --hellaswag) use.
void create_out_dir(const std::filesystem::path& dir);
[[nodiscard]] std::unique_ptr<gpt2::Tokenizer> load_gpt2(const Options& o);

// checks.cpp: the command line checked before any expensive work, against the corpus files once
// they are listed, and against the splits the corpus made.
void check_flags(const Options& o);
void check_flags_against_files(const Options& o, std::span<const gpt2::CorpusFile> files);
void check_splits(const Options& o, const gpt2::CorpusSplit& corpus, std::uint64_t documents,
                  const gpt2::ShardWriter& train, const gpt2::ShardWriter& val);

// preparation.cpp: the shards; returns the exit code (130, as if interrupted, when
// --stop-after-shards stopped it).
[[nodiscard]] int prepare_shards(Options o);

// summary.cpp: what the log says of the shards kept after a stop, and at the end of a preparation.
[[nodiscard]] std::string kept_shards(const Options& o, const gpt2::ShardWriter& train,
                                      const gpt2::ShardWriter& val);
void log_summary(const Options& o, const gpt2::CorpusSplit& corpus,
                 const gpt2::ShardStreamTotals& totals, const gpt2::DocumentReader& reader,
                 const gpt2::ShardWriter& train, const gpt2::ShardWriter& val,
                 Clock::time_point started);

}  // namespace gpt2::prepare_data
