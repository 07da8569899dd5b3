// Dropout (ops/dropout, and the model's four sites): the counter's statistics, the masks and the
// gradient against PyTorch applying the same masks (tests/data/gpt2_dropout_reference.bin, from
// dev/make_reference.py), at every recompute level, and the same gradient however a batch is
// split into sequences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "model/forward_backward.hpp"
#include "model/model.hpp"
#include "ops/attention.hpp"
#include "ops/dropout.hpp"
#include "reference_fixture.hpp"
#include "test_support.hpp"

namespace gpt2 {
namespace {

using test::all_close;
using test::ReferenceFixture;

std::vector<bool> draw(const DropoutMask& mask, int b, std::uint64_t count) {
    const std::uint64_t key = mask.sequence_key(b);
    std::vector<bool> kept(count);
    for (std::uint64_t e = 0; e < count; ++e)
        kept[e] = dropout_keeps(key, static_cast<std::uint32_t>(e), mask.threshold());
    return kept;
}

// |observed - expected| within `sigmas` standard deviations of a binomial count.
void expect_binomial(std::uint64_t observed, std::uint64_t n, double p, const std::string& what) {
    const double mean = static_cast<double>(n) * p;
    const double sd = std::sqrt(static_cast<double>(n) * p * (1.0 - p));
    EXPECT_LE(std::abs(static_cast<double>(observed) - mean), 5.0 * sd)
        << what << ": " << observed << " of " << n << ", expected " << mean << " +- " << sd;
}

TEST(DropoutCounter, TheKeptFractionIsWithinBinomialBounds) {
    constexpr std::uint64_t kCount = 1 << 20;
    for (const float rate : {0.05f, 0.1f, 0.25f, 0.5f, 0.9f}) {
        const DropoutMask mask{rate, dropout_site_key(1337, 3, 1, DropoutSite::MlpOutput), 0};
        for (int b = 0; b < 3; ++b) {
            const std::vector<bool> kept = draw(mask, b, kCount);
            const auto n = static_cast<std::uint64_t>(std::count(kept.begin(), kept.end(), true));
            expect_binomial(n, kCount, 1.0 - rate, "rate " + std::to_string(rate));
        }
    }
}

// Two masks that should be independent agree on an element with probability p^2 + (1-p)^2;
// neighbours within a mask, other sites, layers, sequences, steps and seeds are such pairs.
TEST(DropoutCounter, SitesLayersSequencesStepsAndSeedsAreUncorrelated) {
    constexpr std::uint64_t kCount = 1 << 18;
    const float rate = 0.3f;
    const double p = 1.0 - rate;
    const double agree = p * p + (1 - p) * (1 - p);
    const auto mask = [&](std::uint64_t seed, std::uint64_t step, int layer, DropoutSite site) {
        return DropoutMask{rate, dropout_site_key(seed, step, layer, site), 0};
    };
    const DropoutMask base = mask(5, 10, 2, DropoutSite::AttentionOutput);
    const std::vector<bool> a = draw(base, 0, kCount);
    const auto agreements = [&](const std::vector<bool>& b) {
        std::uint64_t same = 0;
        for (std::uint64_t e = 0; e < kCount; ++e)
            same += a[e] == b[e];
        return same;
    };
    std::vector<bool> shifted(a.begin() + 1, a.end());
    shifted.push_back(a.front());
    expect_binomial(agreements(shifted), kCount, agree, "neighbouring elements");
    expect_binomial(agreements(draw(base, 1, kCount)), kCount, agree, "next sequence");
    expect_binomial(agreements(draw(mask(5, 10, 2, DropoutSite::MlpOutput), 0, kCount)), kCount,
                    agree, "other site");
    expect_binomial(agreements(draw(mask(5, 10, 3, DropoutSite::AttentionOutput), 0, kCount)),
                    kCount, agree, "next layer");
    expect_binomial(agreements(draw(mask(5, 11, 2, DropoutSite::AttentionOutput), 0, kCount)),
                    kCount, agree, "next step");
    expect_binomial(agreements(draw(mask(6, 10, 2, DropoutSite::AttentionOutput), 0, kCount)),
                    kCount, agree, "other seed");
    // The sequence index is the step's, not the batch's: sequence 1 of a batch starting at 4 is
    // sequence 5 of a batch starting at 0.
    const DropoutMask later{rate, base.site_key, 4};
    EXPECT_EQ(draw(later, 1, 4096), draw(base, 5, 4096));
}

// LoRA's input dropout has a site per layer and projection, keyed apart from the model's four
// sites of every layer and from each other (a shared key would drop the same elements twice).
TEST(DropoutCounter, LoraInputSitesAreKeyedApartFromEveryOtherSite) {
    std::set<std::uint64_t> keys;
    const int layers = 48;
    for (int l = 0; l < layers; ++l) {
        for (const DropoutSite site : {DropoutSite::Embeddings, DropoutSite::AttentionProbabilities,
                                       DropoutSite::AttentionOutput, DropoutSite::MlpOutput}) {
            keys.insert(dropout_site_key(5, 10, l, site));
        }
        for (int projection = 0; projection < 4; ++projection)
            keys.insert(lora_input_site_key(5, 10, l, projection));
    }
    EXPECT_EQ(keys.size(), static_cast<std::size_t>(layers * 8));
    // And they are of the step and the seed like the others.
    EXPECT_NE(lora_input_site_key(5, 10, 0, 0), lora_input_site_key(5, 11, 0, 0));
    EXPECT_NE(lora_input_site_key(5, 10, 0, 0), lora_input_site_key(6, 10, 0, 0));
}

TEST(DropoutCounter, KeptValuesAreScaledAndDroppedOnesZero) {
    const DropoutMask mask{0.25f, dropout_site_key(1, 2, 0, DropoutSite::Embeddings), 0};
    std::vector<float> x(2 * 1000);
    for (std::size_t i = 0; i < x.size(); ++i)
        x[i] = 0.5f + static_cast<float>(i);
    std::vector<float> y = x;
    apply_dropout(y.data(), 2, 1000, mask);
    for (int b = 0; b < 2; ++b) {
        const std::vector<bool> kept = draw(mask, b, 1000);
        for (int e = 0; e < 1000; ++e) {
            const std::size_t i = static_cast<std::size_t>(b) * 1000 + e;
            EXPECT_EQ(y[i], kept[e] ? x[i] * (1.0f / 0.75f) : 0.0f) << b << " " << e;
        }
    }
}

// Attention with dropped probabilities, written out in double from the definition (the row term
// of the softmax backward as sum_k P dP, not the kernel's dO.O), for sequences longer than one
// panel of query rows, so that backward's accumulation over panels is checked too. With
// `first_keys` (document masking), row i of sequence b sees keys [first_keys[b * T + i], i].
struct NaiveAttention {
    std::vector<double> out, dqkv;
};

NaiveAttention naive_attention(const std::vector<float>& qkv, const std::vector<float>& dout, int B,
                               int T, int C, int NH, const DropoutMask& mask,
                               std::span<const std::int32_t> first_keys = {}) {
    const int hs = C / NH, C3 = 3 * C;
    const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
    NaiveAttention r{std::vector<double>(dout.size()), std::vector<double>(qkv.size())};
    const auto at = [&](int b, int t, int part, int h, int e) {
        return static_cast<std::size_t>((static_cast<long>(b) * T + t) * C3 + part * C + h * hs +
                                        e);
    };
    for (int b = 0; b < B; ++b) {
        for (int h = 0; h < NH; ++h) {
            for (int i = 0; i < T; ++i) {
                std::vector<double> p(static_cast<std::size_t>(i) + 1), m(p.size()), dp(p.size());
                const int f =
                    first_keys.empty() ? 0 : first_keys[static_cast<std::size_t>(b) * T + i];
                double maxs = -1e300, sum = 0.0;
                for (int j = f; j <= i; ++j) {
                    double dot = 0.0;
                    for (int e = 0; e < hs; ++e)
                        dot += static_cast<double>(qkv[at(b, i, 0, h, e)]) * qkv[at(b, j, 1, h, e)];
                    p[j] = dot * scale;
                    maxs = std::max(maxs, p[j]);
                }
                for (int j = f; j <= i; ++j)
                    sum += (p[j] = std::exp(p[j] - maxs));
                const std::uint64_t key = mask.sequence_key(b);
                for (int j = f; j <= i; ++j) {
                    p[j] /= sum;
                    const auto e =
                        static_cast<std::uint32_t>((static_cast<long>(h) * T + i) * T + j);
                    m[j] = dropout_keeps(key, e, mask.threshold()) ? mask.scale() : 0.0;
                }
                const std::size_t o = (static_cast<std::size_t>(b) * T + i) * C + h * hs;
                double row_term = 0.0;
                for (int j = f; j <= i; ++j) {
                    double dd = 0.0;
                    for (int e = 0; e < hs; ++e) {
                        r.out[o + e] += m[j] * p[j] * qkv[at(b, j, 2, h, e)];
                        dd += static_cast<double>(dout[o + e]) * qkv[at(b, j, 2, h, e)];
                        r.dqkv[at(b, j, 2, h, e)] += m[j] * p[j] * dout[o + e];
                    }
                    dp[j] = m[j] * dd;
                    row_term += p[j] * dp[j];
                }
                for (int j = f; j <= i; ++j) {
                    const double ds = p[j] * (dp[j] - row_term) * scale;
                    for (int e = 0; e < hs; ++e) {
                        r.dqkv[at(b, i, 0, h, e)] += ds * qkv[at(b, j, 1, h, e)];
                        r.dqkv[at(b, j, 1, h, e)] += ds * qkv[at(b, i, 0, h, e)];
                    }
                }
            }
        }
    }
    return r;
}

// q, k, v (B, T, 3C) and the output gradient (B, T, C), uniform in [-1, 1) from `seed`.
std::pair<std::vector<float>, std::vector<float>> uniform_attention_inputs(int B, int T, int C,
                                                                           std::uint64_t seed) {
    std::vector<float> qkv(static_cast<std::size_t>(B) * T * 3 * C);
    std::vector<float> dout(static_cast<std::size_t>(B) * T * C);
    std::uint64_t state = seed;
    const auto uniform = [&] {
        state = mix64(state + 1);
        return static_cast<float>(static_cast<double>(state >> 11) * 0x1.0p-53 * 2.0 - 1.0);
    };
    for (float& x : qkv)
        x = uniform();
    for (float& x : dout)
        x = uniform();
    return {std::move(qkv), std::move(dout)};
}

TEST(DropoutAttention, FlashKernelsMatchTheDefinitionOverSeveralPanels) {
    const int B = 2, T = 2 * kAttentionQueryRows + 21, C = 32, NH = 2;
    const auto [qkv, dout] = uniform_attention_inputs(B, T, C, 12345);
    const DropoutMask mask{0.3f, dropout_site_key(9, 4, 1, DropoutSite::AttentionProbabilities), 7};
    std::vector<float> out(dout.size()), lse(static_cast<std::size_t>(B) * NH * T);
    std::vector<float> scratch(attention_scratch_floats(T)), dqkv(qkv.size());
    attention_forward(out.data(), lse.data(), scratch.data(), qkv.data(), B, T, C, NH, mask);
    attention_backward(dqkv.data(), scratch.data(), dout.data(), out.data(), lse.data(), qkv.data(),
                       B, T, C, NH, mask);
    const NaiveAttention expected = naive_attention(qkv, dout, B, T, C, NH, mask);
    const std::vector<float> out_ref(expected.out.begin(), expected.out.end());
    const std::vector<float> dqkv_ref(expected.dqkv.begin(), expected.dqkv.end());
    EXPECT_TRUE(all_close(out, out_ref, 1e-4, 1e-5));
    EXPECT_TRUE(all_close(dqkv, dqkv_ref, 1e-4, 1e-5));
    // Without the mask the same kernels give something else.
    attention_forward(out.data(), lse.data(), scratch.data(), qkv.data(), B, T, C, NH);
    EXPECT_FALSE(all_close(out, out_ref, 1e-2, 1e-3));
}

// Dropout with document masking: the dropped elements are still (h * T + i) * T + j of the
// window (j the key's place in the window, not in its document), in forward and backward, also
// where a panel skips the keys left of its rows' documents.
TEST(DropoutAttention, WithDocumentMaskingFlashKernelsMatchTheDefinition) {
    const int B = 2, T = 2 * kAttentionQueryRows + 21, C = 32, NH = 2;
    const auto [qkv, dout] = uniform_attention_inputs(B, T, C, 777);
    // Sequence 0: documents at 0, 20, 70 and 100 (the last two panels skip keys); sequence 1: one.
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(B) * T, 1), first_keys(tokens.size());
    for (const int start : {20, 70, 100})
        tokens[static_cast<std::size_t>(start)] = 0;
    document_first_keys(first_keys, tokens, B, T, 0);
    const DropoutMask mask{0.3f, dropout_site_key(9, 4, 1, DropoutSite::AttentionProbabilities), 7};
    std::vector<float> out(dout.size()), lse(static_cast<std::size_t>(B) * NH * T);
    std::vector<float> scratch(attention_scratch_floats(T)), dqkv(qkv.size(), 777.0f);
    attention_forward(out.data(), lse.data(), scratch.data(), qkv.data(), B, T, C, NH, mask,
                      first_keys);
    attention_backward(dqkv.data(), scratch.data(), dout.data(), out.data(), lse.data(), qkv.data(),
                       B, T, C, NH, mask, first_keys);
    const NaiveAttention expected = naive_attention(qkv, dout, B, T, C, NH, mask, first_keys);
    const std::vector<float> out_ref(expected.out.begin(), expected.out.end());
    const std::vector<float> dqkv_ref(expected.dqkv.begin(), expected.dqkv.end());
    EXPECT_TRUE(all_close(out, out_ref, 1e-4, 1e-5));
    EXPECT_TRUE(all_close(dqkv, dqkv_ref, 1e-4, 1e-5));
}

// The fixture's model, batch and dropout key.
class DropoutReference : public ::testing::TestWithParam<Recompute> {
  protected:
    void SetUp() override {
        fixture_ =
            ReferenceFixture::load(std::string(GPT2_TEST_DATA_DIR) + "/gpt2_dropout_reference.bin");
        const auto& cfg = fixture_.at("config").i32;
        config_ = test::fixture_config(fixture_);
        B_ = cfg[6];
        T_ = cfg[7];
        const auto& key = fixture_.at("dropout.key").i32;
        dropout_ = Dropout{fixture_.at("dropout.rate").f32[0], static_cast<std::uint64_t>(key[0]),
                           static_cast<std::uint64_t>(key[1])};
        first_sequence_ = static_cast<std::uint64_t>(key[2]);
    }
    [[nodiscard]] Model make_model() const { return test::fixture_model(fixture_); }
    // Sequences [b0, b0 + count) of the fixture's batch, with their place in the step.
    [[nodiscard]] TokenBatch batch(int b0, int count) const {
        const auto at = static_cast<std::size_t>(b0) * T_;
        const auto n = static_cast<std::size_t>(count) * T_;
        TokenBatch batch{std::span(fixture_.at("inputs").i32).subspan(at, n),
                         std::span(fixture_.at("targets").i32).subspan(at, n), count, T_};
        batch.dropout = dropout_;
        batch.first_sequence = first_sequence_ + static_cast<std::uint64_t>(b0);
        return batch;
    }
    // Our mask of one site as the fixture stores it: (layers, B, count) of 0/1.
    [[nodiscard]] std::vector<float> our_mask(DropoutSite site, int layers, int count) const {
        std::vector<float> mask;
        for (int l = 0; l < layers; ++l) {
            const DropoutMask m{dropout_.rate,
                                dropout_site_key(dropout_.seed, dropout_.step, l, site),
                                first_sequence_};
            for (int b = 0; b < B_; ++b) {
                for (const bool kept : draw(m, b, static_cast<std::uint64_t>(count)))
                    mask.push_back(kept ? 1.0f : 0.0f);
            }
        }
        return mask;
    }

    ReferenceFixture fixture_;
    ModelConfig config_;
    Dropout dropout_;
    std::uint64_t first_sequence_ = 0;
    int B_ = 0;
    int T_ = 0;
};

TEST_F(DropoutReference, OurMasksAreTheFixturesTranscription) {
    const int L = config_.num_layers, C = config_.channels, NH = config_.num_heads;
    EXPECT_EQ(our_mask(DropoutSite::Embeddings, 1, T_ * C), fixture_.at("mask.embeddings").f32);
    EXPECT_EQ(our_mask(DropoutSite::AttentionProbabilities, L, NH * T_ * T_),
              fixture_.at("mask.attention").f32);
    EXPECT_EQ(our_mask(DropoutSite::AttentionOutput, L, T_ * C),
              fixture_.at("mask.attention_output").f32);
    EXPECT_EQ(our_mask(DropoutSite::MlpOutput, L, T_ * C), fixture_.at("mask.mlp_output").f32);
}

TEST_P(DropoutReference, LossAndGradientMatchPyTorchWithTheSameMasks) {
    const Model model = make_model();
    ThreadLocalTrainingContext ctx(config_, B_, T_, Precision::Fp32, GetParam());
    const int N = B_ * T_;
    std::vector<float> gradient(model.layout.total());
    const double loss_sum =
        forward_backward(model, ctx, batch(0, B_), 1.0f / static_cast<float>(N), gradient);
    EXPECT_NEAR(loss_sum / N, fixture_.at("loss").f32[0], 1e-5);
    EXPECT_TRUE(all_close(gradient, fixture_.at("grads").f32, 1e-4, 1e-5));
    // Dropout matters here: the gradient without it is far from PyTorch's with it.
    std::vector<float> undropped(model.layout.total());
    TokenBatch plain = batch(0, B_);
    plain.dropout = Dropout{};
    (void)forward_backward(model, ctx, plain, 1.0f / static_cast<float>(N), undropped);
    EXPECT_FALSE(all_close(undropped, fixture_.at("grads").f32, 1e-2, 1e-4));
    // Evaluation's forward draws no masks.
    EXPECT_EQ(forward_loss(model, ctx, batch(0, B_)), forward_loss(model, ctx, plain));
}

INSTANTIATE_TEST_SUITE_P(Recompute, DropoutReference,
                         ::testing::Values(Recompute::Cheap, Recompute::Layers),
                         [](const auto& info) {
                             return info.param == Recompute::Cheap ? "cheap" : "layers";
                         });

// bf16 products with dropout: PyTorch's fp32 gradient with the same masks, within the bf16
// tolerance of test_model_reference (2e-2 relative in norm, per tensor).
TEST_F(DropoutReference, Bf16GradientFollowsPyTorchWithTheSameMasks) {
    Model model = make_model();
    set_precision(model, Precision::Bf16);
    ThreadLocalTrainingContext ctx(config_, B_, T_, Precision::Bf16);
    const int N = B_ * T_;
    std::vector<float> gradient(model.layout.total());
    const double loss =
        forward_backward(model, ctx, batch(0, B_), 1.0f / static_cast<float>(N), gradient) / N;
    const double expected_loss = fixture_.at("loss").f32[0];
    EXPECT_NEAR(loss, expected_loss, 1e-2 * expected_loss);
    EXPECT_TRUE(test::tensors_close(model.layout, gradient, fixture_.at("grads").f32, 2e-2));
}

// A batch split into single sequences (as workers and ranks split a step) draws the same masks:
// the summed gradient is the whole batch's up to the summation order.
TEST_F(DropoutReference, SequenceBySequenceGivesTheWholeBatchsGradient) {
    const Model model = make_model();
    const int N = B_ * T_;
    ThreadLocalTrainingContext whole_ctx(config_, B_, T_);
    std::vector<float> whole(model.layout.total());
    const double whole_loss =
        forward_backward(model, whole_ctx, batch(0, B_), 1.0f / static_cast<float>(N), whole);
    ThreadLocalTrainingContext one_ctx(config_, 1, T_);
    std::vector<float> summed(model.layout.total());
    double summed_loss = 0.0;
    for (int b = 0; b < B_; ++b)
        summed_loss +=
            forward_backward(model, one_ctx, batch(b, 1), 1.0f / static_cast<float>(N), summed);
    EXPECT_NEAR(summed_loss, whole_loss, 1e-6 * whole_loss);
    EXPECT_TRUE(all_close(summed, whole, 1e-5, 1e-7));
    // Keyed by the step's sequence index: the same sequence placed elsewhere draws other masks.
    std::vector<float> moved(model.layout.total());
    TokenBatch elsewhere = batch(0, 1);
    elsewhere.first_sequence += 100;
    (void)forward_backward(model, one_ctx, elsewhere, 1.0f, moved);
    std::vector<float> first(model.layout.total());
    (void)forward_backward(model, one_ctx, batch(0, 1), 1.0f, first);
    EXPECT_NE(moved, first);
}

}  // namespace
}  // namespace gpt2
