// The layers of the families after GPT-2 (ops/block_kernels.hpp) against PyTorch in float64
// (tests/data/block_kernels_reference.bin, dev/make_reference.py): RMSNorm with and without a
// gain, rotary positions on a grouped-query qkv row, SwiGLU and ReLU^2, forward and backward, each
// element within a bound derived from the fp32 arithmetic it does (u = 2^-24; the reference's own
// rounding to fp32 adds u/2 of it); and grouped-query attention (ops/attention.hpp) against
// multi-head attention with repeated keys and values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "ops/attention.hpp"
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

namespace gpt2 {
namespace {

// Grouped-query attention against multi-head attention on the same queries with each key/value
// head repeated for its group (what Hugging Face's repeat_kv does): the forward's products read
// the same numbers, so out and lse are the same bits, as is dq; a key/value head's dk and dv are
// its query heads' sums. Those the kernel accumulates panel by panel over the group's heads; the
// check adds the multi-head ones up in fp32, so the two differ only in the order of the same 2g
// terms (g heads, two panels of query rows each: T = 100), each within gamma_2g of the sum of the
// terms' magnitudes, which the test gets by running the multi-head backward on one panel's rows
// of dout at a time (the other rows' contributions are exact zeros). With and without document
// masking.
TEST(GroupedQueryAttention, EqualsMultiHeadAttentionWithRepeatedKeysAndValues) {
    constexpr int B = 2, T = 100, NH = 4, hs = 8, C = NH * hs;
    std::mt19937 rng(61);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (const int KVH : {2, 1}) {
        for (const bool masked : {false, true}) {
            const int group = NH / KVH, KV = KVH * hs, W = C + 2 * KV, N = B * T;
            std::vector<float> gqa(static_cast<std::size_t>(N) * W), mha(3 * C * std::size_t{N});
            for (float& v : gqa)
                v = normal(rng);
            for (int n = 0; n < N; ++n) {
                for (int h = 0; h < NH; ++h) {
                    for (int e = 0; e < hs; ++e) {
                        const auto m = static_cast<std::size_t>(n) * 3 * C + h * hs + e;
                        const auto g = static_cast<std::size_t>(n) * W;
                        mha[m] = gqa[g + h * hs + e];
                        mha[m + C] = gqa[g + C + (h / group) * hs + e];
                        mha[m + 2 * C] = gqa[g + C + KV + (h / group) * hs + e];
                    }
                }
            }
            std::vector<std::int32_t> first_keys;
            if (masked) {
                for (int b = 0; b < B; ++b)
                    for (int t = 0; t < T; ++t)
                        first_keys.push_back(t < 30 ? 0 : t < 77 ? 30 : 77);
            }
            std::vector<float> scratch(attention_scratch_floats(T));
            std::vector<float> out_g(N * C), lse_g(B * NH * T), out_m(N * C), lse_m(B * NH * T);
            attention_forward(out_g.data(), lse_g.data(), scratch.data(), gqa.data(), B, T, C, NH,
                              {}, first_keys, KVH);
            attention_forward(out_m.data(), lse_m.data(), scratch.data(), mha.data(), B, T, C, NH,
                              {}, first_keys);
            EXPECT_EQ(out_g, out_m) << KVH << " kv heads";
            EXPECT_EQ(lse_g, lse_m) << KVH << " kv heads";
            std::vector<float> dout(N * C);
            for (float& v : dout)
                v = normal(rng);
            std::vector<float> d_g(gqa.size()), d_m(mha.size());
            attention_backward(d_g.data(), scratch.data(), dout.data(), out_g.data(), lse_g.data(),
                               gqa.data(), B, T, C, NH, {}, first_keys, KVH);
            attention_backward(d_m.data(), scratch.data(), dout.data(), out_m.data(), lse_m.data(),
                               mha.data(), B, T, C, NH, {}, first_keys);
            // The magnitudes of each panel's terms: dout on one panel's rows only.
            std::vector<float> magnitude(mha.size(), 0.0f), d_panel(mha.size());
            for (const auto& [i0, i1] : {std::pair{0, 64}, std::pair{64, T}}) {
                std::vector<float> part(dout.size(), 0.0f);
                for (int b = 0; b < B; ++b)
                    for (int t = i0; t < i1; ++t)
                        for (int c = 0; c < C; ++c) {
                            const auto at = (static_cast<std::size_t>(b) * T + t) * C + c;
                            part[at] = dout[at];
                        }
                attention_backward(d_panel.data(), scratch.data(), part.data(), out_m.data(),
                                   lse_m.data(), mha.data(), B, T, C, NH, {}, first_keys);
                for (std::size_t i = 0; i < magnitude.size(); ++i)
                    magnitude[i] += std::abs(d_panel[i]);
            }
            const double gamma = 2 * group * u / (1 - 2 * group * u);
            double worst = 0.0;
            for (int n = 0; n < N; ++n) {
                const auto g = static_cast<std::size_t>(n) * W;
                const auto m = static_cast<std::size_t>(n) * 3 * C;
                for (int h = 0; h < NH; ++h)
                    for (int e = 0; e < hs; ++e)
                        ASSERT_EQ(d_g[g + h * hs + e], d_m[m + h * hs + e]) << "dq";
                for (int kvh = 0; kvh < KVH; ++kvh) {
                    for (int part = 1; part <= 2; ++part) {  // k, then v
                        for (int e = 0; e < hs; ++e) {
                            float sum = 0.0f;
                            double bound = 0.0;
                            for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
                                sum += d_m[m + part * C + h * hs + e];
                                bound += magnitude[m + part * C + h * hs + e];
                            }
                            const float ours = d_g[g + C + (part - 1) * KV + kvh * hs + e];
                            const double allowed = 2 * gamma * bound + 1e-30;
                            worst = std::max(worst, std::abs(ours - sum) / allowed);
                            ASSERT_LE(std::abs(ours - sum), allowed)
                                << KVH << " kv heads, row " << n << (part == 1 ? " dk" : " dv");
                        }
                    }
                }
            }
            std::printf("grouped-query attention, %d kv heads%s: dk and dv at %.2e of the bound\n",
                        KVH, masked ? ", masked" : "", worst);
        }
    }
}

}  // namespace
}  // namespace gpt2
