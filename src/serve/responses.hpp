// The OpenAI-compatible API's responses: completion and chat objects, their streamed chunks
// (server-sent events) and the error object, as JSON text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "serve/engine.hpp"

namespace gpt2::serve {

// What every response of one request shares.
struct ResponseHead {
    std::string id;  // "cmpl-7", "chatcmpl-7"
    std::int64_t created = 0;
    std::string model;  // the name /v1/models lists
    bool chat = false;
};

// One choice's accumulated result.
struct ChoiceResult {
    std::string text;
    std::vector<TokenInfo> tokens;  // with logprobs requested
    std::string finish_reason;
    int prompt_tokens = 0;
    int completion_tokens = 0;
};

// The whole response to a request that did not stream; `logprobs` adds the legacy logprobs
// object (tokens, token_logprobs, top_logprobs, text_offset: bytes from the start).
[[nodiscard]] std::string completion_response(const ResponseHead& head,
                                              const std::vector<ChoiceResult>& choices,
                                              bool logprobs);

// One server-sent event ("data: {...}\n\n") with the new text (and tokens) of choice 0; a chat's
// first chunk carries the role. `finish_reason` empty: not finished.
[[nodiscard]] std::string stream_chunk(const ResponseHead& head, const std::string& text,
                                       const std::vector<TokenInfo>& tokens, bool logprobs,
                                       std::size_t text_offset, const std::string& finish_reason,
                                       bool first);
// The usage chunk (stream_options.include_usage) and the end of the stream.
[[nodiscard]] std::string stream_usage(const ResponseHead& head, int prompt_tokens,
                                       int completion_tokens);
inline constexpr const char* kStreamDone = "data: [DONE]\n\n";

// OpenAI's error object: {"error": {"message", "type", "param", "code"}}.
[[nodiscard]] std::string error_body(const std::string& message, const std::string& type,
                                     const std::string& param, const std::string& code = "");

}  // namespace gpt2::serve
