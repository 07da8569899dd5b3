// The layers of the families after GPT-2 (ops/block_kernels.hpp) against PyTorch in float64
// (tests/data/block_kernels_reference.bin, dev/make_reference.py): RMSNorm with and without a
// gain, rotary positions on a grouped-query qkv row, SwiGLU and ReLU^2, forward and backward, each
// element within a bound derived from the fp32 arithmetic it does (u = 2^-24; the reference's own
// rounding to fp32 adds u/2 of it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "ops/block_kernels.hpp"
#include "reference_fixture.hpp"

namespace gpt2 {
namespace {

constexpr double u = 0x1p-24;

class BlockKernels : public ::testing::Test {
  protected:
    void SetUp() override {
        fixture_ = test::ReferenceFixture::load(std::string(GPT2_TEST_DATA_DIR) +
                                                "/block_kernels_reference.bin");
    }
    [[nodiscard]] std::vector<float> f32(const std::string& name) const {
        const auto& v = fixture_.at(name).f32;
        return {v.begin(), v.end()};
    }
    // Every element within its bound; prints the worst share of it.
    static void expect_within(const std::vector<float>& ours, const std::vector<float>& theirs,
                              const std::vector<double>& bound, const char* what) {
        ASSERT_EQ(ours.size(), theirs.size()) << what;
        double worst = 0.0;
        for (std::size_t i = 0; i < ours.size(); ++i) {
            const double difference = std::abs(double{ours[i]} - theirs[i]);
            const double allowed = bound[i] + u / 2 * std::abs(theirs[i]) + 1e-30;
            worst = std::max(worst, difference / allowed);
            ASSERT_LE(difference, allowed)
                << what << " element " << i << ": " << ours[i] << " vs " << theirs[i];
        }
        std::printf("%s: the farthest element at %.2e of its bound\n", what, worst);
    }
    test::ReferenceFixture fixture_;
};

// RMSNorm: the sum of C squares is off by at most gamma_C = C u / (1 - C u) of itself (all terms
// positive), so rstd by gamma_C / 2 + 3u (division, square root, reciprocal); an output x s w by
// that plus 2u. Backward: dx = s (d w - x s m), m = mean(d w x s): each term is a product of at
// most four rounded factors (5u), m's sum of C terms is off by gamma_C of the sum of its terms'
// magnitudes, and s carries its own error into both: bounded by (C + 12) u of
// s (|d w| + |x s| mean(|d w x s|)). dweight sums N terms |d x s|: (N + 6) u of that sum.
TEST_F(BlockKernels, RmsNormWithAndWithoutAGainFollowsPyTorch) {
    const std::vector<float> x = f32("rms.inp"), w = f32("rms.weight"), d = f32("rms.dout");
    const int C = static_cast<int>(w.size());
    const int N = static_cast<int>(x.size()) / C;
    const double gamma = C * u / (1 - C * u);
    for (const bool gain : {true, false}) {
        const std::string name = gain ? "rms" : "rms_nogain";
        std::vector<float> out(x.size()), rstd(static_cast<std::size_t>(N));
        rmsnorm_forward(out.data(), rstd.data(), x.data(), gain ? w.data() : nullptr, N, C, 1e-5f,
                        C);
        std::vector<float> dx(x.size(), 0.0f), dw(w.size(), 0.0f);
        rmsnorm_backward(dx.data(), gain ? dw.data() : nullptr, d.data(), x.data(),
                         gain ? w.data() : nullptr, rstd.data(), N, C, C);
        std::vector<double> out_bound(x.size()), dx_bound(x.size()), dw_bound(w.size(), 0.0);
        for (int n = 0; n < N; ++n) {
            double mean_magnitude = 0.0;
            const double s = rstd[static_cast<std::size_t>(n)];
            for (int i = 0; i < C; ++i) {
                const std::size_t k = static_cast<std::size_t>(n * C + i);
                const double wi = gain ? w[static_cast<std::size_t>(i)] : 1.0;
                mean_magnitude += std::abs(d[k] * wi * x[k] * s) / C;
            }
            for (int i = 0; i < C; ++i) {
                const std::size_t k = static_cast<std::size_t>(n * C + i);
                const double wi = gain ? w[static_cast<std::size_t>(i)] : 1.0;
                out_bound[k] = (gamma / 2 + 5 * u) * std::abs(x[k] * s * wi);
                dx_bound[k] =
                    (C + 12) * u * s * (std::abs(d[k] * wi) + std::abs(x[k] * s) * mean_magnitude);
                dw_bound[static_cast<std::size_t>(i)] += (N + 6) * u * std::abs(d[k] * x[k] * s);
            }
        }
        expect_within(out, f32(name + ".out"), out_bound, (name + " forward").c_str());
        expect_within(dx, f32(name + ".dinp"), dx_bound, (name + " input gradient").c_str());
        if (gain) expect_within(dw, f32("rms.dweight"), dw_bound, "rms gain gradient");
    }
}

// Rotary positions: inv_freq = 1 / theta^(2i/hs) in fp32 is off by at most 3u of itself (pow,
// division, the exponent's rounding scaled by ln(theta) 2i/hs <= 9.3: 12u in all), so an angle
// p inv_freq by 13u of itself, cos and sin by that (their derivatives are at most 1) plus u; a
// rotated element x1 c - x2 s by |x1| + |x2| times that, plus 3u of its terms. The backward is
// the same rotation transposed.
TEST_F(BlockKernels, RotaryPositionsOnAGroupedQueryRowFollowHuggingFace) {
    const auto& dims = fixture_.at("rope.dims").i32;
    const int B = dims[0], T = dims[1], NH = dims[2], KVH = dims[3], hs = dims[4], first = dims[5];
    const float theta = fixture_.at("rope.theta").f32[0];
    const int W = NH * hs + 2 * KVH * hs;
    const int N = B * T;
    const RotaryTable table = rotary_table(first + T, hs, theta);
    for (const bool backward : {false, true}) {
        std::vector<float> x = f32(backward ? "rope.dout" : "rope.qkv");
        const std::vector<float> in = x;
        if (backward) {
            rotary_backward(x.data(), table, N, T, first, NH, hs, W);
            rotary_backward(x.data() + NH * hs, table, N, T, first, KVH, hs, W);
        } else {
            rotary_forward(x.data(), table, N, T, first, NH, hs, W);
            rotary_forward(x.data() + NH * hs, table, N, T, first, KVH, hs, W);
        }
        std::vector<double> bound(x.size(), 0.0);
        for (int n = 0; n < N; ++n) {
            const int p = first + n % T;
            for (int j = 0; j < (NH + KVH) * hs; ++j) {
                const int i = j % hs % (hs / 2);
                const double angle = p * std::pow(double{theta}, -2.0 * i / hs);
                const std::size_t k = static_cast<std::size_t>(n * W + j);
                const std::size_t head = static_cast<std::size_t>(n * W + j / hs * hs);
                const double pair = std::abs(in[head + static_cast<std::size_t>(i)]) +
                                    std::abs(in[head + static_cast<std::size_t>(i + hs / 2)]);
                bound[k] = (13 * u * angle + u) * pair + 3 * u * pair;
            }
        }
        expect_within(x, f32(backward ? "rope.dinp" : "rope.out"), bound,
                      backward ? "rotary backward" : "rotary forward");
    }
}

// SwiGLU: silu(g) = g / (1 + e^-g) with vexp's relative error under 2e-7 (3.4u), so sigmoid by
// 3.4u + 3u and out = silu(g) up by 9u of |silu(g) up|; the gate's gradient d up s (1 + g (1 - s))
// by 16u of |d up| s (1 + |g| (1 - s)) (s's error reaching it through 1 - s scaled by |g| s), the
// up's by 9u of |d silu(g)|. ReLU^2: one or two roundings.
TEST_F(BlockKernels, SwigluAndReluSquaredFollowPyTorch) {
    const std::vector<float> in = f32("swiglu.inp"), d = f32("swiglu.dout");
    const auto& dims = fixture_.at("swiglu.dout").dims;  // (N, H)
    const int N = static_cast<int>(dims[0]), H = static_cast<int>(dims[1]);
    std::vector<float> out(d.size()), dinp(in.size());
    swiglu_forward(out.data(), in.data(), N, H);
    swiglu_backward(dinp.data(), in.data(), d.data(), N, H);
    std::vector<double> out_bound(out.size()), dinp_bound(in.size());
    for (int n = 0; n < N; ++n) {
        for (int i = 0; i < H; ++i) {
            const std::size_t k = static_cast<std::size_t>(n * H + i);
            const std::size_t gk = static_cast<std::size_t>(n * 2 * H + i);
            const double g = in[gk], up = in[gk + static_cast<std::size_t>(H)];
            const double s = 1.0 / (1.0 + std::exp(-g));
            out_bound[k] = 9 * u * std::abs(g * s * up);
            dinp_bound[gk] = 16 * u * std::abs(d[k] * up) * s * (1 + std::abs(g) * (1 - s)) +
                             16 * u * std::abs(d[k] * up * g) * s * (1 - s);
            dinp_bound[gk + static_cast<std::size_t>(H)] = 9 * u * std::abs(d[k] * g * s);
        }
    }
    expect_within(out, f32("swiglu.out"), out_bound, "swiglu forward");
    expect_within(dinp, f32("swiglu.dinp"), dinp_bound, "swiglu backward");

    const std::vector<float> r = f32("relu2.inp"), dr = f32("relu2.dout");
    std::vector<float> rout(r.size()), rgrad(r.size());
    relu2_forward(rout.data(), r.data(), static_cast<int>(r.size()));
    relu2_backward(rgrad.data(), r.data(), dr.data(), static_cast<int>(r.size()));
    std::vector<double> rout_bound(r.size()), rgrad_bound(r.size());
    for (std::size_t i = 0; i < r.size(); ++i) {
        const double positive = std::max(0.0, double{r[i]});
        rout_bound[i] = u * positive * positive;
        rgrad_bound[i] = 2 * u * std::abs(2 * dr[i] * positive);
    }
    expect_within(rout, f32("relu2.out"), rout_bound, "relu2 forward");
    expect_within(rgrad, f32("relu2.dinp"), rgrad_bound, "relu2 backward");
}

}  // namespace
}  // namespace gpt2
