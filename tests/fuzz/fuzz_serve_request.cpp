// Fuzzes the server's request parser: the input is the body of a /v1/completions and of a
// /v1/chat/completions request, checked against a GPT-2-sized model's limits with a char
// tokenizer. Every body is accepted within the limits or refused with a RequestError naming a
// field; nothing else may escape.
#include <cstdint>
#include <string_view>

#include "fuzz_support.hpp"
#include "serve/requests.hpp"
#include "tokenizer/tokenizer.hpp"

namespace {

const gpt2::Tokenizer& tokenizer() {
    static const auto t = gpt2::make_char_tokenizer("abcdefghijklmnopqrstuvwxyz :.\n");
    return *t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size > gpt2::fuzz::kMaxInputBytes) return -1;
    const std::string_view body(reinterpret_cast<const char*>(data), size);
    const gpt2::serve::ModelLimits model{64, 30, 30};
    const gpt2::serve::RequestLimits limits{};
    for (const bool chat : {false, true}) {
        try {
            const gpt2::serve::CompletionRequest request =
                chat ? gpt2::serve::parse_chat_request(body, tokenizer(), model, limits, 7)
                     : gpt2::serve::parse_completion_request(body, tokenizer(), model, limits, 7);
            FUZZ_CHECK(!request.generations.empty());
            FUZZ_CHECK(request.generations.size() <= limits.max_prompts);
            for (const gpt2::serve::Generation& g : request.generations) {
                FUZZ_CHECK(!g.prompt.empty() && g.prompt.size() <= 64);
                for (const std::int32_t id : g.prompt)
                    FUZZ_CHECK(id >= 0 && id < model.vocab_size);
                FUZZ_CHECK(g.max_tokens >= 0 && g.max_tokens <= model.context);
                FUZZ_CHECK(g.sampling.temperature >= 0.0f && g.sampling.top_p <= 1.0f);
                FUZZ_CHECK(!g.logprobs || (*g.logprobs >= 0 && *g.logprobs <= limits.max_logprobs));
            }
        } catch (const gpt2::serve::RequestError& error) {
            gpt2::fuzz::rejected(error);
        }
    }
    return 0;
}
