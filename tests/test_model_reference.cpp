// The model against PyTorch: every activation, the logits, the loss, every parameter gradient and
// five clipped AdamW steps must match tests/data/gpt2_reference.bin (dev/make_reference.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "model/forward_backward.hpp"
#include "model/model.hpp"
#include "ops/kernels.hpp"
#include "optim/adamw.hpp"
#include "parallel/allreduce.hpp"
#include "parallel/comm.hpp"
#include "reference_fixture.hpp"
#include "test_support.hpp"
#include "train/step.hpp"

namespace gpt2 {
namespace {

using test::all_close;
using test::ReferenceFixture;

class ModelReference : public ::testing::Test {
  protected:
    void SetUp() override {
        fixture_ = ReferenceFixture::load(std::string(GPT2_TEST_DATA_DIR) + "/gpt2_reference.bin");
        const auto& cfg = fixture_.at("config").i32;
        config_ = test::fixture_config(fixture_);
        B_ = cfg[6];
        T_ = cfg[7];
    }

    [[nodiscard]] Model make_model() const { return test::fixture_model(fixture_); }
    [[nodiscard]] TokenBatch batch() const {
        return TokenBatch{fixture_.at("inputs").i32, fixture_.at("targets").i32, B_, T_};
    }
    // The fixture's AdamW step: its hyperparameters and the whole batch as one micro-step.
    [[nodiscard]] StepRules adamw_rules() const {
        const auto& h = fixture_.at("adamw.hparams").f32;
        return StepRules{AdamWHyper{h[0], h[1], h[2], h[3], h[4]}, h[5]};
    }
    [[nodiscard]] StepBatch step_batch() const {
        const TokenBatch b = batch();
        return StepBatch{b.inputs, b.targets, 1, B_};
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
    std::vector<float> gradient(model.layout.total());
    const double loss_sum =
        forward_backward(model, ctx, batch(), 1.0f / static_cast<float>(N), gradient);
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
    EXPECT_TRUE(all_close(acts(ctx.acts.qkv, 3 * C), expected("act.qkv"), rtol, atol));
    EXPECT_TRUE(all_close(acts(ctx.acts.atty, C), expected("act.atty"), rtol, atol));
    EXPECT_TRUE(all_close(acts(ctx.acts.residual2, C), expected("act.residual2"), rtol, atol));
    EXPECT_TRUE(all_close(acts(ctx.acts.fch, 4 * C), expected("act.fch"), rtol, atol));
    EXPECT_TRUE(all_close(acts(ctx.acts.residual3, C), expected("act.residual3"), rtol, atol));
    // LayerNorm and GELU outputs are not stored: backward recomputes them from the stored inputs
    // and statistics, as here.
    const auto L = static_cast<std::size_t>(config_.num_layers);
    const auto NC = static_cast<std::size_t>(N) * C;
    std::vector<float> ln1(L * NC), ln2(L * NC), gelu(4 * L * NC);
    for (std::size_t l = 0; l < L; ++l) {
        const LayerView<const float> p =
            layer_view(model.layout, model.weights(), static_cast<int>(l));
        const float* input = l == 0 ? ctx.acts.encoded : ctx.acts.residual3 + (l - 1) * NC;
        layernorm_recompute(ln1.data() + l * NC, input, ctx.acts.ln1_mean + l * N,
                            ctx.acts.ln1_rstd + l * N, p.ln1w, p.ln1b, N, C);
        layernorm_recompute(ln2.data() + l * NC, ctx.acts.residual2 + l * NC,
                            ctx.acts.ln2_mean + l * N, ctx.acts.ln2_rstd + l * N, p.ln2w, p.ln2b, N,
                            C);
        gelu_forward(gelu.data() + 4 * l * NC, ctx.acts.fch + 4 * l * NC, 4 * N * C);
    }
    EXPECT_TRUE(all_close(ln1, expected("act.ln1"), rtol, atol));
    EXPECT_TRUE(all_close(ln2, expected("act.ln2"), rtol, atol));
    EXPECT_TRUE(all_close(gelu, expected("act.fch_gelu"), rtol, atol));
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
        EXPECT_TRUE(all_close(model.layout.tensor(std::span<const float>(gradient), t),
                              model.layout.tensor(grads, t), 1e-3, 2e-6))
            << "gradient of " << param_tensor_name(t);
    }
}

// bf16 products (--precision bf16): every gradient within bf16's tolerance of PyTorch's fp32
// gradients (2e-2 relative in norm, per tensor), and measurably not the fp32 computation.
TEST_F(ModelReference, Bf16GradientsMatchPyTorchWithinBf16Tolerance) {
    Model model = make_model();
    set_precision(model, Precision::Bf16);
    ThreadLocalTrainingContext ctx(config_, B_, T_, Precision::Bf16);
    const int N = B_ * T_;
    std::vector<float> gradient(model.layout.total());
    const double loss =
        forward_backward(model, ctx, batch(), 1.0f / static_cast<float>(N), gradient) / N;
    const double expected_loss = fixture_.at("loss").f32[0];
    EXPECT_NEAR(loss, expected_loss, 1e-2 * expected_loss);
    EXPECT_NE(loss, static_cast<double>(static_cast<float>(expected_loss)))
        << "bf16 products should not reproduce fp32 exactly";
    const std::span<const float> grads = expected("grads");
    double worst = 0.0;
    for (int i = 0; i < kNumParamTensors; ++i) {
        const auto t = static_cast<ParamTensor>(i);
        const auto actual = model.layout.tensor(std::span<const float>(gradient), t);
        const auto reference = model.layout.tensor(grads, t);
        EXPECT_TRUE(test::norm_close(actual, reference, 2e-2))
            << "gradient of " << param_tensor_name(t);
        worst = std::max(worst, test::difference_norms(actual, reference).relative());
    }
    EXPECT_GT(worst, 1e-5) << "gradients as exact as fp32: the bf16 path did not run";
    std::printf("bf16 gradients on %s: worst relative error %.2e\n",
                bf16_backend_name(bf16_backend()), worst);
}

// Five AdamW steps with clipping, on one, two and three workers (B=3 splits 2+1 and 1+1+1).
//
// What is determined, and so checked, at each level:
// 1. Each step's loss and pre-clip gradient norm against PyTorch's (aggregates over every element:
//    summation order moves them by a few float roundings, far below 2e-5).
// 2. The first step's gradient, as the step summed it over its workers, against PyTorch's at the
//    tolerance of the single-context gradient test above.
// 3. The update each step makes, against AdamW with PyTorch's clip_grad_norm_ rule written out here
//    in double from the very gradient, weights and moments the step started from: equal to
//    float rounding, so a wrong bias correction, decay, clip, sign or learning rate fails it.
// 4. The weights after five steps against PyTorch's, per element, at a tolerance derived from the
//    learning rate, the step count and how well that element's gradient is determined (below).
//    They cannot be compared at a fixed tolerance: an element whose gradient is zero up to
//    rounding (each layer's key bias: softmax ignores a constant added to a row of scores) gets
//    Adam steps of up to lr from noise of 1e-11 whose sign the summation order decides, so such a
//    comparison tests one build's and one CPU's summation order, not the arithmetic (issue 39).
class ModelReferenceTraining : public ModelReference, public ::testing::WithParamInterface<int> {};

// The unit roundoff of float.
constexpr double kUnitRoundoff = 0x1p-24;
// The gradient test's tolerance (ActivationsLogitsLossAndGradientsMatchPyTorch).
constexpr double kGradientRtol = 1e-3;
constexpr double kGradientAtol = 2e-6;

// The tensors AdamW decays: the 2-D matrices (dev/make_reference.py's DECAYED).
bool decayed(ParamTensor t) {
    return t == ParamTensor::wte || t == ParamTensor::wpe || t == ParamTensor::qkvw ||
           t == ParamTensor::attprojw || t == ParamTensor::fcw || t == ParamTensor::fcprojw;
}

// Bound on Adam's step direction |m_hat / (sqrt(v_hat) + eps)| at step t, whatever the gradients:
// by Cauchy-Schwarz, |m_t| <= (1 - b1) / sqrt(1 - b2) * sqrt(sum_{k<t} (b1^2 / b2)^k) * sqrt(v_t),
// then the bias corrections: 1 at t = 1, 1.003 at t = 5 for (0.9, 0.95).
double adam_direction_bound(const AdamWHyper& h, int t) {
    const double b1 = h.beta1, b2 = h.beta2;
    double sum = 0.0;
    for (int k = 0; k < t; ++k)
        sum += std::pow(b1 * b1 / b2, k);
    return (1.0 - b1) / std::sqrt(1.0 - b2) * std::sqrt(sum) * std::sqrt(1.0 - std::pow(b2, t)) /
           (1.0 - std::pow(b1, t));
}

// One clipped AdamW step in double (PyTorch's AdamW and clip_grad_norm_, written from their
// definitions) from the float state a step started from, with each result's rounding bound: the
// float kernel rounds each of its few operations once (at most 16 roundings of the magnitudes
// involved per result), and its clip factor comes from a norm whose longest float sum is the tail
// of fewer than 1024 squares after sum_of_squares's blocks (relative error below 1024u on the
// squared norm, 512u on the norm and so on the factor).
struct AdamWReference {
    std::vector<double> params, m, v;
    std::vector<double> params_tol, m_tol, v_tol;
    double norm = 0.0;
};

AdamWReference adamw_reference(const ParameterLayout& layout, std::span<const float> params,
                               std::span<const float> m, std::span<const float> v,
                               std::span<const float> gradient, const AdamWHyper& h, float max_norm,
                               int t) {
    const double u = kUnitRoundoff, scale_error = 512 * u;
    AdamWReference r;
    double sum_sq = 0.0;
    for (const float g : gradient)
        sum_sq += static_cast<double>(g) * g;
    r.norm = std::sqrt(sum_sq);
    const double clip = std::min(1.0, max_norm / (r.norm + 1e-6));
    const double b1 = h.beta1, b2 = h.beta2, lr = h.lr, eps = h.eps;
    const double bias1 = 1.0 - std::pow(b1, t), bias2 = 1.0 - std::pow(b2, t);
    const std::size_t P = params.size();
    for (auto* vec : {&r.params, &r.m, &r.v, &r.params_tol, &r.m_tol, &r.v_tol})
        vec->resize(P);
    for (int i = 0; i < kNumParamTensors; ++i) {
        const auto tensor = static_cast<ParamTensor>(i);
        const double decay = decayed(tensor) ? h.weight_decay : 0.0;
        for (std::size_t k = layout.offset(tensor); k < layout.offset(tensor) + layout.size(tensor);
             ++k) {
            const double g = clip * gradient[k];
            r.m[k] = b1 * m[k] + (1.0 - b1) * g;
            r.v[k] = b2 * v[k] + (1.0 - b2) * g * g;
            const double denom = std::sqrt(r.v[k] / bias2) + eps;
            const double step = lr * (r.m[k] / bias1) / denom;
            r.params[k] = params[k] * (1.0 - lr * decay) - step;
            r.m_tol[k] = 16 * u * (b1 * std::abs(m[k]) + (1.0 - b1) * std::abs(g)) +
                         (1.0 - b1) * std::abs(g) * scale_error;
            r.v_tol[k] = 16 * u * r.v[k] + (1.0 - b2) * g * g * 2 * scale_error;
            // The step's own roundings, then the moments' errors carried through m / sqrt(v).
            r.params_tol[k] = 16 * u * (std::abs(params[k]) + std::abs(step)) +
                              lr / bias1 * r.m_tol[k] / denom +
                              (r.v[k] > 0 ? std::abs(step) * r.v_tol[k] / (2 * r.v[k]) : 0.0);
        }
    }
    return r;
}

// |actual - expected| <= tolerance element by element; reports the worst element by its tensor,
// and its share of its tolerance in `worst_share` when given.
::testing::AssertionResult within(const ParameterLayout& layout, std::span<const float> actual,
                                  std::span<const double> expected,
                                  std::span<const double> tolerance,
                                  double* worst_share = nullptr) {
    std::size_t worst = 0;
    double worst_ratio = -1.0;
    for (std::size_t k = 0; k < actual.size(); ++k) {
        const double ratio = std::abs(actual[k] - expected[k]) / tolerance[k];
        if (!(ratio <= worst_ratio)) {
            worst_ratio = ratio;
            worst = k;
        }
    }
    if (worst_share != nullptr) *worst_share = worst_ratio;
    if (!(worst_ratio <= 1.0)) {
        ParamTensor tensor = ParamTensor::wte;
        for (int i = 0; i < kNumParamTensors; ++i) {
            const auto t = static_cast<ParamTensor>(i);
            if (worst >= layout.offset(t)) tensor = t;
        }
        return ::testing::AssertionFailure()
               << "element " << worst << " (" << param_tensor_name(tensor) << " ["
               << worst - layout.offset(tensor) << "]): " << actual[worst] << " vs "
               << expected[worst] << ", tolerance " << tolerance[worst] << " (" << worst_ratio
               << "x)";
    }
    return ::testing::AssertionSuccess();
}

TEST_P(ModelReferenceTraining, FiveClippedAdamWStepsMatchPyTorch) {
    Model model = make_model();
    const ParameterLayout& layout = model.layout;
    AdamW optimizer(layout.total());
    WorkerGroup workers(config_, GetParam(), B_, T_, false);
    const Communicator comm = Communicator::single_process();
    AllreduceExchange exchange(comm, model.layout.total(), 0);
    const StepRules hyper = adamw_rules();
    const StepBatch step = step_batch();
    const auto& losses = fixture_.at("adamw.losses").f32;
    const auto& norms = fixture_.at("adamw.grad_norms").f32;
    const std::span<const float> torch_gradient = expected("grads");
    const std::vector<float> initial(model.params.data(), model.params.data() + layout.total());
    ASSERT_EQ(losses.size(), 5u);
    for (std::size_t s = 0; s < losses.size(); ++s) {
        const int t = static_cast<int>(s) + 1;
        const std::vector<float> p(model.params.data(), model.params.data() + layout.total());
        const std::vector<float> m(optimizer.state.m.data(),
                                   optimizer.state.m.data() + layout.total());
        const std::vector<float> v(optimizer.state.v.data(),
                                   optimizer.state.v.data() + layout.total());
        AdamWReference reference;
        TestHooks hooks;
        hooks.inspect_gradient = [&](std::span<const float> gradient, double norm) {
            reference = adamw_reference(layout, p, m, v, gradient, hyper.adamw, hyper.grad_clip, t);
            EXPECT_NEAR(norm, reference.norm, 512 * kUnitRoundoff * reference.norm) << "step " << t;
            if (s == 0) {
                EXPECT_TRUE(all_close(gradient, torch_gradient, kGradientRtol, kGradientAtol))
                    << "the step's summed gradient";
            }
        };
        const StepMetrics metrics =
            train_step(TrainState{model, optimizer, workers, exchange}, step, hyper, hooks);
        EXPECT_NEAR(metrics.loss, losses[s], 2e-5 * losses[s]) << "step " << t;
        EXPECT_NEAR(metrics.grad_norm, norms[s], 2e-5 * norms[s]) << "step " << t;
        ASSERT_FALSE(metrics.skipped);
        ASSERT_EQ(reference.params.size(), layout.total()) << "the gradient was not inspected";
        ASSERT_TRUE(within(layout, model.params.span(), reference.params, reference.params_tol))
            << "weights after step " << t;
        ASSERT_TRUE(within(layout, optimizer.state.m.span(), reference.m, reference.m_tol))
            << "first moment after step " << t;
        ASSERT_TRUE(within(layout, optimizer.state.v.span(), reference.v, reference.v_tol))
            << "second moment after step " << t;
    }

    // 4. Against PyTorch after five steps. Each step moves an element by lr * (d + decay * p),
    // Adam's direction d bounded by c_t (adam_direction_bound). If every gradient the two runs
    // see agrees to a relative rho (the gradient test's bound at step one: (atol + rtol |g|) / |g|
    // with PyTorch's |g|, plus 2e-5 for the clip factors, which follow the norms checked at every
    // step; later steps see the same functions at weights moved by at most 5 lr), m_hat moves by at
    // most rho * c_t * sqrt(v_hat) and sqrt(v_hat) by a factor within 1 +- rho, so d moves by at
    // most 2 rho c_t / (1 - rho) <= 4 rho c_t (rho <= 1/2), and never by more than 2 c_t. Summed
    // over the steps, each step's difference also decayed by (1 - lr * decay) at most once more:
    //     |p_ours - p_torch| <= (1 + lr * wd)^S * lr * sum_t c_t * min(2, 4 rho) + 4u |p|.
    // So where the gradient is determined (|g| = 2e-3, rho = 2e-3) the weights agree to 4e-5, and
    // where it is rounding noise (the key biases) to about 1e-2; a lost bias correction (a 14-55%
    // smaller step), a wrong sign or a doubled learning rate fails.
    const AdamWHyper& h = hyper.adamw;
    const int S = static_cast<int>(losses.size());
    double direction_sum = 0.0;
    for (int t = 1; t <= S; ++t)
        direction_sum += adam_direction_bound(h, t);
    const double spread = std::pow(1.0 + double{h.lr} * h.weight_decay, S) * h.lr * direction_sum;
    const std::span<const float> torch_after = expected("adamw.params_after");
    std::vector<double> target(torch_after.begin(), torch_after.end()), tolerance(layout.total());
    for (std::size_t k = 0; k < tolerance.size(); ++k) {
        const double g = std::abs(torch_gradient[k]);
        const double rho = (kGradientAtol + kGradientRtol * g) / g + 2e-5;  // inf where g = 0
        tolerance[k] = spread * std::min(2.0, 4.0 * rho) + 4 * kUnitRoundoff * std::abs(target[k]);
    }
    double share = 0.0;
    EXPECT_TRUE(within(layout, model.params.span(), target, tolerance, &share));
    std::printf(
        "weights after %d steps: the farthest element from PyTorch's at %.3f of its bound\n", S,
        share);
    // The padded vocabulary rows: no gradient, zero weights, so Adam leaves them exactly zero.
    const auto wte = layout.tensor(model.params.span(), ParamTensor::wte);
    for (std::size_t k = static_cast<std::size_t>(config_.vocab_size) * config_.channels;
         k < wte.size(); ++k) {
        ASSERT_EQ(wte[k], 0.0f) << "padded wte element " << k;
    }
    EXPECT_NE(std::memcmp(model.params.data(), initial.data(), initial.size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(Workers, ModelReferenceTraining, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                             return "workers" + std::to_string(info.param);
                         });

// The same five steps in bf16: every step's loss and gradient norm (which depend on the updates
// before them) within bf16 tolerance of PyTorch's fp32 run, and the bf16 weight copy exactly the
// rounded master weights after every step (AdamW writes it in its own pass). Element-wise updates
// are not compared: Adam's m/sqrt(v) turns 0.5% gradient differences on near-zero gradients into
// updates of a different sign.
TEST_P(ModelReferenceTraining, FiveBf16StepsFollowPyTorchAndKeepTheBf16CopyFresh) {
    Model model = make_model();
    set_precision(model, Precision::Bf16);
    AdamW optimizer(model.layout.total());
    WorkerGroup workers(config_, GetParam(), B_, T_, false, Precision::Bf16);
    const Communicator comm = Communicator::single_process();
    AllreduceExchange exchange(comm, model.layout.total(), 0);
    const StepRules hyper = adamw_rules();
    const StepBatch step = step_batch();
    const auto& losses = fixture_.at("adamw.losses").f32;
    const auto& norms = fixture_.at("adamw.grad_norms").f32;
    for (std::size_t s = 0; s < losses.size(); ++s) {
        const StepMetrics m =
            train_step(TrainState{model, optimizer, workers, exchange}, step, hyper);
        EXPECT_NEAR(m.loss, losses[s], 1e-2 * losses[s]) << "step " << s;
        EXPECT_NEAR(m.grad_norm, norms[s], 2e-2 * norms[s]) << "step " << s;
        for (std::size_t i = 0; i < model.params.size(); ++i) {
            ASSERT_EQ(static_cast<std::uint16_t>(model.params_bf16[i]),
                      static_cast<std::uint16_t>(to_bf16(model.params[i])))
                << "bf16 copy stale at " << i << " after step " << s;
        }
    }
}

}  // namespace
}  // namespace gpt2
