// Choosing the next token from logits: greedy (temperature 0), temperature, top-k and top-p.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/random.hpp"

namespace gpt2 {

struct SamplingParams {
    float temperature = 1.0f;  // 0: greedy
    int top_k = 0;             // 0: all tokens
    float top_p = 1.0f;        // 1: no nucleus cut
    // > 1 makes the tokens already in the context less likely (1: off), as Hugging Face's
    // repetition_penalty (CTRL's): apply_repetition_penalty.
    float repetition_penalty = 1.0f;
};

// Hugging Face's repetition penalty, before sampling: the logit of every token that occurs in
// `context` is divided by `penalty` where positive and multiplied by it where negative, once per
// token however often it occurs. Ids outside `logits` are ignored.
void apply_repetition_penalty(std::span<float> logits, std::span<const std::int32_t> context,
                              float penalty);

// Picks a token among logits[0, V). `scratch` is reused between calls to avoid allocation.
[[nodiscard]] int sample_token(std::span<const float> logits, const SamplingParams& params,
                               Rng& rng, std::vector<std::pair<float, int>>& scratch);

}  // namespace gpt2
