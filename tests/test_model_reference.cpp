// The model against PyTorch: every activation, the logits, the loss, every parameter gradient and
// five clipped AdamW steps must match tests/data/gpt2_reference.bin (scripts/make_reference.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "model/model.hpp"
#include "model/training_context.hpp"
#include "ops/kernels.hpp"
#include "parallel/comm.hpp"
#include "parallel/data_parallel.hpp"
#include "reference_fixture.hpp"
#include "test_support.hpp"

namespace gpt2 {
namespace {

using test::all_close;
using test::ReferenceFixture;

class ModelReference : public ::testing::Test {
  protected:
    void SetUp() override {
        fixture_ = ReferenceFixture::load(std::string(GPT2_TEST_DATA_DIR) + "/gpt2_reference.bin");
        const auto& cfg = fixture_.at("config").i32;
        config_ = ModelConfig{cfg[0], cfg[1], cfg[2], cfg[3], cfg[4], cfg[5]};
        B_ = cfg[6];
        T_ = cfg[7];
    }

    [[nodiscard]] Model make_model() const {
        Model model(config_);
        const auto& params = fixture_.at("params").f32;
        EXPECT_EQ(params.size(), model.params.size());
        std::copy(params.begin(), params.end(), model.params.data());
        return model;
    }
    [[nodiscard]] TokenBatch batch() const {
        return TokenBatch{fixture_.at("inputs").i32, fixture_.at("targets").i32, B_, T_};
    }
    [[nodiscard]] std::span<const float> expected(std::string_view name) const {
        return fixture_.at(name).f32;
    }

    ReferenceFixture fixture_;
    ModelConfig config_;
    int B_ = 0;
    int T_ = 0;
};

TEST_F(ModelReference, ActivationsLogitsLossAndGradientsMatchPyTorch) {
    const Model model = make_model();
    ThreadLocalTrainingContext ctx(config_, B_, T_);
    const int N = B_ * T_;
    const int C = config_.channels;
    const double loss_sum = forward_backward(model, ctx, batch(), 1.0f / static_cast<float>(N));
    EXPECT_NEAR(loss_sum / N, fixture_.at("loss").f32[0], 1e-5);

    // Per-layer activations: the context stacks layers [L][N][X] exactly as the fixture does
    // (it is sized for exactly B sequences).
    const auto acts = [&](float* base, int width) {
        return std::span<const float>(base,
                                      static_cast<std::size_t>(config_.num_layers) * N * width);
    };
    const double rtol = 1e-4, atol = 1e-5;
    EXPECT_TRUE(all_close({ctx.acts.encoded, static_cast<std::size_t>(N * C)},
                          expected("act.encoded"), rtol, atol));
    EXPECT_TRUE(all_close(acts(ctx.acts.ln1, C), expected("act.ln1"), rtol, atol));
    EXPECT_TRUE(all_close(acts(ctx.acts.qkv, 3 * C), expected("act.qkv"), rtol, atol));
    EXPECT_TRUE(all_close(acts(ctx.acts.atty, C), expected("act.atty"), rtol, atol));
    EXPECT_TRUE(all_close(acts(ctx.acts.residual2, C), expected("act.residual2"), rtol, atol));
    EXPECT_TRUE(all_close(acts(ctx.acts.ln2, C), expected("act.ln2"), rtol, atol));
    EXPECT_TRUE(all_close(acts(ctx.acts.fch, 4 * C), expected("act.fch"), rtol, atol));
    EXPECT_TRUE(all_close(acts(ctx.acts.fch_gelu, 4 * C), expected("act.fch_gelu"), rtol, atol));
    EXPECT_TRUE(all_close(acts(ctx.acts.residual3, C), expected("act.residual3"), rtol, atol));
    EXPECT_TRUE(all_close({ctx.acts.lnf, static_cast<std::size_t>(N * C)}, expected("act.lnf"),
                          rtol, atol));

    // Logits are never materialised in training (the LM head runs in chunks): recompute them
    // from lnf with the kernel and compare the first V of Vp columns.
    const int V = config_.vocab_size, Vp = config_.padded_vocab_size;
    std::vector<float> logits(static_cast<std::size_t>(N) * Vp);
    matmul_forward(logits.data(), ctx.acts.lnf,
                   model.layout.tensor(model.weights(), ParamTensor::wte).data(), nullptr, N, C,
                   Vp);
    std::vector<float> unpadded;
    for (int r = 0; r < N; ++r) {
        unpadded.insert(unpadded.end(), logits.begin() + static_cast<long>(r) * Vp,
                        logits.begin() + static_cast<long>(r) * Vp + V);
    }
    EXPECT_TRUE(all_close(unpadded, expected("logits"), rtol, atol));

    const std::span<const float> grads = expected("grads");
    for (int i = 0; i < kNumParamTensors; ++i) {
        const auto t = static_cast<ParamTensor>(i);
        EXPECT_TRUE(all_close(model.layout.tensor(ctx.grads.span(), t),
                              model.layout.tensor(grads, t), 1e-3, 2e-6))
            << "gradient of " << param_tensor_name(t);
    }
}

// Five AdamW steps with clipping, on one worker and on two (B=3 splits 2+1).
class ModelReferenceTraining : public ModelReference, public ::testing::WithParamInterface<int> {};

TEST_P(ModelReferenceTraining, FiveClippedAdamWStepsMatchPyTorch) {
    Model model = make_model();
    AdamWState optimizer(model.layout.total());
    WorkerGroup workers(config_, GetParam(), B_, T_, false);
    const Communicator comm = Communicator::single_process();
    const auto& h = fixture_.at("adamw.hparams").f32;
    const StepHyper hyper{AdamWHyper{h[0], h[1], h[2], h[3], h[4]}, h[5]};
    const TokenBatch b = batch();
    const StepBatch step{b.inputs, b.targets, 1, B_};
    const auto& losses = fixture_.at("adamw.losses").f32;
    const auto& norms = fixture_.at("adamw.grad_norms").f32;
    for (std::size_t s = 0; s < losses.size(); ++s) {
        const StepMetrics m = train_step(model, optimizer, workers, comm, step, hyper);
        EXPECT_NEAR(m.loss, losses[s], 2e-5 * losses[s]) << "step " << s;
        EXPECT_NEAR(m.grad_norm, norms[s], 2e-5 * norms[s]) << "step " << s;
        EXPECT_FALSE(m.skipped);
    }
    EXPECT_TRUE(all_close(model.params.span(), expected("adamw.params_after"), 1e-4, 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Workers, ModelReferenceTraining, ::testing::Values(1, 2, 3));

}  // namespace
}  // namespace gpt2
