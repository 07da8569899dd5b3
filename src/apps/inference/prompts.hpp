// inference's prompts: read by rank 0 (--prompt, --prompt-file, or stdin lines with
// --interactive), encoded and checked against the model, and shared with every rank.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "apps/inference/options.hpp"
#include "data/chat_template.hpp"
#include "model/model.hpp"
#include "parallel/comm.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2::inference {

// A prompt: its tokens (on every rank), its text (on rank 0, which prints it) and, with
// --interactive, its stdin line number (1-based; it also seeds the samples).
struct Prompt {
    std::uint64_t line = 0;
    std::vector<std::int32_t> tokens;
    std::string text;
};

// Whether standard input is a pipe or a file with bytes in it: text meant as a prompt that no
// flag reads, which must not be ignored in silence. Never blocks: a pipe with nothing in it yet
// counts as empty, and a terminal or /dev/null is not looked at. Consumes at most one byte (the
// program then stops anyway).
[[nodiscard]] bool stdin_holds_data();

// The single prompt (--prompt, --prompt-file or none), read and encoded by rank 0; every rank
// gets the tokens, rank 0 also the text.
[[nodiscard]] Prompt single_prompt(const Options& o, const Communicator& comm,
                                   const Tokenizer& tokenizer, const Model& model);

// Rank 0 reads stdin lines until one encodes, reporting and skipping those that do not (one bad
// line must not end a session), and shares its tokens; nullopt at end of input. `lines_read`
// counts the lines rank 0 has read.
[[nodiscard]] std::optional<Prompt> next_prompt(const Communicator& comm,
                                                const Tokenizer& tokenizer, const Model& model,
                                                EotInText eot, std::uint64_t& lines_read);

// --chat: reads the user's next message (a stdin line) into `conversation` and returns the
// tokens that ask the model for the assistant's reply: end-of-text (where the tokenizer has one:
// a training document begins with it) and the conversation in prepare_data's chat template,
// ending "\n\nassistant: ". A line that cannot be encoded is reported and dropped; nullopt at
// the end of input. Rank 0 alone (a conversation is one sample).
[[nodiscard]] std::optional<Prompt> next_chat_prompt(std::vector<ChatMessage>& conversation,
                                                     const Tokenizer& tokenizer, const Model& model,
                                                     std::uint64_t& lines_read);

}  // namespace gpt2::inference
