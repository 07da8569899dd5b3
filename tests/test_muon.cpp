// Muon against its definition and against PyTorch: the Newton-Schulz iteration against the same
// iteration in double, and three clipped Muon steps (AdamW for the rest) of the reference GPT-2
// against tests/data/gpt2_muon_reference.bin (dev/make_reference.py), on 1, 2 and 3 workers; the
// same bits for any number of workers and any slicing of the weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "model/model.hpp"
#include "ops/bf16.hpp"
#include "optim/muon.hpp"
#include "parallel/allreduce.hpp"
#include "parallel/comm.hpp"
#include "parallel/gradient_exchange.hpp"
#include "parallel/worker_group.hpp"
#include "reference_fixture.hpp"
#include "threads/thread_pool.hpp"
#include "train/step.hpp"

namespace gpt2 {
namespace {

constexpr double kUnitRoundoff = 0x1p-24;

// The quintic iteration in double, written from its definition.
std::vector<double> newton_schulz_double(std::vector<double> x, int r, int c, int steps) {
    constexpr double a = 3.4445, b = -4.7750, k = 2.0315;
    double squares = 0.0;
    for (const double v : x)
        squares += v * v;
    const double inv = 1.0 / (std::sqrt(squares) + 1e-7);
    for (double& v : x)
        v *= inv;
    const auto R = static_cast<std::size_t>(r), Cc = static_cast<std::size_t>(c);
    std::vector<double> A(R * R), B(R * R), next(R * Cc);
    for (int s = 0; s < steps; ++s) {
        for (std::size_t i = 0; i < R; ++i)
            for (std::size_t j = 0; j < R; ++j) {
                double sum = 0.0;
                for (std::size_t q = 0; q < Cc; ++q)
                    sum += x[i * Cc + q] * x[j * Cc + q];
                A[i * R + j] = sum;
            }
        for (std::size_t i = 0; i < R; ++i)
            for (std::size_t j = 0; j < R; ++j) {
                double sum = 0.0;
                for (std::size_t q = 0; q < R; ++q)
                    sum += A[i * R + q] * A[q * R + j];
                B[i * R + j] = b * A[i * R + j] + k * sum;
            }
        for (std::size_t i = 0; i < R; ++i)
            for (std::size_t j = 0; j < Cc; ++j) {
                double sum = 0.0;
                for (std::size_t q = 0; q < R; ++q)
                    sum += B[i * R + q] * x[q * Cc + j];
                next[i * Cc + j] = a * x[i * Cc + j] + sum;
            }
        x.swap(next);
    }
    return x;
}

// How far the fp32 iteration may drift from the exact one, relative to the result's Frobenius
// norm. Each iteration is three products of inner dimension at most c; under the probabilistic
// model of rounding (Higham and Mary, 2019: a sum of n products is off by at most lambda sqrt(n) u
// of the sum of magnitudes, with probability 1 - 2 exp(-lambda^2 / 2) per element; lambda = 6),
// and with the magnitudes' sums at most sqrt(r) times the result's norm (Cauchy-Schwarz over r
// rows), an iteration adds 3 lambda sqrt(c) u sqrt(r) of relative error. The iteration is
// Lipschitz with L = max |p'| = 3.97 over [0, 1.2023], where the singular values stay (p(s) =
// a s + b s^3 + k s^5 maps [0, 1] into [0, 1.2023] and that interval into itself; the
// normalization puts them in [0, 1]), so the error of iteration i grows at most L^(steps - i)
// times: in all, 3 lambda sqrt(c r) u (1 + L + ... + L^(steps - 1)).
double newton_schulz_tolerance(int r, int c, int steps) {
    constexpr double L = 3.97, lambda = 6.0;
    double growth = 0.0;
    for (int i = 0; i < steps; ++i)
        growth += std::pow(L, i);
    return 3 * lambda * std::sqrt(static_cast<double>(c) * r) * kUnitRoundoff * growth;
}

double frobenius(std::span<const double> x) {
    double sum = 0.0;
    for (const double v : x)
        sum += v * v;
    return std::sqrt(sum);
}

TEST(NewtonSchulz, TheFp32IterationFollowsTheIterationInDouble) {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (const auto& [r, c] : {std::pair{48, 48}, std::pair{64, 256}, std::pair{96, 160}}) {
        const std::size_t n = static_cast<std::size_t>(r) * static_cast<std::size_t>(c);
        std::vector<float> x(n);
        for (float& v : x)
            v = normal(rng);
        const std::vector<double> exact =
            newton_schulz_double(std::vector<double>(x.begin(), x.end()), r, c, 5);
        std::vector<float> scratch(n + 2 * static_cast<std::size_t>(r) * r);
        newton_schulz5(x, r, c, 5, scratch);
        std::vector<double> difference(n);
        for (std::size_t i = 0; i < n; ++i)
            difference[i] = x[i] - exact[i];
        const double relative = frobenius(difference) / frobenius(exact);
        const double tolerance = newton_schulz_tolerance(r, c, 5);
        EXPECT_LE(relative, tolerance) << r << " x " << c;
        std::printf("Newton-Schulz %d x %d: %.2e of the result (tolerance %.2e)\n", r, c, relative,
                    tolerance);
        // What the iteration is for: the singular values near 1 (the quintic's are left in about
        // [0.68, 1.2]), so the Gram matrix X X^T has a diagonal of such squares.
        for (int i = 0; i < r; ++i) {
            double row = 0.0;
            for (int j = 0; j < c; ++j)
                row += exact[static_cast<std::size_t>(i) * c + j] *
                       exact[static_cast<std::size_t>(i) * c + j];
            EXPECT_GT(row, 0.3) << "row " << i;
            EXPECT_LT(row, 1.5) << "row " << i;
        }
    }
}

// The bf16 iteration's first step against the exact one, elementwise, under the probabilistic
// model of rounding the fp32 test uses (independent roundings, each moving its value by at most
// u_b = 2^-8 of it: a sum's error has a standard deviation of at most the root of the sum of its
// terms' squared errors, and exceeds lambda = 6 of them with probability 2 exp(-18)). Each error
// travels through the next product: sd(A A) <= sqrt(sd(A)^2 |A|^2 + |A|^2 sd(A)^2) in the
// elementwise-squared products computed here in double; an error made of correlated parts is
// bounded by the sum of their deviations. Over X X^T, its rounding, A A, B = b A + k A A, its
// rounding and B X that bounds |next - exact| per element, plus the fp32 sums' own rounding
// (gamma_n = n u / (1 - n u) of the magnitudes). Then the five steps as Muon runs them: the
// result's rows have the squared norms the iteration leaves (singular values in about
// [0.68, 1.2]), as the fp32 iteration's do.
TEST(NewtonSchulz, TheBf16IterationFollowsTheIterationInDouble) {
    constexpr double ub = 0x1p-8, a = 3.4445, b = -4.7750, k = 2.0315;
    std::mt19937 rng(8);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const auto product = [](const std::vector<double>& x, const std::vector<double>& y, int m,
                            int inner, int n, bool transpose_y) {
        std::vector<double> out(static_cast<std::size_t>(m) * static_cast<std::size_t>(n), 0.0);
        for (int i = 0; i < m; ++i)
            for (int j = 0; j < n; ++j) {
                double sum = 0.0;
                for (int q = 0; q < inner; ++q)
                    sum += x[static_cast<std::size_t>(i) * inner + q] *
                           (transpose_y ? y[static_cast<std::size_t>(j) * inner + q]
                                        : y[static_cast<std::size_t>(q) * n + j]);
                out[static_cast<std::size_t>(i) * n + j] = sum;
            }
        return out;
    };
    const auto magnitudes = [](std::vector<double> x) {
        for (double& v : x)
            v = std::abs(v);
        return x;
    };
    const auto squares = [](std::vector<double> x) {
        for (double& v : x)
            v *= v;
        return x;
    };
    const auto roots = [](std::vector<double> x) {
        for (double& v : x)
            v = std::sqrt(v);
        return x;
    };
    const auto plus = [](std::vector<double> x, const std::vector<double>& y) {
        for (std::size_t i = 0; i < x.size(); ++i)
            x[i] += y[i];
        return x;
    };
    // Element i of the r x r product |P| |Q|.
    const auto product_at = [](const std::vector<double>& p, const std::vector<double>& q, int r,
                               std::size_t i) {
        const std::size_t R = static_cast<std::size_t>(r), row = i / R, col = i % R;
        double sum = 0.0;
        for (std::size_t t = 0; t < R; ++t)
            sum += p[row * R + t] * q[t * R + col];
        return sum;
    };
    // Gaussian matrices (small singular values after the normalization, where the step is
    // nearly a X) and rank-2 ones plus noise, as gradients tend to be (singular values near 1,
    // where b A and k A A weigh as much as a X).
    for (const auto& [r, c, low_rank] :
         {std::tuple{48, 48, false}, std::tuple{64, 256, false}, std::tuple{96, 160, false},
          std::tuple{48, 48, true}, std::tuple{64, 256, true}, std::tuple{96, 160, true}}) {
        const std::size_t n = static_cast<std::size_t>(r) * static_cast<std::size_t>(c);
        const std::size_t rr = static_cast<std::size_t>(r) * static_cast<std::size_t>(r);
        std::vector<float> x(n);
        std::vector<float> u(2 * static_cast<std::size_t>(r)), v(2 * static_cast<std::size_t>(c));
        for (float& e : u)
            e = normal(rng);
        for (float& e : v)
            e = normal(rng);
        for (std::size_t i = 0; i < n; ++i) {
            const std::size_t row = i / static_cast<std::size_t>(c);
            const std::size_t col = i % static_cast<std::size_t>(c);
            x[i] = low_rank ? u[row] * v[col] + 0.5f * u[r + row] * v[c + col] + 0.05f * normal(rng)
                            : normal(rng);
        }
        std::vector<float> scratch(n + 2 * rr);
        std::vector<Bf16> bf16_scratch(n + 2 * rr);
        // One step: both sides start from the fp32 normalization's X (newton_schulz5 with zero
        // steps), so only the step's own arithmetic separates them.
        std::vector<float> normalized = x;
        newton_schulz5(normalized, r, c, 0, scratch);
        std::vector<float> one = normalized;
        newton_schulz5(one, r, c, 1, scratch, bf16_scratch);
        const std::vector<double> X(normalized.begin(), normalized.end());
        const std::vector<double> exact = newton_schulz_double(X, r, c, 1);
        // newton_schulz_double normalizes again: its X differs from ours by 1e-7 of |X|, exactly
        // accounted for below as a relative 2e-7 of the result's magnitude.
        const double gamma_c = c * kUnitRoundoff / (1 - c * kUnitRoundoff);
        const double gamma_r = r * kUnitRoundoff / (1 - r * kUnitRoundoff);
        constexpr double lambda = 6.0;
        const std::vector<double> absX = magnitudes(X), X2 = squares(X);
        const std::vector<double> A = product(X, X, r, c, r, true);
        const std::vector<double> absA = magnitudes(A), A2 = squares(A);
        const std::vector<double> XX = product(absX, absX, r, c, r, true);
        // X rounded: variance u_b^2 X^2 each; A = Xb Xb^T: both factors' roundings.
        std::vector<double> varXb(n);
        for (std::size_t i = 0; i < n; ++i)
            varXb[i] = ub * ub * X2[i];
        const std::vector<double> varA =
            plus(product(varXb, X2, r, c, r, true), product(X2, varXb, r, c, r, true));
        std::vector<double> varAb(rr);
        for (std::size_t i = 0; i < rr; ++i)
            varAb[i] = varA[i] + ub * ub * A2[i];
        const std::vector<double> varAA =
            plus(product(varAb, A2, r, r, r, false), product(A2, varAb, r, r, r, false));
        const std::vector<double> AA = product(A, A, r, r, r, false);
        const std::vector<double> absAA = product(absA, absA, r, r, r, false);
        std::vector<double> B(rr), absB(rr), varBb(rr), fixedB(rr);
        for (std::size_t i = 0; i < rr; ++i) {
            B[i] = b * A[i] + k * AA[i];
            absB[i] = std::abs(B[i]);
            const double sdB = std::abs(b) * std::sqrt(varA[i]) + k * std::sqrt(varAA[i]);
            varBb[i] = sdB * sdB + ub * ub * B[i] * B[i];
            // The fp32 sums' roundings, bounded outright: X X^T's through b and A A, A A's own.
            fixedB[i] = std::abs(b) * gamma_c * XX[i] +
                        k * (2 * gamma_c * product_at(XX, absA, r, i) + gamma_r * absAA[i]) +
                        2 * kUnitRoundoff * (std::abs(b) * absA[i] + k * absAA[i]);
        }
        const std::vector<double> B2 = squares(B);
        const std::vector<double> sd_from_B = roots(product(varBb, X2, r, r, c, false));
        const std::vector<double> sd_from_X = roots(product(B2, varXb, r, r, c, false));
        const std::vector<double> fixed_from_B = product(fixedB, absX, r, r, c, false);
        const std::vector<double> B_X = product(absB, absX, r, r, c, false);
        double worst = 0.0;
        for (std::size_t i = 0; i < n; ++i) {
            const double magnitude = a * absX[i] + B_X[i];
            // The deviation of next through B (Xb's share of it included) and through the last
            // product's Xb: correlated, so added; the fp32 sums, a X's rounding and the double's
            // second normalization (1e-7 of |X|) outright.
            const double allowed = lambda * (sd_from_B[i] + sd_from_X[i]) + fixed_from_B[i] +
                                   (gamma_r + 2 * kUnitRoundoff) * magnitude + 2e-7 * magnitude;
            worst = std::max(worst, std::abs(one[i] - exact[i]) / allowed);
            ASSERT_LE(std::abs(one[i] - exact[i]), allowed) << r << " x " << c << ", element " << i;
        }
        // Five steps: the rows' squared norms where the iteration puts them; and how far from the
        // exact five steps, for the record (fp32: about 1e-6).
        std::vector<float> five = x;
        newton_schulz5(five, r, c, 5, scratch, bf16_scratch);
        const std::vector<double> exact_five =
            newton_schulz_double(std::vector<double>(x.begin(), x.end()), r, c, 5);
        std::vector<double> difference(n);
        for (std::size_t i = 0; i < n; ++i)
            difference[i] = five[i] - exact_five[i];
        for (int i = 0; i < r; ++i) {
            double row = 0.0;
            for (int j = 0; j < c; ++j)
                row += double{five[static_cast<std::size_t>(i) * c + j]} *
                       five[static_cast<std::size_t>(i) * c + j];
            EXPECT_GT(row, 0.3) << "row " << i;
            EXPECT_LT(row, 1.5) << "row " << i;
        }
        std::printf(
            "bf16 Newton-Schulz %d x %d%s: one step at %.2e of its bound; five steps "
            "%.2e of the result from the exact iteration\n",
            r, c, low_rank ? " (rank 2 + noise)" : "", worst,
            frobenius(difference) / frobenius(exact_five));
    }
}

// Three Muon steps on random gradients against the definition in double (momentum, Nesterov's
// look-ahead, the iteration, the scale, the decay): the same inputs, so only rounding separates
// them: the iteration's (newton_schulz_tolerance) on an update of lr * scale * |O|, plus a few
// roundings of the weights themselves.
TEST(MuonDefinition, ThreeStepsOnRandomGradientsFollowTheDefinitionInDouble) {
    const ParameterLayout layout(ModelConfig{16, 101, 128, 2, 4, 64});
    const std::size_t P = layout.total();
    const MuonSettings settings{0.95f, 0.1f};
    const float lr = 0.02f;
    Muon optimizer(P, 0, settings);
    ThreadPool pool(2);
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    std::vector<float> params(P);
    for (float& p : params)
        p = normal(rng);
    const std::vector<MuonMatrix> matrices = muon_matrices(layout);
    std::vector<std::vector<double>> weights, momentum;
    for (const MuonMatrix& mat : matrices) {
        weights.emplace_back(params.begin() + static_cast<std::ptrdiff_t>(mat.offset),
                             params.begin() + static_cast<std::ptrdiff_t>(mat.offset + mat.size()));
        momentum.emplace_back(mat.size(), 0.0);
    }
    double worst = 0.0;
    for (int step = 0; step < 3; ++step) {
        std::vector<float> gradient(P);
        for (float& g : gradient)
            g = normal(rng);
        for (std::size_t j = 0; j < matrices.size(); ++j) {
            const MuonMatrix& mat = matrices[j];
            const bool tall = mat.rows > mat.cols;
            const int r = std::min(mat.rows, mat.cols), c = std::max(mat.rows, mat.cols);
            std::vector<double> u(mat.size());
            for (int i = 0; i < mat.rows; ++i)
                for (int k = 0; k < mat.cols; ++k) {
                    const std::size_t at = static_cast<std::size_t>(i) * mat.cols + k;
                    const double g = gradient[mat.offset + at];
                    momentum[j][at] =
                        settings.momentum * momentum[j][at] + (1 - settings.momentum) * g;
                    u[tall ? static_cast<std::size_t>(k) * mat.rows + i : at] =
                        g + settings.momentum * (momentum[j][at] - g);
                }
            const std::vector<double> o = newton_schulz_double(u, r, c, 5);
            const double scale = std::sqrt(std::max(1.0, double{1} * mat.rows / mat.cols));
            for (int i = 0; i < mat.rows; ++i)
                for (int k = 0; k < mat.cols; ++k) {
                    const std::size_t at = static_cast<std::size_t>(i) * mat.cols + k;
                    weights[j][at] =
                        weights[j][at] * (1 - double{lr} * settings.weight_decay) -
                        lr * scale * o[tall ? static_cast<std::size_t>(k) * mat.rows + i : at];
                }
        }
        optimizer.update(UpdateTarget{params, {}, gradient, Range{0, P}, &layout},
                         StepRates{AdamWHyper{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f}, lr, 1.0f}, pool);
        for (std::size_t j = 0; j < matrices.size(); ++j) {
            const MuonMatrix& mat = matrices[j];
            const int r = std::min(mat.rows, mat.cols), c = std::max(mat.rows, mat.cols);
            std::vector<double> difference(mat.size());
            for (std::size_t i = 0; i < mat.size(); ++i)
                difference[i] = params[mat.offset + i] - weights[j][i];
            const double scale = std::sqrt(std::max(1.0, double{1} * mat.rows / mat.cols));
            // Each step's update lr scale |O| (|O|_F <= 1.2023 sqrt(r)) off by the iteration's
            // tolerance; the weights' own roundings: 4u of |W| per step.
            const double allowed = (step + 1) * (lr * scale * 1.2023 * std::sqrt(double{1} * r) *
                                                     newton_schulz_tolerance(r, c, 5) +
                                                 4 * kUnitRoundoff * frobenius(weights[j]));
            worst = std::max(worst, frobenius(difference) / allowed);
            ASSERT_LE(frobenius(difference), allowed)
                << "matrix " << j << " after step " << step + 1;
        }
    }
    std::printf("Muon against its definition: the farthest matrix at %.2e of its bound\n", worst);
}

class MuonReference : public ::testing::TestWithParam<int> {
  protected:
    void SetUp() override {
        const std::string dir = GPT2_TEST_DATA_DIR;
        base_ = test::ReferenceFixture::load(dir + "/gpt2_reference.bin");
        muon_ = test::ReferenceFixture::load(dir + "/gpt2_muon_reference.bin");
        const auto& cfg = base_.at("config").i32;
        B_ = cfg[6];
        T_ = cfg[7];
    }
    [[nodiscard]] StepRules rules() const {
        const auto& h = base_.at("adamw.hparams").f32;
        return StepRules{AdamWHyper{h[0], h[1], h[2], h[3], h[4]}, h[5], nullptr,
                         muon_.at("muon.hparams").f32[0]};
    }
    [[nodiscard]] MuonSettings settings() const {
        const auto& h = muon_.at("muon.hparams").f32;
        return MuonSettings{h[1], h[2]};
    }
    [[nodiscard]] StepBatch batch() const {
        return StepBatch{base_.at("inputs").i32, base_.at("targets").i32, 1, B_};
    }
    test::ReferenceFixture base_;
    test::ReferenceFixture muon_;
    int B_ = 0;
    int T_ = 0;
};

// Step one against PyTorch, each part with the bound its arithmetic allows:
//  - a Muon matrix's update is -lr scale O (plus the decay, exact to 4u): O = NS(g / |g|), so the
//    two sides' O differ by the two iterations' rounding (newton_schulz_tolerance each) plus the
//    difference of their inputs, 2 rho (rho: the relative Frobenius difference of the two
//    gradients of the matrix, measured; 2: the normalization) grown by at most L^5;
//  - an AdamW element's first update is -lr f(g) with f(g) = g / (|g| + eps): f is 1/|g|-Lipschitz
//    and |f| <= 1, so it moves by at most lr min(2, |dg| / |g|) for a gradient difference dg
//    (the gradient test's atol + rtol |g|, and 2e-5 of it for the clip factor).
TEST_P(MuonReference, ThreeClippedStepsMatchPyTorch) {
    Model model = test::fixture_model(base_);
    const ParameterLayout& layout = model.layout;
    const std::size_t P = layout.total();
    Muon optimizer(P, 0, settings());
    WorkerGroup workers(model.config, GetParam(), B_, T_, false);
    const Communicator comm = Communicator::single_process();
    AllreduceExchange exchange(comm, P, 0);
    const StepRules step_rules = rules();
    const std::span<const float> torch_gradient = base_.at("grads").f32;
    const auto& losses = muon_.at("muon.losses").f32;
    const auto& norms = muon_.at("muon.grad_norms").f32;
    const std::vector<float> initial(model.params.data(), model.params.data() + P);
    std::vector<float> ours_first;
    std::vector<float> our_gradient;
    for (std::size_t s = 0; s < losses.size(); ++s) {
        TestHooks hooks;
        hooks.inspect_gradient = [&](std::span<const float> g, double) {
            if (s == 0) our_gradient.assign(g.begin(), g.end());
        };
        const StepMetrics m =
            train_step(TrainState{model, optimizer, workers, exchange}, batch(), step_rules, hooks);
        ASSERT_FALSE(m.skipped);
        // The first loss and norm are of the same weights as PyTorch's (the gradient test's
        // bounds); later ones are of weights within the bounds checked below.
        EXPECT_NEAR(m.loss, losses[s], (s == 0 ? 2e-5 : 1e-3) * losses[s]) << "step " << s + 1;
        EXPECT_NEAR(m.grad_norm, norms[s], (s == 0 ? 2e-5 : 1e-2) * norms[s]) << "step " << s + 1;
        if (s == 0) ours_first.assign(model.params.data(), model.params.data() + P);
    }
    ASSERT_EQ(our_gradient.size(), P);
    const std::span<const float> torch_first = muon_.at("muon.params_after_first").f32;
    const float lr = step_rules.muon_lr;
    double worst_share = 0.0;
    std::vector<bool> in_matrix(P, false);
    std::vector<double> first_allowed;  // per matrix, in muon_matrices order
    for (const MuonMatrix& mat : muon_matrices(layout)) {
        const std::size_t n = mat.size();
        std::vector<double> ours(n), theirs(n), dg(n), g(n);
        double weights = 0.0;
        for (std::size_t i = 0; i < n; ++i) {
            const std::size_t k = mat.offset + i;
            in_matrix[k] = true;
            ours[i] = ours_first[k] - initial[k];
            theirs[i] = torch_first[k] - initial[k];
            dg[i] = our_gradient[k] - torch_gradient[k];
            g[i] = torch_gradient[k];
            weights += static_cast<double>(initial[k]) * initial[k];
        }
        const double rho = frobenius(dg) / frobenius(g);
        const int r = std::min(mat.rows, mat.cols), c = std::max(mat.rows, mat.cols);
        const double bound = 2 * newton_schulz_tolerance(r, c, 5) + 2 * rho * std::pow(3.97, 5);
        std::vector<double> difference(n);
        for (std::size_t i = 0; i < n; ++i)
            difference[i] = ours[i] - theirs[i];
        const double allowed = bound * frobenius(theirs) + 4 * kUnitRoundoff * std::sqrt(weights);
        first_allowed.push_back(allowed);
        const double share = frobenius(difference) / allowed;
        worst_share = std::max(worst_share, share);
        EXPECT_LE(share, 1.0) << "matrix at " << mat.offset << " (" << mat.rows << " x " << mat.cols
                              << "), rho " << rho;
        // Not a trivial pass: the update is lr * sqrt(max(1, rows / cols)) * O, |O|_F ~ sqrt(r).
        EXPECT_GT(frobenius(theirs), 0.5 * lr * std::sqrt(static_cast<double>(r)));
    }
    const double clip = std::min(1.0, step_rules.grad_clip / (norms[0] + 1e-6));
    for (std::size_t k = 0; k < P; ++k) {
        if (in_matrix[k]) continue;
        const double g = std::abs(torch_gradient[k]) * clip;
        const double dg = clip * (2e-6 + 1e-3 * std::abs(torch_gradient[k])) + 2e-5 * g;
        const double allowed = step_rules.adamw.lr * std::min(2.0, g > 0 ? dg / g : 2.0) +
                               4 * kUnitRoundoff * std::abs(initial[k]);
        ASSERT_LE(std::abs(ours_first[k] - torch_first[k]), allowed) << "element " << k;
    }
    std::printf("Muon step 1: the farthest matrix from PyTorch's at %.2e of its bound\n",
                worst_share);
    // After the last step, each matrix within the steps' bounds added up: every step's O has
    // singular values in [0.68, 1.2023] (the iteration's range after its first step), so its
    // update is at most 1.2023 / 0.68 times the first's in Frobenius norm, and each step's
    // difference is bounded as the first's (its inputs differ by what the earlier steps left, of
    // the same order: the argument of the AdamW test, FiveClippedAdamWStepsMatchPyTorch).
    const std::span<const float> torch_last = muon_.at("muon.params_after_last").f32;
    const double steps = static_cast<double>(losses.size());
    double last_worst = 0.0;
    const std::vector<MuonMatrix> matrices = muon_matrices(layout);
    for (std::size_t j = 0; j < matrices.size(); ++j) {
        const MuonMatrix& mat = matrices[j];
        std::vector<double> difference(mat.size());
        for (std::size_t i = 0; i < mat.size(); ++i) {
            const std::size_t k = mat.offset + i;
            difference[i] = model.params[k] - torch_last[k];
        }
        const double allowed = steps * (1.2023 / 0.68) * first_allowed[j];
        last_worst = std::max(last_worst, frobenius(difference) / allowed);
        EXPECT_LE(frobenius(difference), allowed)
            << "matrix at " << mat.offset << " after " << steps << " steps";
    }
    std::printf("Muon step %d: the farthest matrix from PyTorch's at %.2e of its bound\n",
                static_cast<int>(steps), last_worst);
}

INSTANTIATE_TEST_SUITE_P(Workers, MuonReference, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                             return "workers" + std::to_string(info.param);
                         });

// A rank of a sliced run, alone: the whole gradient summed here (one process), this rank's slice
// `mine` updated by the step's optimizer; the other slices' gradient is left for the test to hand
// to their optimizers, as the other ranks would.
class OneSliceExchange final : public GradientExchange {
  public:
    OneSliceExchange(Range mine, std::size_t parameters)
        : mine_(mine), parameters_(parameters), comm_(Communicator::single_process()) {}
    GradientPass backward(const Model& model, WorkerGroup& workers, const StepBatch& batch,
                          bool /*overlap*/) override {
        return accumulate_gradients(model, workers, batch);
    }
    std::span<float> finish(WorkerGroup& workers) override { return workers.gradient(); }
    double norm_squared(std::span<float> gradient, WorkerGroup& workers) override {
        return exchange_detail::norm_squared_in_blocks(gradient, Range{0, parameters_}, workers,
                                                       false, nullptr);
    }
    void publish(Model& /*model*/, WorkerGroup& /*workers*/) override {}
    void discard(std::span<float> gradient, WorkerGroup& workers) override {
        exchange_detail::clear_owned(gradient, Range{0, parameters_}, workers);
    }
    [[nodiscard]] Range owned() const override { return mine_; }
    [[nodiscard]] const Communicator& world() const override { return comm_; }

  private:
    Range mine_;
    std::size_t parameters_;
    Communicator comm_;
};

// The same bits whatever the number of workers and however the weights are sliced between ranks
// that each update their part (ZeRO-1, shared memory): each matrix is updated whole by one thread,
// and the slices cut no matrix (slices_between) and no norm block.
// The matrices the tensor table hands to Muon are GPT-2's hidden ones, written out: per layer Q, K
// and V (C x C each, apart), the attention projection (C x C), the MLP's up (4C x C) and down
// (C x 4C); not the embeddings, the head, gains or biases.
TEST(MuonMatrices, TheTablesHiddenMatricesWithQKAndVApart) {
    const ModelConfig config{16, 101, 128, 2, 4, 64};
    const ParameterLayout layout(config);
    const std::size_t C = 64;
    std::vector<MuonMatrix> expected;
    for (std::size_t l = 0; l < 2; ++l) {
        for (std::size_t part = 0; part < 3; ++part)
            expected.push_back(
                {layout.offset(ParamTensor::qkvw) + l * 3 * C * C + part * C * C, 64, 64});
        expected.push_back({layout.offset(ParamTensor::attprojw) + l * C * C, 64, 64});
        expected.push_back({layout.offset(ParamTensor::fcw) + l * 4 * C * C, 256, 64});
        expected.push_back({layout.offset(ParamTensor::fcprojw) + l * 4 * C * C, 64, 256});
    }
    std::sort(expected.begin(), expected.end(),
              [](const MuonMatrix& a, const MuonMatrix& b) { return a.offset < b.offset; });
    const std::vector<MuonMatrix> matrices = muon_matrices(layout);
    ASSERT_EQ(matrices.size(), expected.size());
    for (std::size_t i = 0; i < matrices.size(); ++i) {
        EXPECT_EQ(matrices[i].offset, expected[i].offset) << i;
        EXPECT_EQ(matrices[i].rows, expected[i].rows) << i;
        EXPECT_EQ(matrices[i].cols, expected[i].cols) << i;
    }
}

TEST(MuonSplits, AnyWorkerCountAndAnySlicingGiveTheSameBits) {
    const test::ReferenceFixture base =
        test::ReferenceFixture::load(std::string(GPT2_TEST_DATA_DIR) + "/gpt2_reference.bin");
    const int B = base.at("config").i32[6], T = base.at("config").i32[7];
    const StepBatch batch{base.at("inputs").i32, base.at("targets").i32, 1, B};
    const StepRules rules{AdamWHyper{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f}, 1.0f, nullptr, 0.02f};
    const auto train = [&](int workers_count, int parts) {
        Model model = test::fixture_model(base);
        const std::size_t P = model.layout.total();
        const std::vector<Range> slices = slices_between(
            P, parts, kNormBlock, indivisible_ranges(OptimizerKind::Muon, model.layout),
            indivisible_costs(OptimizerKind::Muon, model.layout));
        std::vector<std::unique_ptr<Optimizer>> optimizers;
        for (const Range& r : slices)
            optimizers.push_back(make_optimizer(OptimizerKind::Muon, r.end - r.begin, r.begin));
        WorkerGroup workers(model.config, workers_count, B, T, false);
        OneSliceExchange exchange(slices[0], P);
        for (int step = 0; step < 3; ++step) {
            const StepMetrics m =
                train_step(TrainState{model, *optimizers[0], workers, exchange}, batch, rules);
            EXPECT_FALSE(m.skipped);
            const StepRates rates{rules.adamw, rules.muon_lr,
                                  clip_scale(m.grad_norm, rules.grad_clip)};
            for (std::size_t part = 1; part < slices.size(); ++part) {
                optimizers[part]->update(
                    UpdateTarget{
                        model.params.span(), {}, workers.gradient(), slices[part], &model.layout},
                    rates, workers.pool());
            }
        }
        return std::vector<float>(model.params.data(), model.params.data() + P);
    };
    // The gradient depends on how many sequences a worker sums (training.md "Which figures are
    // the same bits"), so slicings are compared at one worker count each.
    for (const int workers_count : {1, 2}) {
        const std::vector<float> whole = train(workers_count, 1);
        for (const int parts : {2, 3}) {
            const std::vector<float> sliced = train(workers_count, parts);
            EXPECT_EQ(std::memcmp(whole.data(), sliced.data(), whole.size() * sizeof(float)), 0)
                << workers_count << " workers, " << parts << " slices";
        }
    }
}

// Given the same gradient, the update is the same bits on any number of threads, with fp32 and
// with bf16 products in the iteration.
class MuonThreads : public ::testing::TestWithParam<bool> {};

TEST_P(MuonThreads, TheUpdateIsTheSameBitsOnAnyNumberOfThreads) {
    const test::ReferenceFixture base =
        test::ReferenceFixture::load(std::string(GPT2_TEST_DATA_DIR) + "/gpt2_reference.bin");
    const std::span<const float> gradient = base.at("grads").f32;
    MuonSettings settings;
    settings.bf16_products = GetParam();
    const auto update = [&](int threads) {
        Model model = test::fixture_model(base);
        const std::size_t P = model.layout.total();
        Muon optimizer(P, 0, settings);
        ThreadPool pool(threads);
        for (int step = 0; step < 2; ++step) {
            std::vector<float> g(gradient.begin(), gradient.end());
            optimizer.update(UpdateTarget{model.params.span(), {}, g, Range{0, P}, &model.layout},
                             StepRates{AdamWHyper{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f}, 0.02f, 0.5f},
                             pool);
            EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; }));
        }
        return std::vector<float>(model.params.data(), model.params.data() + P);
    };
    const std::vector<float> one = update(1);
    for (const int threads : {2, 3, 4}) {
        const std::vector<float> other = update(threads);
        EXPECT_EQ(std::memcmp(one.data(), other.data(), one.size() * sizeof(float)), 0)
            << threads << " threads";
    }
    const std::vector<float> initial(base.at("params").f32.begin(), base.at("params").f32.end());
    EXPECT_NE(std::memcmp(one.data(), initial.data(), one.size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(Products, MuonThreads, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Bf16" : "Fp32"; });

// Slices never cut a matrix Muon updates whole, begin on norm blocks, and cover the weights.
TEST(MuonSplits, SlicesHoldWholeMatricesAndCoverTheWeights) {
    for (const int parts : {2, 3, 4, 7}) {
        const ParameterLayout layout(ModelConfig{64, 65, 128, 3, 4, 48});
        const std::vector<Range> whole = indivisible_ranges(OptimizerKind::Muon, layout);
        const std::vector<double> costs = indivisible_costs(OptimizerKind::Muon, layout);
        const std::vector<Range> slices =
            slices_between(layout.total(), parts, kNormBlock, whole, costs);
        ASSERT_EQ(slices.size(), static_cast<std::size_t>(parts));
        EXPECT_EQ(slices.front().begin, 0u);
        EXPECT_EQ(slices.back().end, layout.total());
        for (std::size_t i = 0; i + 1 < slices.size(); ++i) {
            EXPECT_EQ(slices[i].end, slices[i + 1].begin);
            EXPECT_EQ(slices[i].end % kNormBlock == 0 || slices[i].end == layout.total(), true);
            for (const Range& m : whole)
                EXPECT_FALSE(m.begin < slices[i].end && slices[i].end < m.end)
                    << "slice " << i << " ends inside a matrix";
        }
    }
}

// Ranks' slices balance Muon's cost, not the element count: on GPT-2 124M the embeddings
// (AdamW's, cheap) would otherwise leave one rank most of the matrices.
TEST(MuonSplits, SlicesOfGpt2BalanceTheUpdatesCost) {
    const ParameterLayout layout(preset_config("gpt2-124M", 50257));
    const std::vector<Range> whole = indivisible_ranges(OptimizerKind::Muon, layout);
    const std::vector<double> costs = indivisible_costs(OptimizerKind::Muon, layout);
    const auto cost_of = [&](Range slice) {
        double cost = static_cast<double>(slice.end - slice.begin);
        for (std::size_t i = 0; i < whole.size(); ++i) {
            const std::size_t lo = std::max(whole[i].begin, slice.begin);
            const std::size_t hi = std::min(whole[i].end, slice.end);
            if (lo < hi) cost += static_cast<double>(hi - lo) * (costs[i] - 1.0);
        }
        return cost;
    };
    const double total = cost_of(Range{0, layout.total()});
    for (const int parts : {2, 4, 8}) {
        const std::vector<Range> slices =
            slices_between(layout.total(), parts, kNormBlock, whole, costs);
        for (const Range& slice : slices) {
            EXPECT_NEAR(cost_of(slice), total / parts, 0.1 * total / parts)
                << parts << " parts, slice at " << slice.begin;
        }
        const std::vector<Range> by_count =
            slices_between(layout.total(), parts, kNormBlock, whole);
        EXPECT_GT(std::abs(cost_of(by_count[0]) - total / parts), 0.2 * total / parts)
            << "by count the first slice is far from its share (what the costs fix)";
    }
}

}  // namespace
}  // namespace gpt2
