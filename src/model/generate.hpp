// Reference text generation that recomputes the whole context for every token with the training
// forward pass: simple and obviously right, used for samples during training and as the oracle for
// the KV-cache generator.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/model.hpp"
#include "model/sampling.hpp"

namespace gpt2 {

// Appends `count` tokens to `tokens` (the prompt, non-empty). The context is the last maxT tokens.
// on_token, when set, is called with each new token as it is chosen.
void generate_recompute(const Model& model, std::vector<std::int32_t>& tokens, int count,
                        const SamplingParams& params, Rng& rng,
                        const std::function<void(std::int32_t)>& on_token = {});

}  // namespace gpt2
