// The block of the families after GPT-2 against PyTorch: tests/data/llama_reference.bin
// (dev/make_reference.py) holds two models written from their definitions in float64 (Hugging
// Face's Llama: RMSNorm, rotary positions, grouped-query attention, SwiGLU, no biases, an untied
// head; ReLU^2 with RMSNorm without gains and a tied head; modded-nanogpt's block of 2024-11-03:
// QK-norm and the embeddings' norm, ReLU^2, no gains, an untied head), their weights in our layout,
// a batch, the loss and every gradient. Ours on 1, 2 and 3 workers: within the GPT-2 reference
// test's bounds (tests/test_model_reference.cpp: the loss to 1e-5, each gradient element to 1e-3
// relative plus 2e-6), and --recompute layers the same bits as cheap. For the Llama model and the
// ReLU^2 one, also LoRA with PEFT's Llama names on every projection (the base frozen): the loss
// and each adapter matrix's gradient within the GPT-2 LoRA test's bounds (the same as above). In
// bf16 (its products, and its attention where the CPU or GPT2_BF16_ATTENTION takes it): within the
// GPT-2 bf16 test's bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "model/forward_backward.hpp"
#include "model/lora.hpp"
#include "model/model.hpp"
#include "model/training_context.hpp"
#include "parallel/worker_group.hpp"
#include "reference_fixture.hpp"
#include "test_support.hpp"

namespace gpt2 {
namespace {

class LlamaReference : public ::testing::TestWithParam<std::string> {
  protected:
    void SetUp() override {
        fixture_ =
            test::ReferenceFixture::load(std::string(GPT2_TEST_DATA_DIR) + "/llama_reference.bin");
        const auto& c = at("config").i32;  // T, V, Vp, L, NH, C, KV heads, hidden, B, T
        Architecture a;
        a.norm = NormKind::RmsNorm;
        a.positions = PositionKind::Rotary;
        a.rope_theta = at("theta").f32[0];
        a.norm_eps = at("theta").f32[1];
        a.biases = false;
        a.mlp_hidden = c[7];
        a.kv_heads = c[6] == c[4] ? 0 : c[6];
        if (GetParam() == "llama") {
            a.mlp = MlpKind::SwiGlu;
            a.tied_head = false;
        } else {
            a.mlp = MlpKind::ReluSquared;
            a.norm_gains = false;
        }
        if (GetParam() == "speedrun") {  // modded-nanogpt's block of 2024-11-03
            a.tied_head = false;
            a.qk_norm = true;
            a.embedding_norm = true;
        }
        config_ = ModelConfig(c[0], c[1], c[2], c[3], c[4], c[5], a);
        B_ = c[8];
        T_ = c[9];
    }
    [[nodiscard]] const test::FixtureTensor& at(const std::string& name) const {
        return fixture_.at(GetParam() + "." + name);
    }
    [[nodiscard]] Model model() const {
        Model m(config_);
        const auto& params = at("params").f32;
        EXPECT_EQ(params.size(), m.layout.total()) << "the table's layout is PyTorch's";
        std::copy(params.begin(), params.end(), m.params.data());
        return m;
    }
    // The loss and the gradient of the fixture's batch on `workers` workers.
    [[nodiscard]] std::pair<double, std::vector<float>> gradient(
        int workers, Recompute recompute, Precision precision = Precision::Fp32) const {
        Model m = model();
        set_precision(m, precision);
        WorkerGroup group(config_, workers, B_, T_, false, precision, recompute);
        const StepBatch batch{at("inputs").i32, at("targets").i32, 1, B_};
        const GradientPass pass = accumulate_gradients(m, group, batch);
        double loss = 0.0;
        for (const double l : pass.sequence_losses)
            loss += l;
        const std::span<const float> g = group.gradient();
        return {loss / (B_ * T_), std::vector<float>(g.begin(), g.end())};
    }
    test::ReferenceFixture fixture_;
    ModelConfig config_;
    int B_ = 0, T_ = 0;
};

TEST_P(LlamaReference, LossAndEveryGradientMatchPyTorchOnAnySplit) {
    const std::span<const float> expected = at("grads").f32;
    const ParameterLayout layout(config_);
    for (const int workers : {1, 2, 3}) {
        const auto [loss, cheap] = gradient(workers, Recompute::Cheap);
        EXPECT_NEAR(loss, at("loss").f32[0], 1e-5) << workers << " workers";
        ASSERT_EQ(cheap.size(), expected.size());
        for (const TensorSpec& spec : layout.specs()) {
            EXPECT_TRUE(test::all_close(layout.tensor(std::span<const float>(cheap), spec.id),
                                        layout.tensor(expected, spec.id), 1e-3, 2e-6))
                << "gradient of " << param_tensor_name(spec.id) << ", " << workers << " workers";
        }
        // Every recompute level gives the same bits (the split itself may change the last bits:
        // docs/training.md, "Which figures are the same bits").
        const auto [layers_loss, layers] = gradient(workers, Recompute::Layers);
        EXPECT_EQ(layers_loss, loss) << workers << " workers";
        EXPECT_EQ(std::memcmp(layers.data(), cheap.data(), cheap.size() * sizeof(float)), 0)
            << workers << " workers: --recompute layers changed the gradient";
    }
}

// bf16 products (--precision bf16), and bf16 attention where this CPU takes it (after QK-norm and
// rotary, over grouped-query heads): every gradient within the project's bf16 tolerance of
// PyTorch's (2e-2 relative in norm per tensor, test_model_reference's GPT-2 bound), the loss within
// 1e-2 relative; measurably not the fp32 computation; two workers within the same bounds.
TEST_P(LlamaReference, Bf16GradientsMatchPyTorchWithinBf16Tolerance) {
    const std::span<const float> expected = at("grads").f32;
    const ParameterLayout layout(config_);
    for (const int workers : {1, 2}) {
        const auto [loss, g] = gradient(workers, Recompute::Cheap, Precision::Bf16);
        const double expected_loss = at("loss").f32[0];
        EXPECT_NEAR(loss, expected_loss, 1e-2 * expected_loss) << workers << " workers";
        double worst = 0.0;
        for (const TensorSpec& spec : layout.specs()) {
            const auto actual = layout.tensor(std::span<const float>(g), spec.id);
            const auto reference = layout.tensor(expected, spec.id);
            EXPECT_TRUE(test::norm_close(actual, reference, 2e-2))
                << "gradient of " << param_tensor_name(spec.id) << ", " << workers << " workers";
            worst = std::max(worst, test::difference_norms(actual, reference).relative());
        }
        EXPECT_GT(worst, 1e-5) << "gradients as exact as fp32: the bf16 path did not run";
        std::printf(
            "%s bf16 gradients (attention in %s) on %d workers: worst relative error %.2e\n",
            GetParam().c_str(), attention_in_bf16(Precision::Bf16) ? "bf16" : "fp32", workers,
            worst);
    }
}

INSTANTIATE_TEST_SUITE_P(Models, LlamaReference, ::testing::Values("llama", "relu2", "speedrun"),
                         [](const auto& info) { return info.param; });

using LlamaLoraReference = LlamaReference;

// PEFT's q_proj ... down_proj on our fused qkvw and fcw: each a row block of the product, its own
// A and B; the gate's absence without SwiGLU; the order of the adapter's layout (lora.hpp).
TEST_P(LlamaLoraReference, LossAndEveryAdapterGradientMatchPeftsFormulaInPyTorch) {
    Model m = model();
    LoraConfig lora;
    lora.rank = static_cast<int>(at("lora.config").f32[0]);
    lora.alpha = at("lora.config").f32[1];
    lora.targets = all_lora_targets(config_);
    EXPECT_EQ(lora_target_modules(lora.targets).size(), GetParam() == "llama" ? 7u : 6u);
    m.lora = std::make_shared<LoraAdapter>(config_, lora);
    const auto& flat = at("lora").f32;
    ASSERT_EQ(flat.size(), m.lora->params.size()) << "PyTorch's adapter does not fit our layout";
    std::copy(flat.begin(), flat.end(), m.lora->params.data());
    const TokenBatch batch{at("inputs").i32, at("targets").i32, B_, T_};
    const float dloss = 1.0f / static_cast<float>(B_ * T_);
    const auto run = [&](Recompute recompute) {
        ThreadLocalTrainingContext ctx(config_, B_, T_, Precision::Fp32, recompute);
        ctx.reserve_adapter(lora.rank);
        std::vector<float> grads(m.lora->layout.total());
        const double loss = forward_backward_adapter(m, ctx, batch, dloss, grads);
        return std::pair{loss / (B_ * T_), grads};
    };
    const auto [loss, grads] = run(Recompute::Cheap);
    EXPECT_NEAR(loss, at("lora.loss").f32[0], 1e-5);
    EXPECT_GT(std::abs(loss - at("loss").f32[0]), 1e-3) << "the adapter changes the loss";
    const std::vector<float>& expected = at("lora.grads").f32;
    ASSERT_EQ(grads.size(), expected.size());
    const LoraLayout& layout = m.lora->layout;
    for (int l = 0; l < config_.num_layers; ++l) {
        for (int i = 0; i < kLoraTargets; ++i) {
            const auto t = static_cast<LoraTarget>(i);
            if (!lora.adapts(t)) continue;
            for (const bool b : {false, true}) {
                const std::size_t offset = b ? layout.b_offset(l, t) : layout.a_offset(l, t);
                const std::size_t count = b ? layout.b_floats(t) : layout.a_floats(t);
                EXPECT_TRUE(test::all_close(std::span<const float>(grads).subspan(offset, count),
                                            std::span<const float>(expected).subspan(offset, count),
                                            1e-3, 2e-6))
                    << "layer " << l << ' ' << lora_target_module(t) << (b ? " B" : " A");
            }
        }
    }
    const auto [layers_loss, layers] = run(Recompute::Layers);
    EXPECT_EQ(layers_loss, loss);
    EXPECT_EQ(layers, grads) << "--recompute layers changed the adapter's gradient";
}

INSTANTIATE_TEST_SUITE_P(Models, LlamaLoraReference, ::testing::Values("llama", "relu2"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gpt2
