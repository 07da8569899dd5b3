// The small random GPT-2 the generator and inference tests decode with.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/random.hpp"
#include "model/forward_backward.hpp"
#include "model/model.hpp"
#include "model/training_context.hpp"
#include "ops/gemm.hpp"

namespace gpt2::test {

inline ModelConfig small_config(int max_seq_len = 32) {
    ModelConfig c;
    c.max_seq_len = max_seq_len;
    c.vocab_size = 101;
    c.padded_vocab_size = pad_vocab(101);
    c.num_layers = 2;
    c.num_heads = 4;
    c.channels = 64;
    return c;
}

// A random model filled here rather than by init_parameters, so that the tests do not depend on
// its details: GPT-2-like embeddings, block matrices `scale` times larger than GPT-2's 0.02 (at
// 0.02 a random model's attention is nearly uniform and its logits nearly flat, which would hide
// masking or caching mistakes), and non-trivial biases and LayerNorm gains.
inline std::unique_ptr<Model> random_model(const ModelConfig& c, std::uint64_t seed,
                                           float scale = 6.0f) {
    auto model = std::make_unique<Model>(c);
    Rng rng(seed);
    for (int i = 0; i < kNumParamTensors; ++i) {
        const auto t = static_cast<ParamTensor>(i);
        const bool gain =
            t == ParamTensor::ln1w || t == ParamTensor::ln2w || t == ParamTensor::lnfw;
        const bool block_matrix = t == ParamTensor::qkvw || t == ParamTensor::attprojw ||
                                  t == ParamTensor::fcw || t == ParamTensor::fcprojw;
        const float std = block_matrix ? 0.02f * scale : 0.02f;
        for (float& v : model->layout.tensor(model->params.span(), t))
            v = (gain ? 1.0f : 0.0f) + std * rng.normal();
    }
    return model;
}

// The training forward pass's logits (T x Vp) for one sequence: what decoding and the file readers
// are checked against.
inline std::vector<float> training_logits(const Model& model,
                                          std::span<const std::int32_t> tokens) {
    const ModelConfig& c = model.config;
    const int T = static_cast<int>(tokens.size());
    ThreadLocalTrainingContext ctx(c, 1, T);
    forward_hidden(model, ctx, TokenBatch{tokens, tokens, 1, T});
    std::vector<float> logits(static_cast<std::size_t>(T) * c.padded_vocab_size);
    gemm_nt(T, c.padded_vocab_size, c.channels, 1.0f, ctx.acts.lnf, c.channels,
            model.layout.tensor(model.weights(), head_tensor(model.layout)).data(), c.channels,
            0.0f, logits.data(), c.padded_vocab_size);
    return logits;
}

}  // namespace gpt2::test
