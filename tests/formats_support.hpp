// What the model-file tests share (test_formats, test_gguf, test_convert_model): GPT-2's tokenizer
// files, llama.cpp's package, a small random model, bitwise comparison and our logits.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <filesystem>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/forward_backward.hpp"
#include "model/generate.hpp"
#include "ops/gemm.hpp"
#include "process_support.hpp"

namespace gpt2::formats_test {

namespace fs = std::filesystem;
using nlohmann::json;
using test::run_command;
using test::ScratchDir;

inline const fs::path kGpt2Dir = fs::path(GPT2_SHARED_DATA_DIR) / "gpt2";
inline const fs::path kLlamaModules =
    fs::path(GPT2_SOURCE_DIR) / ".deps" / "llama-cpp" / "node_modules";

inline Model small_model(int vocab, std::uint64_t seed, int channels = 64) {
    Model model(ModelConfig{64, vocab, pad_vocab(vocab), 2, 4, channels});
    init_parameters(model, seed);
    return model;
}

inline bool has_gpt2_files() {
    return fs::exists(kGpt2Dir / "encoder.json");
}

inline void expect_bitwise(std::span<const float> a, std::span<const float> b) {
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(std::bit_cast<std::uint32_t>(a[i]), std::bit_cast<std::uint32_t>(b[i]))
            << "element " << i;
    }
}

// Logits (T, V) of every position of `tokens` by our forward pass.
inline std::vector<float> our_logits(const Model& model, const std::vector<std::int32_t>& tokens) {
    const ModelConfig& c = model.config;
    const int T = static_cast<int>(tokens.size());
    ThreadLocalTrainingContext ctx(c, 1, T, Precision::Fp32, Recompute::Layers);
    forward_hidden(model, ctx, TokenBatch{tokens, tokens, 1, T});
    std::vector<float> padded(static_cast<std::size_t>(T) * c.padded_vocab_size);
    gemm_nt(T, c.padded_vocab_size, c.channels, 1.0f, ctx.acts.lnf, c.channels,
            model.layout.tensor(model.weights(), ParamTensor::wte).data(), c.channels, 0.0f,
            padded.data(), c.padded_vocab_size);
    std::vector<float> logits;
    for (int t = 0; t < T; ++t) {
        const auto row = padded.begin() + static_cast<long>(t) * c.padded_vocab_size;
        logits.insert(logits.end(), row, row + c.vocab_size);
    }
    return logits;
}

}  // namespace gpt2::formats_test
