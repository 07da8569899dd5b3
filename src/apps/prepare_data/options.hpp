// prepare_data's command line: the flags (CLI11) that fill Options.
#pragma once

#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "tokenizer/tokenizer.hpp"

namespace gpt2::prepare_data {

struct Options {
    std::vector<std::filesystem::path> inputs;
    std::string data_flag =
        "--data";  // as the user spelled it (--input, the older name), for errors
    std::string glob = "*";
    std::string text_field = "text";
    std::string text_flag =
        "--text-field";  // as the user spelled it (--jsonl-field, the older name)
    bool skip_bad_lines = false;
    // --loss-on: "response" (a loss mask beside each shard), "all", or empty (not given: response
    // when the corpus's first record is prompt/response or chat, all otherwise).
    std::string loss_on;
    gpt2::TokenizerKind tokenizer = gpt2::TokenizerKind::Char;
    int vocab_size = 4096;
    std::filesystem::path tokenizer_dir = "data/gpt2";
    double bpe_sample_mb = 256;
    std::filesystem::path out_dir;
    std::string name;
    double val_fraction = 0.1;
    std::int64_t val_documents = 0;
    std::int64_t shard_tokens = 100'000'000;
    bool resume = false;
    // Replace an earlier preparation of this --name made with another tokenizer (its shards
    // would be read with this run's tokenizer.bin): refused without it.
    bool replace = false;
    std::int64_t stop_after_shards = 0;  // testing: act as if interrupted after N shards
    std::filesystem::path hellaswag;     // HellaSwag's JSONL to turn into llm.c's eval file
    int threads = 0;  // 0: the CPUs in the affinity mask, as train_gpt2's --threads
    std::string eot_in_text = "token";
    std::string log_level = "info";
    std::set<std::string> given;  // the flags on the command line (by their documented names)

    // Whether `flag` was on the command line: one that the mode or tokenizer does not use is
    // refused or warned about, never silently ignored.
    [[nodiscard]] bool has(const std::string& flag) const { return given.count(flag) > 0; }
};

// Options, or the exit code when parsing ends the program (--help, --version, bad flags). An
// empty --name becomes the first input's name without its extensions (.txt, .jsonl, .parquet,
// .gz, .zst).
[[nodiscard]] std::variant<Options, int> parse_options(int argc, char** argv);

}  // namespace gpt2::prepare_data
