// LoRA against PyTorch (tests/data/gpt2_lora_reference.bin, dev/make_reference.py: PEFT's formula
// on the four projections of a frozen model): the loss, the final activations and the adapter's
// gradient; the frozen base untouched by backward; merging equal to W + (alpha/r) B A; PEFT's
// directory written and read back.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/random.hpp"
#include "formats/checkpoint.hpp"
#include "formats/peft.hpp"
#include "formats/safetensors.hpp"
#include "model/forward_backward.hpp"
#include "model/generate.hpp"
#include "model/lora.hpp"
#include "model/model.hpp"
#include "ops/dropout.hpp"
#include "reference_fixture.hpp"
#include "scratch_files.hpp"
#include "test_support.hpp"
#include "train/memory_plan.hpp"

namespace gpt2 {
namespace {

using test::all_close;
using test::norm_close;
using test::ReferenceFixture;

class Lora : public ::testing::Test {
  protected:
    void SetUp() override {
        fixture_ =
            ReferenceFixture::load(std::string(GPT2_TEST_DATA_DIR) + "/gpt2_lora_reference.bin");
        const auto& cfg = fixture_.at("config").i32;
        B_ = cfg[6];
        T_ = cfg[7];
        const auto& lora = fixture_.at("lora.config").f32;
        lora_config_.rank = static_cast<int>(lora[0]);
        lora_config_.alpha = lora[1];
        lora_config_.targets = all_lora_targets(test::fixture_model(fixture_).config);
    }
    // The fixture's base model with its adapter.
    [[nodiscard]] Model adapted_model() const {
        Model model = test::fixture_model(fixture_);
        model.lora = std::make_shared<LoraAdapter>(model.config, lora_config_);
        const auto& flat = fixture_.at("lora").f32;
        if (flat.size() != model.lora->params.size()) {
            throw std::runtime_error("lora fixture: the adapter does not fit its layout");
        }
        std::copy(flat.begin(), flat.end(), model.lora->params.data());
        return model;
    }
    [[nodiscard]] TokenBatch batch() const {
        return TokenBatch{fixture_.at("inputs").i32, fixture_.at("targets").i32, B_, T_};
    }
    [[nodiscard]] ThreadLocalTrainingContext context(const Model& model,
                                                     Recompute recompute = Recompute::Cheap) const {
        ThreadLocalTrainingContext ctx(model.config, B_, T_, Precision::Fp32, recompute);
        ctx.reserve_adapter(lora_config_.rank);
        return ctx;
    }

    ReferenceFixture fixture_;
    LoraConfig lora_config_;
    int B_ = 0;
    int T_ = 0;
};

TEST_F(Lora, LossActivationsAndAdapterGradientMatchPyTorch) {
    const Model model = adapted_model();
    ThreadLocalTrainingContext ctx = context(model);
    const int N = B_ * T_;
    std::vector<float> grads(model.lora->layout.total());
    const double loss_sum =
        forward_backward_adapter(model, ctx, batch(), 1.0f / static_cast<float>(N), grads);
    // The model reference's tolerances (test_model_reference.cpp).
    EXPECT_NEAR(loss_sum / N, fixture_.at("loss").f32[0], 1e-5);
    EXPECT_TRUE(all_close({ctx.acts.lnf, static_cast<std::size_t>(N) * model.config.channels},
                          fixture_.at("lnf").f32, 1e-4, 1e-5));
    // Each adapter matrix on its own, as the model reference checks each tensor.
    const std::vector<float>& expected = fixture_.at("lora.grads").f32;
    ASSERT_EQ(grads.size(), expected.size());
    for (int l = 0; l < model.config.num_layers; ++l) {
        for (int i = 0; i < kGpt2LoraTargets; ++i) {
            const auto t = static_cast<LoraTarget>(i);
            const LoraLayout& layout = model.lora->layout;
            for (const auto& [offset, count] :
                 {std::pair{layout.a_offset(l, t), layout.a_floats(t)},
                  std::pair{layout.b_offset(l, t), layout.b_floats(t)}}) {
                const std::span<const float> actual(grads.data() + offset, count);
                const std::span<const float> reference(expected.data() + offset, count);
                EXPECT_TRUE(all_close(actual, reference, 1e-3, 2e-6))
                    << "layer " << l << ' ' << lora_target_module(t)
                    << (offset == layout.a_offset(l, t) ? " A" : " B");
            }
        }
    }
}

TEST_F(Lora, RecomputingLayersGivesTheSameAdapterGradientBitwise) {
    const Model model = adapted_model();
    const float dloss = 1.0f / static_cast<float>(B_ * T_);
    std::vector<float> cheap(model.lora->layout.total()), layers(cheap.size());
    ThreadLocalTrainingContext ctx_cheap = context(model, Recompute::Cheap);
    ThreadLocalTrainingContext ctx_layers = context(model, Recompute::Layers);
    const double loss_cheap = forward_backward_adapter(model, ctx_cheap, batch(), dloss, cheap);
    const double loss_layers = forward_backward_adapter(model, ctx_layers, batch(), dloss, layers);
    EXPECT_EQ(loss_cheap, loss_layers);
    EXPECT_EQ(cheap, layers);
}

TEST_F(Lora, BackwardLeavesTheBaseWeightsAndNeedsNoBaseGradient) {
    const Model model = adapted_model();
    const std::vector<float> before(model.params.data(), model.params.data() + model.params.size());
    ThreadLocalTrainingContext ctx = context(model);
    std::vector<float> grads(model.lora->layout.total());
    (void)forward_backward_adapter(model, ctx, batch(), 1.0f, grads);
    EXPECT_TRUE(std::equal(before.begin(), before.end(), model.params.data()));
    // A full-model gradient sink is refused while an adapter is set (it would train both).
    std::vector<float> full(model.layout.total());
    EXPECT_THROW((void)forward_backward(model, ctx, batch(), 1.0f, full), std::invalid_argument);
}

TEST_F(Lora, MergedWeightsAreBasePlusScaledBTimesAAndGiveTheAdaptedLoss) {
    const Model adapted = adapted_model();
    Model merged = test::fixture_model(fixture_);
    merge_lora(merged, *adapted.lora);
    // W + (alpha/r) B A written out in double, element by element.
    const double scale = lora_config_.alpha / lora_config_.rank;
    const int r = lora_config_.rank;
    for (int i = 0; i < kGpt2LoraTargets; ++i) {
        const auto t = static_cast<LoraTarget>(i);
        const ProductShape s = lora_product_shape(adapted.config, t);
        for (int l = 0; l < adapted.config.num_layers; ++l) {
            const auto base = adapted.layout.layer(adapted.weights(), lora_target_weight(t), l);
            const auto got = merged.layout.layer(merged.weights(), lora_target_weight(t), l);
            const LoraLayerView<const float> view = adapted.lora->layer(l);
            const float* A = view.a[static_cast<std::size_t>(i)];
            const float* Bm = view.b[static_cast<std::size_t>(i)];
            std::vector<float> expected(base.size());
            for (int o = 0; o < s.out; ++o) {
                for (int c = 0; c < s.in; ++c) {
                    double delta = 0.0;
                    for (int k = 0; k < r; ++k)
                        delta += static_cast<double>(Bm[o * r + k]) * A[k * s.in + c];
                    expected[static_cast<std::size_t>(o) * s.in + c] = static_cast<float>(
                        base[static_cast<std::size_t>(o) * s.in + c] + scale * delta);
                }
            }
            EXPECT_TRUE(all_close(got, expected, 1e-6, 1e-7))
                << "layer " << l << ' ' << lora_target_module(t);
        }
    }
    // The merged model without an adapter computes the adapted model's loss.
    ThreadLocalTrainingContext ctx(merged.config, B_, T_);
    const double merged_loss = forward_loss(merged, ctx, batch()) / (B_ * T_);
    EXPECT_NEAR(merged_loss, fixture_.at("loss").f32[0], 1e-5);
}

// What a LoRA run's samples do: generation with the adapter set (its own context) continues as
// the merged model does.
TEST_F(Lora, GenerationWithTheAdapterMatchesTheMergedModel) {
    const Model adapted = adapted_model();
    Model merged = test::fixture_model(fixture_);
    merge_lora(merged, *adapted.lora);
    const SamplingParams greedy{0.0f, 0, 1.0f};
    std::vector<std::int32_t> with_adapter{1, 2, 3}, with_merged{1, 2, 3};
    Rng rng_a(5), rng_m(5);
    generate_recompute(adapted, with_adapter, 8, greedy, rng_a);
    generate_recompute(merged, with_merged, 8, greedy, rng_m);
    EXPECT_EQ(with_adapter, with_merged);
}

// ---- LoRA's input dropout (PEFT's lora_dropout) -------------------------------------------------

// The fixture's batch in a training step whose only dropout is LoRA's, at `rate`.
TokenBatch with_lora_dropout(TokenBatch batch, float rate) {
    batch.dropout = Dropout{0.0f, 19, 5, rate};
    return batch;
}

// One adapted product with input dropout against PEFT's formula in double on the input masked by
// hand (each element's keep drawn from its sequence's key, kept ones scaled by 1 / (1 - p)):
//   out += s (x' A^T) B^T,  dA += v^T x',  dB += s dout^T (x' A^T),  dinp += mask (v A) / (1 - p)
// with x' = dropout(x) and v = s dout B.
TEST(LoraInputDropout, ForwardAndBackwardAreThoseOfThePlainPathOnTheMaskedInput) {
    const int sequences = 3, T = 4, N = sequences * T, C = 8, OC = 6, r = 2;
    const float scale = 1.5f, rate = 0.3f;
    Rng rng(42);
    const auto random = [&](std::size_t n) {
        std::vector<float> v(n);
        for (float& x : v)
            x = 2.0f * rng.uniform() - 1.0f;
        return v;
    };
    const std::vector<float> inp = random(static_cast<std::size_t>(N) * C);
    const std::vector<float> A = random(static_cast<std::size_t>(r) * C);
    const std::vector<float> Bm = random(static_cast<std::size_t>(OC) * r);
    const std::vector<float> dout = random(static_cast<std::size_t>(N) * OC);
    const std::vector<float> out0 = random(static_cast<std::size_t>(N) * OC);
    const DropoutMask mask{rate, lora_input_site_key(7, 2, 1, 3), 5};

    // The mask by hand, and the reference in double.
    std::vector<double> factor(static_cast<std::size_t>(N) * C);
    int dropped = 0;
    for (int b = 0; b < sequences; ++b) {
        for (int e = 0; e < T * C; ++e) {
            const bool keep = dropout_keeps(mask.sequence_key(b), static_cast<std::uint32_t>(e),
                                            mask.threshold());
            factor[static_cast<std::size_t>(b * T * C + e)] = keep ? 1.0 / (1.0 - rate) : 0.0;
            dropped += keep ? 0 : 1;
        }
    }
    ASSERT_GT(dropped, 0);
    ASSERT_LT(dropped, N * C);
    std::vector<double> u(static_cast<std::size_t>(N) * r), v(u.size());
    std::vector<float> ref_out(out0.begin(), out0.end()), ref_dinp(inp.size());
    std::vector<float> ref_dA(A.size()), ref_dB(Bm.size());
    for (int n = 0; n < N; ++n) {
        for (int k = 0; k < r; ++k) {
            double x_a = 0.0, dout_b = 0.0;
            for (int c = 0; c < C; ++c)
                x_a += inp[n * C + c] * factor[n * C + c] * A[k * C + c];
            for (int o = 0; o < OC; ++o)
                dout_b += static_cast<double>(dout[n * OC + o]) * Bm[o * r + k];
            u[n * r + k] = x_a;
            v[n * r + k] = scale * dout_b;
        }
        for (int o = 0; o < OC; ++o) {
            double sum = 0.0;
            for (int k = 0; k < r; ++k)
                sum += u[n * r + k] * Bm[o * r + k];
            ref_out[n * OC + o] = static_cast<float>(out0[n * OC + o] + scale * sum);
        }
        for (int c = 0; c < C; ++c) {
            double sum = 0.0;
            for (int k = 0; k < r; ++k)
                sum += v[n * r + k] * A[k * C + c];
            ref_dinp[n * C + c] =
                static_cast<float>(1.0 + sum * factor[n * C + c]);  // dinp held 1s
        }
    }
    for (int k = 0; k < r; ++k) {
        for (int c = 0; c < C; ++c) {
            double sum = 0.0;
            for (int n = 0; n < N; ++n)
                sum += v[n * r + k] * inp[n * C + c] * factor[n * C + c];
            ref_dA[k * C + c] = static_cast<float>(sum);
        }
        for (int o = 0; o < OC; ++o) {
            double sum = 0.0;
            for (int n = 0; n < N; ++n)
                sum += static_cast<double>(dout[n * OC + o]) * u[n * r + k];
            ref_dB[o * r + k] = static_cast<float>(scale * sum);
        }
    }

    std::vector<float> dropped_scratch(inp.size()), su(static_cast<std::size_t>(N) * r),
        sv(su.size());
    const LoraInputDropout dropout{mask, sequences, dropped_scratch.data()};
    std::vector<float> out(out0.begin(), out0.end());
    lora_forward(out.data(), su.data(), inp.data(), A.data(), Bm.data(), scale, N, C, OC, r, OC,
                 dropout);
    EXPECT_TRUE(all_close(out, ref_out, 1e-5, 1e-6));
    std::vector<float> dinp(inp.size(), 1.0f), dA(A.size()), dB(Bm.size());
    lora_backward(dinp.data(), dA.data(), dB.data(), su.data(), sv.data(), dout.data(), inp.data(),
                  A.data(), Bm.data(), scale, N, C, OC, r, OC, dropout);
    EXPECT_TRUE(all_close(dinp, ref_dinp, 1e-5, 1e-6));
    EXPECT_TRUE(all_close(dA, ref_dA, 1e-5, 1e-6));
    EXPECT_TRUE(all_close(dB, ref_dB, 1e-5, 1e-6));

    // An inactive mask is the plain path, bitwise (the scratch untouched).
    std::vector<float> plain(out0.begin(), out0.end()), off(out0.begin(), out0.end());
    lora_forward(plain.data(), su.data(), inp.data(), A.data(), Bm.data(), scale, N, C, OC, r, OC);
    lora_forward(off.data(), su.data(), inp.data(), A.data(), Bm.data(), scale, N, C, OC, r, OC,
                 LoraInputDropout{DropoutMask{}, sequences, nullptr});
    EXPECT_EQ(plain, off);
}

// The adapter's gradient with LoRA's input dropout in the whole model, against central
// differences of the same step's dropped loss (the masks are fixed by the batch's keys), for the
// largest gradient entries of each matrix of the first and last layers.
TEST_F(Lora, InputDropoutGradientMatchesFiniteDifferencesOfTheDroppedLoss) {
    Model model = adapted_model();
    const std::shared_ptr<LoraAdapter> adapter = model.lora;
    ThreadLocalTrainingContext ctx(model.config, B_, T_, Precision::Fp32, Recompute::Cheap);
    ctx.reserve_adapter(lora_config_.rank, 4 * model.config.channels);
    const TokenBatch dropped = with_lora_dropout(batch(), 0.4f);
    const float dloss = 1.0f / static_cast<float>(B_ * T_);
    std::vector<float> grads(adapter->layout.total()), scratch(grads.size());
    const double loss = forward_backward_adapter(model, ctx, dropped, dloss, grads);
    // Dropout acts in training and not in evaluation.
    const double undropped = forward_backward_adapter(model, ctx, batch(), dloss, scratch);
    EXPECT_NE(loss, undropped);
    EXPECT_EQ(forward_loss(model, ctx, dropped), undropped);

    const auto dropped_loss = [&] {
        std::fill(scratch.begin(), scratch.end(), 0.0f);
        return forward_backward_adapter(model, ctx, dropped, dloss, scratch) * dloss;
    };
    const float eps = 1e-2f;
    int checked = 0;
    for (const int l : {0, model.config.num_layers - 1}) {
        for (int i = 0; i < kGpt2LoraTargets; ++i) {
            const auto t = static_cast<LoraTarget>(i);
            const LoraLayout& layout = adapter->layout;
            for (const auto& [offset, count] :
                 {std::pair{layout.a_offset(l, t), layout.a_floats(t)},
                  std::pair{layout.b_offset(l, t), layout.b_floats(t)}}) {
                std::size_t at = offset;
                for (std::size_t k = offset; k < offset + count; ++k)
                    if (std::abs(grads[k]) > std::abs(grads[at])) at = k;
                float& w = adapter->params.data()[at];
                const float saved = w;
                w = saved + eps;
                const double up = dropped_loss();
                w = saved - eps;
                const double down = dropped_loss();
                w = saved;
                const double numeric = (up - down) / (2.0 * eps);
                EXPECT_NEAR(grads[at], numeric, 2e-2 * std::abs(numeric) + 2e-4)
                    << "layer " << l << ' ' << lora_target_module(t)
                    << (offset == layout.a_offset(l, t) ? " A" : " B") << " element "
                    << at - offset;
                ++checked;
            }
        }
    }
    EXPECT_EQ(checked, 2 * 2 * kGpt2LoraTargets);
}

TEST_F(Lora, InputDropoutRecomputingLayersGivesTheSameAdapterGradientBitwise) {
    const Model model = adapted_model();
    const TokenBatch dropped = with_lora_dropout(batch(), 0.25f);
    const float dloss = 1.0f / static_cast<float>(B_ * T_);
    std::vector<float> cheap(model.lora->layout.total()), layers(cheap.size());
    ThreadLocalTrainingContext ctx_cheap(model.config, B_, T_, Precision::Fp32, Recompute::Cheap);
    ThreadLocalTrainingContext ctx_layers(model.config, B_, T_, Precision::Fp32, Recompute::Layers);
    ctx_cheap.reserve_adapter(lora_config_.rank, 4 * model.config.channels);
    ctx_layers.reserve_adapter(lora_config_.rank, 4 * model.config.channels);
    const double loss_cheap = forward_backward_adapter(model, ctx_cheap, dropped, dloss, cheap);
    const double loss_layers = forward_backward_adapter(model, ctx_layers, dropped, dloss, layers);
    EXPECT_EQ(loss_cheap, loss_layers);
    EXPECT_EQ(cheap, layers);
}

// p = 0 is today's path bitwise, whatever the step's keys; p > 0 needs the dropped input's scratch.
TEST_F(Lora, ZeroInputDropoutIsTheUndroppedPathBitwise) {
    const Model model = adapted_model();
    const float dloss = 1.0f / static_cast<float>(B_ * T_);
    std::vector<float> plain(model.lora->layout.total()), zero(plain.size());
    ThreadLocalTrainingContext ctx = context(model);
    const double loss_plain = forward_backward_adapter(model, ctx, batch(), dloss, plain);
    ThreadLocalTrainingContext wide(model.config, B_, T_, Precision::Fp32, Recompute::Cheap);
    wide.reserve_adapter(lora_config_.rank, 4 * model.config.channels);
    const double loss_zero =
        forward_backward_adapter(model, wide, with_lora_dropout(batch(), 0.0f), dloss, zero);
    EXPECT_EQ(loss_plain, loss_zero);
    EXPECT_EQ(plain, zero);
    EXPECT_THROW(
        (void)forward_backward_adapter(model, ctx, with_lora_dropout(batch(), 0.1f), dloss, zero),
        std::invalid_argument);
}

TEST(LoraTargets, PeftNamesParseAndUnknownOnesAreRefusedNamingTheFlag) {
    const auto all = parse_lora_targets("all", "--lora-targets", {});
    EXPECT_EQ(all, (std::array<bool, kLoraTargets>{true, true, true, true}));
    const auto proj = parse_lora_targets("c_proj", "--lora-targets", {});
    EXPECT_EQ(proj, (std::array<bool, kLoraTargets>{false, true, false, true}));
    const auto some = parse_lora_targets("c_attn,mlp.c_proj", "--lora-targets", {});
    EXPECT_EQ(some, (std::array<bool, kLoraTargets>{true, false, false, true}));
    EXPECT_EQ(lora_target_modules(some), (std::vector<std::string>{"c_attn", "mlp.c_proj"}));
    EXPECT_EQ(lora_target_modules(all), (std::vector<std::string>{"c_attn", "c_proj", "c_fc"}));
    const auto refused = [](std::string_view list, const LoraModules& modules) {
        try {
            (void)parse_lora_targets(list, "--lora-targets", modules);
        } catch (const InputError& e) {
            return std::string(e.what());
        }
        return std::string("accepted");
    };
    EXPECT_EQ(refused("c_attn,q_proj", {}),
              "--lora-targets: 'q_proj' is a projection of the Llama family, not of this model "
              "(choose from c_attn, attn.c_proj, c_fc, mlp.c_proj, c_proj, all)");
    EXPECT_EQ(refused("c_attn,qproj", {}),
              "--lora-targets: unknown projection 'qproj' (choose from c_attn, attn.c_proj, c_fc, "
              "mlp.c_proj, c_proj, all)");

    // The Llama family's seven, PEFT's names with or without their module's prefix.
    const LoraModules llama{true, true};
    const auto seven = parse_lora_targets("all", "--lora-targets", llama);
    EXPECT_EQ(lora_target_modules(seven),
              (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                        "up_proj", "down_proj"}));
    const auto qv = parse_lora_targets("q_proj,self_attn.v_proj", "--lora-targets", llama);
    EXPECT_EQ(qv, (std::array<bool, kLoraTargets>{false, false, false, false, true, false, true}));
    EXPECT_EQ(refused("c_attn", llama),
              "--lora-targets: 'c_attn' is a projection of GPT-2, not of this model (choose from "
              "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, all)");
    // Without a gated MLP (the speedrun's ReLU^2) there is no gate_proj, and all leaves it out.
    const LoraModules ungated{true, false};
    EXPECT_EQ(
        lora_target_modules(parse_lora_targets("all", "--lora-targets", ungated)),
        (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"}));
    EXPECT_EQ(refused("gate_proj", ungated),
              "--lora-targets: 'gate_proj' is not a projection of this model: its MLP has no gate "
              "(choose from q_proj, k_proj, v_proj, o_proj, up_proj, down_proj, all)");
    // Before the model is known, a name of either family passes; one of neither does not.
    EXPECT_NO_THROW(check_lora_target_names("c_attn,gate_proj,all", "--lora-targets"));
    EXPECT_THROW(check_lora_target_names("q_proj,wq", "--lora-targets"), InputError);
}

TEST(LoraInit, AIsUniformInPeftsBoundAndBIsZeroSoTheAdaptedModelStartsAsTheBase) {
    const ModelConfig config{16, 101, 128, 2, 4, 64};
    LoraConfig c;
    c.rank = 4;
    c.alpha = 8.0f;
    c.targets = all_lora_targets(ModelConfig{16, 101, 128, 2, 4, 64});
    LoraAdapter adapter(config, c);
    init_lora(adapter, 7);
    for (int l = 0; l < config.num_layers; ++l) {
        for (int i = 0; i < kGpt2LoraTargets; ++i) {
            const auto t = static_cast<LoraTarget>(i);
            const float bound =
                1.0f / std::sqrt(static_cast<float>(lora_product_shape(config, t).in));
            const float* A = adapter.params.data() + adapter.layout.a_offset(l, t);
            const float* B = adapter.params.data() + adapter.layout.b_offset(l, t);
            float widest = 0.0f;
            for (std::size_t k = 0; k < adapter.layout.a_floats(t); ++k)
                widest = std::max(widest, std::abs(A[k]));
            EXPECT_LE(widest, bound);
            EXPECT_GT(widest, 0.9f * bound);  // drawn over the whole range
            for (std::size_t k = 0; k < adapter.layout.b_floats(t); ++k)
                ASSERT_EQ(B[k], 0.0f);
        }
    }
}

}  // namespace
}  // namespace gpt2

namespace gpt2 {
namespace {

TEST(PeftAdapter, WrittenDirectoryReadsBackBitwiseWithPeftsNamesAndConfig) {
    const test::ScratchDir dir("peft");
    const ModelConfig config{16, 101, 128, 2, 4, 64};
    LoraConfig c;
    c.rank = 4;
    c.alpha = 16.0f;
    c.targets = parse_lora_targets("c_attn,mlp.c_proj", "--lora-targets", {});
    LoraAdapter adapter(config, c);
    init_lora(adapter, 3);
    for (std::size_t i = 0; i < adapter.params.size(); ++i)  // B non-zero too
        if (adapter.params.data()[i] == 0.0f)
            adapter.params.data()[i] = 1e-3f * static_cast<float>(i % 17);
    (void)write_peft_adapter(dir.path() / "adapter", adapter, "gpt2");
    const std::string json = read_text_file(dir.path() / "adapter" / "adapter_config.json");
    EXPECT_NE(json.find("\"target_modules\": [\n    \"c_attn\",\n    \"mlp.c_proj\"\n  ]"),
              std::string::npos)
        << json;
    EXPECT_NE(json.find("\"fan_in_fan_out\": true"), std::string::npos) << json;
    const SafetensorsFile file =
        SafetensorsFile::read(dir.path() / "adapter" / "adapter_model.safetensors");
    const SafetensorsTensor* b =
        file.find("base_model.model.transformer.h.1.mlp.c_proj.lora_B.weight");
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->shape, (std::vector<std::int64_t>{64, 4}));
    const std::unique_ptr<LoraAdapter> back = read_peft_adapter(dir.path() / "adapter", config);
    EXPECT_EQ(back->config, c);
    EXPECT_TRUE(std::equal(adapter.params.span().begin(), adapter.params.span().end(),
                           back->params.span().begin(), back->params.span().end()));
}

TEST(PeftAdapter, AnAdapterForAnotherShapeIsRefusedNamingTheTensor) {
    const test::ScratchDir dir("peft_shape");
    LoraConfig c;
    c.rank = 2;
    c.alpha = 4.0f;
    c.targets = all_lora_targets(ModelConfig{16, 101, 128, 2, 4, 64});
    LoraAdapter adapter(ModelConfig{16, 101, 128, 2, 4, 64}, c);
    (void)write_peft_adapter(dir.path(), adapter, "gpt2");
    try {
        (void)read_peft_adapter(dir.path(), ModelConfig{16, 101, 128, 2, 4, 32});
        FAIL() << "an adapter for 64 channels loaded into 32";
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("adapter_model.safetensors: tensor "
                                             "'base_model.model.transformer.h.0.attn.c_attn.lora_A."
                                             "weight' is not 2 x 32"),
                  std::string::npos)
            << e.what();
    }
}

}  // namespace
}  // namespace gpt2

namespace gpt2 {
namespace {

TEST(LoraFlops, ABaseWithoutWeightGradientCountsTwoThirdsOfFullTrainingsProductsPlusTheAdapter) {
    const ModelConfig config{1024, 50257, 50304, 12, 12, 768};
    LoraConfig c;
    c.rank = 16;
    c.alpha = 32.0f;
    c.targets = all_lora_targets(ModelConfig{16, 101, 128, 2, 4, 64});
    const double full = training_flops_per_token(config, 1024);
    const double lora = lora_training_flops_per_token(config, 1024, c);
    const double C = 768, L = 12, T = 1024;
    const double products = 2.0 * (L * 12 * C * C + 50304 * C);
    const double attention = 3.0 * L * 4 * T * C;
    EXPECT_DOUBLE_EQ(full, 3.0 * products + attention);
    // The adapter: 2r(4 in + 3 out) per token per adapted product, in = C, 4C; out = 3C, C, 4C, C.
    const double adapter =
        L * 2 * 16 * ((4 * C + 9 * C) + (4 * C + 3 * C) + (4 * C + 12 * C) + (16 * C + 3 * C));
    EXPECT_DOUBLE_EQ(lora, 2.0 * products + attention + adapter);
    EXPECT_LT(lora, 0.75 * full);
}

// ---------------------------------------------------------------------------------------------
// A LoRA run's checkpoint: the merged weights written a matrix at a time
// ---------------------------------------------------------------------------------------------

// A base and an adapter of its shape with every A and B non-zero (B is zero after init_lora).
struct BaseAndAdapter {
    Model base;
    LoraAdapter adapter;
};
BaseAndAdapter base_and_adapter(const std::string& targets) {
    // C=40 and Vp not a multiple of the matrices' sizes: nothing lines up by accident.
    const ModelConfig config{16, 101, 128, 3, 4, 40};
    Model base(config);
    init_parameters(base, 11);
    LoraConfig c;
    c.rank = 3;
    c.alpha = 7.0f;
    c.targets = parse_lora_targets(targets, "--lora-targets", {});
    LoraAdapter adapter(config, c);
    init_lora(adapter, 5);
    for (std::size_t i = 0; i < adapter.params.size(); ++i)
        if (adapter.params.data()[i] == 0.0f)
            adapter.params.data()[i] = 0.01f * static_cast<float>(static_cast<int>(i % 23) - 11);
    return {std::move(base), std::move(adapter)};
}

// The merged checkpoint as train_gpt2 wrote it before the weights were streamed: merge_lora on a
// whole copy of the model, then save_checkpoint of the copy.
std::vector<std::uint8_t> full_copy_merged_checkpoint(const std::filesystem::path& path,
                                                      const Model& base, const LoraAdapter& adapter,
                                                      const CheckpointExtras& extras) {
    Model merged(base.config);
    const auto weights = base.params.span();
    std::copy(weights.begin(), weights.end(), merged.params.data());
    merge_lora(merged, adapter);
    return read_file_bytes(save_checkpoint(path, merged, extras));
}

std::vector<std::uint8_t> streamed_merged_checkpoint(const std::filesystem::path& path,
                                                     const Model& base, const LoraAdapter& adapter,
                                                     const CheckpointExtras& extras) {
    return read_file_bytes(save_checkpoint(
        path, base.config,
        [&](const ParameterSink& sink) { merged_lora_pieces(base, adapter, sink); }, extras));
}

TEST(LoraCheckpoint, StreamedMergedWeightsAreTheFullCopysFileByteForByte) {
    const test::ScratchDir dir("lora_merged_file");
    const CheckpointExtras extras{{1, 2, 3}, R"({"lora": true})"};
    for (const char* targets : {"all", "c_attn,mlp.c_proj", "attn.c_proj", "c_fc"}) {
        const BaseAndAdapter m = base_and_adapter(targets);
        const auto expected =
            full_copy_merged_checkpoint(dir.path() / "full.bin", m.base, m.adapter, extras);
        const auto streamed =
            streamed_merged_checkpoint(dir.path() / "streamed.bin", m.base, m.adapter, extras);
        EXPECT_TRUE(streamed == expected) << targets;
        // The merge did change the weights: the file is not simply the base's.
        const auto base_file =
            read_file_bytes(save_checkpoint(dir.path() / "base.bin", m.base, extras));
        EXPECT_FALSE(streamed == base_file) << targets;
    }
}

// The comparison catches a wrong merge: one element of one B off, or another alpha.
TEST(LoraCheckpoint, AWrongMergeGivesAnotherFile) {
    const test::ScratchDir dir("lora_wrong_merge");
    const CheckpointExtras extras{{}, "{}"};
    const BaseAndAdapter m = base_and_adapter("all");
    const auto expected =
        full_copy_merged_checkpoint(dir.path() / "full.bin", m.base, m.adapter, extras);
    LoraAdapter off_b(m.base.config, m.adapter.config);
    std::copy(m.adapter.params.span().begin(), m.adapter.params.span().end(), off_b.params.data());
    off_b.params.data()[off_b.layout.b_offset(2, LoraTarget::MlpCProj) + 5] += 0.25f;
    EXPECT_FALSE(streamed_merged_checkpoint(dir.path() / "b.bin", m.base, off_b, extras) ==
                 expected);
    LoraConfig other_alpha = m.adapter.config;
    other_alpha.alpha = 7.5f;
    LoraAdapter off_alpha(m.base.config, other_alpha);
    std::copy(m.adapter.params.span().begin(), m.adapter.params.span().end(),
              off_alpha.params.data());
    EXPECT_FALSE(streamed_merged_checkpoint(dir.path() / "alpha.bin", m.base, off_alpha, extras) ==
                 expected);
}

// What the streaming costs in memory: every piece is either the base's own weights (no copy) or at
// most one adapted matrix of one layer, never a copy of the model.
TEST(LoraCheckpoint, PiecesAreTheBaseItselfOrOneAdaptedMatrix) {
    for (const char* targets : {"all", "c_attn"}) {
        const BaseAndAdapter m = base_and_adapter(targets);
        const std::span<const float> base = m.base.params.span();
        const std::size_t buffer = merge_buffer_floats(m.base.config, m.adapter.config);
        const std::size_t C = static_cast<std::size_t>(m.base.config.channels);
        EXPECT_EQ(buffer, std::string(targets) == "all" ? 4 * C * C : 3 * C * C) << targets;
        std::size_t total = 0;
        std::size_t copied = 0;
        merged_lora_pieces(m.base, m.adapter, [&](std::span<const float> piece) {
            total += piece.size();
            const bool in_base = piece.data() >= base.data() &&
                                 piece.data() + piece.size() <= base.data() + base.size();
            if (in_base) {
                EXPECT_EQ(piece.data(), base.data() + (total - piece.size()));  // in order
            } else {
                EXPECT_LE(piece.size(), buffer);
                copied += piece.size();
            }
        });
        EXPECT_EQ(total, base.size());
        const int L = m.base.config.num_layers;
        EXPECT_EQ(copied, std::string(targets) == "all" ? static_cast<std::size_t>(L) * 12 * C * C
                                                        : static_cast<std::size_t>(L) * 3 * C * C)
            << targets;
    }
}

// The memory plan counts what a checkpoint now adds on rank 0: one adapted matrix of one layer
// (the largest adapted), not a merged copy of the weights.
TEST(LoraCheckpoint, TheMemoryPlanCountsOneAdaptedMatrixNotAMergedCopy) {
    const ModelConfig config = preset_config("gpt2-350M", 50257);
    const std::size_t C = static_cast<std::size_t>(config.channels);
    for (const char* targets : {"all", "c_attn", "attn.c_proj"}) {
        LoraConfig lora;
        lora.rank = 16;
        lora.alpha = 32.0f;
        lora.targets = parse_lora_targets(targets, "--lora-targets", {});
        const MemoryNeed need =
            memory_need(config, 1, 1, 256, Precision::Fp32, Recompute::Layers, 1, lora);
        const std::size_t largest = std::string(targets) == "all"      ? 4 * C * C
                                    : std::string(targets) == "c_attn" ? 3 * C * C
                                                                       : C * C;
        EXPECT_EQ(need.merge_buffer_bytes, largest * sizeof(float)) << targets;
        EXPECT_EQ(need.rank_bytes, need.frozen_bytes + need.adapter_bytes +
                                       need.adapter_moment_bytes + need.merge_buffer_bytes)
            << targets;
    }
}

// --lora-base bf16's twin: set_precision's bf16 copy, bit for bit, while the whole pages of the
// four layer matrices' fp32 copies leave the resident set (mincore) and the rest of the fp32
// weights stays as it was; set_precision, which would round the released zeros into the twin, is
// refused.
TEST(LoraBf16Base, TheTwinIsSetPrecisionsAndTheFp32LayerMatricesPagesAreReleased) {
    const ModelConfig config{64, 100, 128, 2, 4, 256};  // 1.6M floats: a mapped buffer
    Model model(config);
    init_parameters(model, 5);
    Model reference(config);
    init_parameters(reference, 5);
    set_precision(reference, Precision::Bf16);
    const std::vector<float> before(model.params.data(), model.params.data() + model.params.size());
    const std::vector<Bf16> twin(reference.params_bf16.data(),
                                 reference.params_bf16.data() + reference.params_bf16.size());
    const std::size_t released = set_bf16_frozen_base(model);
    EXPECT_EQ(model.precision, Precision::Bf16);
    EXPECT_EQ(released, releasable_fp32_bytes(model.layout));
    EXPECT_EQ(model.released_fp32_bytes, released);
    const std::size_t C = 256;
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    EXPECT_GE(released, 2 * 12 * C * C * sizeof(float) - 8 * page);
    EXPECT_TRUE(model.layer_matrices_bf16_only);

    const auto resident_pages = [&](ParamTensor t) {
        const auto begin = reinterpret_cast<std::uintptr_t>(
            model.params.data() + model.layout.offset(t) + page / sizeof(float));
        const std::uintptr_t lo = begin / page * page;
        const std::size_t bytes = (model.layout.size(t) * sizeof(float) - 2 * page) / page * page;
        std::vector<unsigned char> in_core(bytes / page);
        EXPECT_EQ(::mincore(reinterpret_cast<void*>(lo), bytes, in_core.data()), 0);
        return std::count_if(in_core.begin(), in_core.end(),
                             [](unsigned char c) { return (c & 1) != 0; });
    };
    for (const ParamTensor t : kLayerMatrices)
        EXPECT_EQ(resident_pages(t), 0) << param_tensor_name(t);
    EXPECT_GT(resident_pages(ParamTensor::wte), 0);
    for (int k = 0; k < kNumParamTensors; ++k) {
        const auto t = static_cast<ParamTensor>(k);
        if (is_layer_matrix(t)) continue;
        const std::span<const float> now = model.layout.tensor(model.weights(), t);
        const std::span<const float> was = model.layout.tensor(std::span<const float>(before), t);
        EXPECT_TRUE(std::equal(now.begin(), now.end(), was.begin())) << param_tensor_name(t);
    }
    EXPECT_EQ(std::memcmp(model.params_bf16.data(), twin.data(), twin.size() * sizeof(Bf16)), 0);
    EXPECT_THROW(set_precision(model, Precision::Bf16), std::logic_error);
}

// The memory plan of --lora-base bf16: the frozen weights without the layer matrices' fp32 pages
// (5.5 GiB of GPT-2 1558M's 8.7 GiB), and a merge buffer that holds the largest layer matrix
// whichever targets are adapted (each is converted from bf16 in it).
TEST(LoraBf16Base, TheMemoryPlanCountsTheFrozenWeightsWithoutTheFp32LayerMatrices) {
    const ModelConfig config = preset_config("gpt2-1558M", 50257);
    const std::size_t C = static_cast<std::size_t>(config.channels);
    const std::size_t L = static_cast<std::size_t>(config.num_layers);
    LoraConfig lora;
    lora.rank = 16;
    lora.alpha = 32.0f;
    lora.targets = parse_lora_targets("c_attn", "--lora-targets", {});
    const MemoryNeed both =
        memory_need(config, 1, 1, 1024, Precision::Bf16, Recompute::Layers, 1, lora, false);
    const MemoryNeed bf16 =
        memory_need(config, 1, 1, 1024, Precision::Bf16, Recompute::Layers, 1, lora, true);
    const std::size_t P = ParameterLayout(config).total();
    EXPECT_EQ(both.frozen_bytes, P * 6);
    const std::size_t matrices = L * 12 * C * C * sizeof(float);
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    EXPECT_LE(bf16.frozen_bytes, P * 6 - matrices + 8 * page);
    EXPECT_GE(bf16.frozen_bytes, P * 6 - matrices);
    EXPECT_EQ(both.merge_buffer_bytes, 3 * C * C * sizeof(float));
    EXPECT_EQ(bf16.merge_buffer_bytes, 4 * C * C * sizeof(float));
    EXPECT_EQ(bf16.rank_bytes, bf16.frozen_bytes + bf16.adapter_bytes + bf16.adapter_moment_bytes +
                                   bf16.merge_buffer_bytes);
}

}  // namespace
}  // namespace gpt2
