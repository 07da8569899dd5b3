// inference's command line: the flags (CLI11) that fill Options, and the checks between them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "model/decode_weights.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2::inference {

// --prompt-file's name for standard input.
inline constexpr std::string_view kStdinName = "-";

struct Options {
    std::string checkpoint;
    std::string prompt;
    std::string prompt_file;
    int max_new_tokens = 256;
    float temperature = 1.0f;
    int top_k = 0;
    float top_p = 1.0f;
    std::uint64_t seed = 1337;
    int num_samples = 1;
    bool stream = true;
    bool interactive = false;
    // A sample ends at the end-of-text token (not printed) unless ignore_eot; at the first of the
    // stop strings (not printed either, OpenAI's `stop`); and with --chat at the end of the
    // assistant's turn.
    bool ignore_eot = false;
    std::vector<std::string> stop;
    float repetition_penalty = 1.0f;
    // --chat: stdin lines are the user's messages of one conversation, laid out with prepare_data's
    // chat template; `system` is its first message, if any.
    bool chat = false;
    std::string system;
    int threads = 0;
    std::string tokenizer;  // empty: none given
    // --tokenizer's kind, when given.
    [[nodiscard]] std::optional<gpt2::TokenizerKind> tokenizer_kind() const {
        if (tokenizer.empty()) return std::nullopt;
        return gpt2::tokenizer_kinds_by_name().at(tokenizer);
    }
    std::string tokenizer_dir = "data/gpt2";
    std::string tokenizer_corpus;
    std::string log_level = "info";
    std::string eot_in_text = "token";
    std::string weights = "fp32";

    [[nodiscard]] WeightFormat weight_format() const { return parse_weight_format(weights); }

    [[nodiscard]] bool prompt_from_stdin() const { return prompt_file == kStdinName; }
};

// Options, or the exit code when parsing ends the program (--help, --version, bad flags). Only the
// speaker prints, so that N ranks parsing the same command line report a bad flag once (every
// rank reaches the same verdict, so none waits for another).
[[nodiscard]] std::variant<Options, int> parse_options(int argc, char** argv, bool speaker);

}  // namespace gpt2::inference
