// Choosing the next token from logits: greedy (temperature 0), temperature, top-k and top-p.
#pragma once

#include <span>
#include <vector>

#include "core/random.hpp"

namespace gpt2 {

struct SamplingParams {
    float temperature = 1.0f;  // 0: greedy
    int top_k = 0;             // 0: all tokens
    float top_p = 1.0f;        // 1: no nucleus cut
};

// Picks a token among logits[0, V). `scratch` is reused between calls to avoid allocation.
[[nodiscard]] int sample_token(std::span<const float> logits, const SamplingParams& params,
                               Rng& rng, std::vector<std::pair<float, int>>& scratch);

}  // namespace gpt2
