// The OpenAI-compatible API's requests: JSON bodies of /v1/completions and /v1/chat/completions
// checked field by field into what the engine runs, every refusal naming its field (a 400 with
// OpenAI's error object in the server).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "model/sampling.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2::serve {

// A request the server refuses: `field` names what is wrong ("" for the body as a whole).
class RequestError : public std::runtime_error {
  public:
    RequestError(std::string field, const std::string& message)
        : std::runtime_error(message), field_(std::move(field)) {}
    [[nodiscard]] const std::string& field() const { return field_; }

  private:
    std::string field_;
};

// What the server accepts at most: a body, prompts in one request, stop strings and their length.
struct RequestLimits {
    std::size_t max_body_bytes = std::size_t{8} << 20;
    std::size_t max_prompts = 64;
    std::size_t max_stops = 4;  // OpenAI's limit
    std::size_t max_stop_bytes = 256;
    int max_logprobs = 20;
};

// One sequence the engine generates: the prompt's tokens and how to continue it.
struct Generation {
    std::vector<std::int32_t> prompt;
    std::string prompt_text;  // what echo shows (the prompt's tokens decoded for an id prompt)
    int max_tokens = 16;
    SamplingParams sampling{};
    std::uint64_t seed = 0;
    std::vector<std::string> stops;
    std::optional<int> logprobs;  // the top alternatives per token (0: the chosen token's only)
    bool echo = false;
};

struct CompletionRequest {
    std::vector<Generation> generations;  // one per prompt
    bool stream = false;
    bool include_usage = false;  // stream_options.include_usage
    bool chat = false;
};

// The model's limits the requests are checked against.
struct ModelLimits {
    int context = 0;      // positions (maxT, or --ctx)
    int vocab_size = 0;   // ids a prompt may hold
    int vocab_limit = 0;  // ids the tokenizer can print (sampling stays below)
};

// /v1/completions: `prompt` a string, an array of token ids, or an array of either; max_tokens,
// temperature, top_p, top_k, seed, stop (string or array), echo, logprobs, stream,
// stream_options, n and best_of (1 only), model and user (accepted, not used). Any other field is
// refused by name, as are presence/frequency penalties and logit_bias other than their neutral
// values. `default_seed` seeds a request without one.
[[nodiscard]] CompletionRequest parse_completion_request(std::string_view body,
                                                         const Tokenizer& tokenizer,
                                                         const ModelLimits& model,
                                                         const RequestLimits& limits,
                                                         std::uint64_t default_seed);

// /v1/chat/completions: `messages` ({role, content} with role system, user or assistant) laid out
// with the chat template prepare_data trains chat data with (data/chat_template.hpp), after an
// end-of-text token; generation stops at the end of the assistant's turn. max_tokens (or
// max_completion_tokens), temperature, top_p, top_k, seed, stop, stream, stream_options, n (1).
[[nodiscard]] CompletionRequest parse_chat_request(std::string_view body,
                                                   const Tokenizer& tokenizer,
                                                   const ModelLimits& model,
                                                   const RequestLimits& limits,
                                                   std::uint64_t default_seed);

}  // namespace gpt2::serve
