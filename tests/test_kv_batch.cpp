// KvCacheSession::step_together: sessions stepped in one pass give each the bits its own step()
// gives, in fp32, bf16 and int8, for GPT-2's block, the Llama family's (SwiGLU, grouped-query
// heads, an untied head) and the speedrun's (QK-norm, the embeddings' norm, ReLU^2), on 1-3
// threads, with prompts of different lengths and a session
// whose full cache slides; the sessions stepped together share one Generator (its prompt scratch
// used by each prefill and slide in turn), those stepped alone have each their own; ten of them,
// so that the products take a pass of eight vectors and one of two.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "model/decode_weights.hpp"
#include "model/kv_cache.hpp"
#include "random_model.hpp"

namespace gpt2 {
namespace {

std::vector<float> copy(std::span<const float> s) {
    return {s.begin(), s.end()};
}

// The small test model's shape with the block `variant` names: GPT-2's, "llama" or "speedrun".
ModelConfig config_of(const std::string& variant) {
    ModelConfig c = test::small_config(24);
    if (variant == "gpt2") return c;
    c.arch.norm = NormKind::RmsNorm;
    c.arch.positions = PositionKind::Rotary;
    c.arch.biases = false;
    c.arch.tied_head = false;
    c.arch.kv_heads = 2;
    if (variant == "llama") {
        c.arch.mlp = MlpKind::SwiGlu;
        c.arch.mlp_hidden = 96;
    } else {
        c.arch.mlp = MlpKind::ReluSquared;
        c.arch.norm_gains = false;
        c.arch.qk_norm = true;
        c.arch.embedding_norm = true;
    }
    return c;
}

class KvBatch : public ::testing::TestWithParam<std::string> {};

TEST_P(KvBatch, SessionsSteppedTogetherGiveTheirOwnStepsBits) {
    const ModelConfig c = config_of(GetParam());
    const auto model = test::random_model(c, 9, 1.0f);
    for (const WeightFormat format : {WeightFormat::Fp32, WeightFormat::Bf16, WeightFormat::Int8}) {
        std::unique_ptr<DecodeWeights> compact;
        if (format != WeightFormat::Fp32) compact = std::make_unique<DecodeWeights>(*model, format);
        for (const int threads : {1, 2, 3}) {
            ThreadPool pool(threads);
            const std::vector<std::vector<std::int32_t>> prompts = {
                {1, 2, 3},
                {7},
                {4, 5, 6, 7, 8, 9, 10, 11},
                {9, 9},
                {12, 1, 40},
                {60, 61, 62},
                {3, 2, 1},
                {80},
                {5, 6},
                std::vector<std::int32_t>(22, 3)};
            Generator shared(*model, pool, compact.get());
            std::vector<std::unique_ptr<KvCacheSession>> alone, together;
            for (const auto& prompt : prompts) {
                alone.push_back(std::make_unique<KvCacheSession>(*model, pool, 0, compact.get()));
                together.push_back(std::make_unique<KvCacheSession>(shared));
                (void)alone.back()->prefill(prompt);
                (void)together.back()->prefill(prompt);
            }
            std::vector<KvCacheSession*> pointers;
            for (auto& s : together)
                pointers.push_back(s.get());
            // Five rounds: the last session fills its cache of 24 and slides on the third. (A maxT
            // of 24 also checks the pieces buffers: its chunk of 24 rows pads to 32 for the
            // products.)
            for (int round = 0; round < 5; ++round) {
                std::vector<std::int32_t> tokens;
                for (std::size_t i = 0; i < prompts.size(); ++i)
                    tokens.push_back(static_cast<std::int32_t>((round * 7 + i * 13) % 101));
                std::vector<std::vector<float>> expected;
                for (std::size_t i = 0; i < prompts.size(); ++i)
                    expected.push_back(copy(alone[i]->step(tokens[i])));
                KvCacheSession::step_together(pointers, tokens);
                for (std::size_t i = 0; i < prompts.size(); ++i) {
                    EXPECT_EQ(copy(together[i]->logits()), expected[i])
                        << weight_format_name(format) << " threads " << threads << " round "
                        << round << " session " << i;
                    EXPECT_EQ(together[i]->length(), alone[i]->length());
                }
            }
            EXPECT_GT(together.back()->slides(), 0);
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Blocks, KvBatch, ::testing::Values("gpt2", "llama", "speedrun"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gpt2
