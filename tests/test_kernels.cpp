// Every backward kernel against central finite differences of its float forward kernel, plus the
// accumulate/overwrite conventions of ops/kernels.hpp, and flash attention against the kernel
// that stored its probabilities.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "attention_reference.hpp"
#include "core/random.hpp"
#include "ops/attention.hpp"
#include "ops/gemm.hpp"
#include "ops/kernels.hpp"
#include "ops/peak_flops.hpp"
#include "test_support.hpp"

namespace gpt2 {
namespace {

using test::all_close;
using test::normal_vector;

// What the parameter-gradient buffers hold before a backward call: backward must add to it.
constexpr float kPrefill = 0.25f;
// What overwritten input-gradient buffers hold before a backward call: it must not survive.
constexpr float kGarbage = 777.0f;

// L = sum(out * R), accumulated in double.
double weighted_sum(std::span<const float> out, std::span<const float> r) {
    double sum = 0.0;
    for (std::size_t i = 0; i < out.size(); ++i)
        sum += static_cast<double>(out[i]) * static_cast<double>(r[i]);
    return sum;
}

std::vector<float> minus(std::span<const float> a, float b) {
    std::vector<float> out(a.begin(), a.end());
    for (float& x : out)
        x -= b;
    return out;
}

// Checks `analytic` (the gradient of `objective` w.r.t. `x`) against central differences, at
// `indices` (every element when empty). `x` is perturbed in place and restored exactly. Passes when
// |analytic - numeric| <= atol + rtol * |numeric| for every element, where the absolute floor is
// atol_frac times the largest numeric gradient magnitude (never below 1e-6).
::testing::AssertionResult matches_finite_differences(std::span<const float> analytic,
                                                      std::vector<float>& x,
                                                      const std::function<double()>& objective,
                                                      std::vector<std::size_t> indices = {},
                                                      double rtol = 1e-2, double atol_frac = 1e-3) {
    if (analytic.size() != x.size()) {
        return ::testing::AssertionFailure()
               << "gradient size " << analytic.size() << " != input size " << x.size();
    }
    if (indices.empty()) {
        indices.resize(x.size());
        for (std::size_t i = 0; i < x.size(); ++i)
            indices[i] = i;
    }
    std::vector<double> numeric(indices.size());
    double scale = 0.0;
    for (std::size_t k = 0; k < indices.size(); ++k) {
        const std::size_t i = indices[k];
        const float x0 = x[i];
        const double h = 1e-3 * std::max(1.0, std::abs(static_cast<double>(x0)));
        const auto xp = static_cast<float>(x0 + h);
        const auto xm = static_cast<float>(x0 - h);
        x[i] = xp;
        const double lp = objective();
        x[i] = xm;
        const double lm = objective();
        x[i] = x0;
        // Divide by the step the float input really took.
        numeric[k] = (lp - lm) / (static_cast<double>(xp) - static_cast<double>(xm));
        scale = std::max(scale, std::abs(numeric[k]));
    }
    const double atol = std::max(1e-6, atol_frac * scale);
    std::size_t worst = 0;
    double worst_excess = -std::numeric_limits<double>::infinity();
    for (std::size_t k = 0; k < indices.size(); ++k) {
        const double a = analytic[indices[k]];
        const double excess = std::abs(a - numeric[k]) - (atol + rtol * std::abs(numeric[k]));
        if (!std::isfinite(a) || excess > worst_excess) {
            worst_excess = std::isfinite(a) ? excess : std::numeric_limits<double>::infinity();
            worst = k;
        }
    }
    if (worst_excess > 0.0) {
        return ::testing::AssertionFailure()
               << "worst element " << indices[worst] << " of " << x.size() << ": analytic "
               << analytic[indices[worst]] << " vs finite difference " << numeric[worst]
               << " (|diff| " << std::abs(analytic[indices[worst]] - numeric[worst]) << " > atol "
               << atol << " + rtol " << rtol << " * |fd|)";
    }
    return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------
// encoder

// The tests' main chose the kernels as the programs do (select_gemm_kernels): AVX-512 ones on a
// CPU with AVX-512 whatever OPENBLAS_CORETYPE was inherited, or the family asked for by name.
TEST(GemmKernels, TheTestsRunTheKernelsTheProgramsRun) {
    const std::string name = gemm_kernel_name();
    std::printf("OpenBLAS kernels: %s\n", name.c_str());
    if (const char* wanted = std::getenv("GPT2_OPENBLAS_CORETYPE")) {
        EXPECT_EQ(name, wanted);
    } else if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
        EXPECT_TRUE(name == "SkylakeX" || name == "Cooperlake" || name == "SapphireRapids") << name;
    } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        EXPECT_TRUE(name == "Haswell" || name == "Zen") << name;
    }
}

// A family OpenBLAS falls back to for a CPU it does not know (Prescott for an Intel Xeon of model
// 207) is replaced by the one the instructions call for; the right families are kept.
TEST(GemmKernels, TheCpusInstructionsDecideNotTheFamilyOpenBlasGuessed) {
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (!avx2) GTEST_SKIP() << "no AVX2: OpenBLAS's own choice stands";
    const std::string expected = avx512 ? "SkylakeX" : "Haswell";
    for (const char* guessed : {"Prescott", "Nehalem", "Sandybridge", "Core2"})
        EXPECT_EQ(std::string(kernels_for_this_cpu(guessed)), expected) << guessed;
    EXPECT_EQ(kernels_for_this_cpu(avx512 ? "SkylakeX" : "Haswell"), nullptr);
    EXPECT_EQ(kernels_for_this_cpu(avx512 ? "Cooperlake" : "Zen"), nullptr);
    if (avx512) {
        EXPECT_EQ(std::string(kernels_for_this_cpu("Haswell")), "SkylakeX");
    }
}

TEST(EncoderBackward, MatchesFiniteDifferencesAndAccumulates) {
    const int B = 2, T = 5, C = 8, V = 7;
    // Repeated tokens: their rows of dwte must collect several contributions.
    const std::vector<std::int32_t> tokens = {3, 1, 3, 0, 6, 1, 1, 5, 3, 2};
    std::vector<float> wte = normal_vector(static_cast<std::size_t>(V) * C, 1);
    std::vector<float> wpe = normal_vector(static_cast<std::size_t>(T) * C, 2);
    const std::vector<float> r = normal_vector(static_cast<std::size_t>(B) * T * C, 3);
    std::vector<float> out(r.size());
    const auto objective = [&] {
        encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
        return weighted_sum(out, r);
    };
    std::vector<float> dwte(wte.size(), kPrefill), dwpe(wpe.size(), kPrefill);
    encoder_backward(dwte.data(), dwpe.data(), r.data(), tokens.data(), B, T, C);
    EXPECT_TRUE(matches_finite_differences(minus(dwte, kPrefill), wte, objective));
    EXPECT_TRUE(matches_finite_differences(minus(dwpe, kPrefill), wpe, objective));
    // Token 4 never occurs: its row keeps exactly the prefill.
    for (int i = 0; i < C; ++i)
        EXPECT_EQ(dwte[4 * C + i], kPrefill);
}

// ---------------------------------------------------------------------------------------------
// layernorm

struct LayerNormCase {
    static constexpr int N = 6, C = 24;
    std::vector<float> inp = normal_vector(static_cast<std::size_t>(N) * C, 11, 2.0f, 0.7f);
    std::vector<float> weight = normal_vector(C, 12, 0.5f, 1.0f);
    std::vector<float> bias = normal_vector(C, 13, 0.3f);
    std::vector<float> r = normal_vector(static_cast<std::size_t>(N) * C, 14);
    std::vector<float> out = std::vector<float>(inp.size());
    std::vector<float> mean = std::vector<float>(N), rstd = std::vector<float>(N);

    double objective() {
        layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                          bias.data(), N, C);
        return weighted_sum(out, r);
    }
};

TEST(LayerNormBackward, MatchesFiniteDifferences) {
    LayerNormCase lc;
    lc.objective();  // mean and rstd for backward
    std::vector<float> dinp(lc.inp.size(), kPrefill);
    std::vector<float> dweight(lc.weight.size(), kPrefill), dbias(lc.bias.size(), kPrefill);
    layernorm_backward(dinp.data(), dweight.data(), dbias.data(), lc.r.data(), lc.inp.data(),
                       lc.weight.data(), lc.mean.data(), lc.rstd.data(), lc.N, lc.C);
    const auto objective = [&] { return lc.objective(); };
    EXPECT_TRUE(matches_finite_differences(minus(dinp, kPrefill), lc.inp, objective));
    EXPECT_TRUE(matches_finite_differences(minus(dweight, kPrefill), lc.weight, objective));
    EXPECT_TRUE(matches_finite_differences(minus(dbias, kPrefill), lc.bias, objective));
}

TEST(LayerNormBackward, AccumulatesIntoDinpAndParameterGradients) {
    LayerNormCase lc;
    lc.objective();
    const auto run = [&](float fill) {
        std::vector<float> d(lc.inp.size() + 2 * lc.C, fill);
        layernorm_backward(d.data(), d.data() + lc.inp.size(), d.data() + lc.inp.size() + lc.C,
                           lc.r.data(), lc.inp.data(), lc.weight.data(), lc.mean.data(),
                           lc.rstd.data(), lc.N, lc.C);
        return d;
    };
    const std::vector<float> from_zero = run(0.0f);
    const std::vector<float> from_prefill = run(kPrefill);
    EXPECT_TRUE(all_close(minus(from_prefill, kPrefill), from_zero, 1e-5, 1e-6));
    // And the gradient is not trivially zero, so the comparison above means something.
    EXPECT_GT(*std::max_element(from_zero.begin(), from_zero.end()), 0.1f);
}

// ---------------------------------------------------------------------------------------------
// matmul

struct MatmulCase {
    static constexpr int N = 9, C = 13, OC = 11;
    std::vector<float> inp = normal_vector(static_cast<std::size_t>(N) * C, 21);
    std::vector<float> weight = normal_vector(static_cast<std::size_t>(OC) * C, 22, 0.5f);
    std::vector<float> bias = normal_vector(OC, 23, 0.5f);
    std::vector<float> residual = normal_vector(static_cast<std::size_t>(N) * OC, 24);
    std::vector<float> r = normal_vector(static_cast<std::size_t>(N) * OC, 25);
    std::vector<float> out = std::vector<float>(r.size());

    double objective() {
        matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
        return weighted_sum(out, r);
    }
    double residual_objective() {
        matmul_residual_forward(out.data(), residual.data(), inp.data(), weight.data(), bias.data(),
                                N, C, OC);
        return weighted_sum(out, r);
    }
};

TEST(MatmulBackward, MatchesFiniteDifferences) {
    MatmulCase mc;
    std::vector<float> dinp(mc.inp.size(), kGarbage);
    std::vector<float> dweight(mc.weight.size(), kPrefill), dbias(mc.bias.size(), kPrefill);
    matmul_backward(dinp.data(), dweight.data(), dbias.data(), mc.r.data(), mc.inp.data(),
                    mc.weight.data(), mc.N, mc.C, mc.OC);
    const auto objective = [&] { return mc.objective(); };
    // dinp overwritten (the garbage is gone), dweight and dbias accumulated.
    EXPECT_TRUE(matches_finite_differences(dinp, mc.inp, objective));
    EXPECT_TRUE(matches_finite_differences(minus(dweight, kPrefill), mc.weight, objective));
    EXPECT_TRUE(matches_finite_differences(minus(dbias, kPrefill), mc.bias, objective));
}

TEST(MatmulBackward, OverwritesDinpAccumulatesParametersAndSkipsNulls) {
    MatmulCase mc;
    std::vector<float> dinp_a(mc.inp.size(), 0.0f), dinp_b(mc.inp.size(), kGarbage);
    std::vector<float> dw_a(mc.weight.size(), 0.0f), dw_b(mc.weight.size(), kPrefill);
    std::vector<float> db_a(mc.bias.size(), 0.0f), db_b(mc.bias.size(), kPrefill);
    matmul_backward(dinp_a.data(), dw_a.data(), db_a.data(), mc.r.data(), mc.inp.data(),
                    mc.weight.data(), mc.N, mc.C, mc.OC);
    matmul_backward(dinp_b.data(), dw_b.data(), db_b.data(), mc.r.data(), mc.inp.data(),
                    mc.weight.data(), mc.N, mc.C, mc.OC);
    EXPECT_TRUE(all_close(dinp_b, dinp_a, 1e-6, 1e-6));
    EXPECT_TRUE(all_close(minus(dw_b, kPrefill), dw_a, 1e-5, 1e-6));
    EXPECT_TRUE(all_close(minus(db_b, kPrefill), db_a, 1e-5, 1e-6));

    // Null dinp and dbias are skipped; dweight still accumulates (a second time: 2x).
    matmul_backward(nullptr, dw_a.data(), nullptr, mc.r.data(), mc.inp.data(), mc.weight.data(),
                    mc.N, mc.C, mc.OC);
    std::vector<float> twice(dw_b.size());
    for (std::size_t i = 0; i < twice.size(); ++i)
        twice[i] = 2.0f * (dw_b[i] - kPrefill);
    EXPECT_TRUE(all_close(dw_a, twice, 1e-5, 1e-5));
}

TEST(MatmulResidualForward, EqualsResidualPlusMatmulAndItsResidualGradientIsIdentity) {
    MatmulCase mc;
    mc.objective();
    const std::vector<float> plain = mc.out;
    mc.residual_objective();
    std::vector<float> expected(plain.size());
    for (std::size_t i = 0; i < plain.size(); ++i)
        expected[i] = plain[i] + mc.residual[i];
    EXPECT_TRUE(all_close(mc.out, expected, 1e-5, 1e-5));

    const auto objective = [&] { return mc.residual_objective(); };
    // d/dresidual of sum(out * R) is R itself: the block backward passes dout on unchanged.
    EXPECT_TRUE(matches_finite_differences(mc.r, mc.residual, objective));
    // The other inputs have matmul_backward's gradients.
    std::vector<float> dinp(mc.inp.size());
    std::vector<float> dweight(mc.weight.size()), dbias(mc.bias.size());
    matmul_backward(dinp.data(), dweight.data(), dbias.data(), mc.r.data(), mc.inp.data(),
                    mc.weight.data(), mc.N, mc.C, mc.OC);
    EXPECT_TRUE(matches_finite_differences(dinp, mc.inp, objective));
    EXPECT_TRUE(matches_finite_differences(dweight, mc.weight, objective));
    EXPECT_TRUE(matches_finite_differences(dbias, mc.bias, objective));
}

// ---------------------------------------------------------------------------------------------
// attention (flash style: ops/attention.hpp), against finite differences and against the kernel
// that stored the (T x T) probabilities (tests/attention_reference.hpp)

struct AttentionCase {
    int B, T, C, NH;
    std::vector<float> qkv, r, out, lse, scratch;
    AttentionCase(int b, int t, int c, int nh, std::uint64_t seed)
        : B(b),
          T(t),
          C(c),
          NH(nh),
          qkv(normal_vector(static_cast<std::size_t>(b) * t * 3 * c, seed)),
          r(normal_vector(static_cast<std::size_t>(b) * t * c, seed + 1)),
          out(r.size(), kGarbage),
          lse(static_cast<std::size_t>(b) * nh * t, kGarbage),
          scratch(attention_scratch_floats(t), kGarbage) {}

    double objective() {
        attention_forward(out.data(), lse.data(), scratch.data(), qkv.data(), B, T, C, NH);
        return weighted_sum(out, r);
    }
    std::vector<float> backward(float fill) {
        objective();
        std::vector<float> dqkv(qkv.size(), fill);
        std::fill(scratch.begin(), scratch.end(), kGarbage);
        attention_backward(dqkv.data(), scratch.data(), r.data(), out.data(), lse.data(),
                           qkv.data(), B, T, C, NH);
        return dqkv;
    }
};

// Every element of the rows around the panel edges and of the last rows, plus every 13th element
// elsewhere (keeps the finite differences fast).
std::vector<std::size_t> panel_edge_indices(const AttentionCase& ac) {
    const int C3 = 3 * ac.C;
    std::vector<std::size_t> indices;
    for (std::size_t i = 0; i < ac.qkv.size(); ++i) {
        const int t = static_cast<int>(i / C3) % ac.T;
        const bool edge = t <= 1 || (t % 64 >= 62 || t % 64 <= 1) || t >= ac.T - 4;
        if (edge || i % 13 == 0) indices.push_back(i);
    }
    return indices;
}

// T = 1 (a single key), T = 70 (two panels, the second partial, not a multiple of the panel),
// T = 130 with two sequences (three panels), head sizes 8 and 16.
TEST(AttentionBackward, MatchesFiniteDifferences) {
    for (const auto& [B, T, C, NH] : {std::array{1, 1, 16, 2}, std::array{1, 70, 16, 2},
                                      std::array{2, 130, 16, 2}, std::array{1, 70, 32, 4}}) {
        AttentionCase ac(B, T, C, NH, 31 + static_cast<std::uint64_t>(T));
        const std::vector<float> dqkv = ac.backward(kGarbage);
        EXPECT_TRUE(matches_finite_differences(
            dqkv, ac.qkv, [&] { return ac.objective(); }, panel_edge_indices(ac)))
            << "B=" << B << " T=" << T << " C=" << C << " NH=" << NH;
    }
}

TEST(AttentionBackward, OverwritesDqkvAndIsBitwiseRepeatable) {
    AttentionCase ac(2, 70, 16, 2, 51);
    const std::vector<float> first = ac.backward(kGarbage);
    const std::vector<float> second = ac.backward(0.0f);
    EXPECT_EQ(first, second);
}

// The same values as the kernel that stored every probability: the output, lse against the log
// of the stored softmax's normaliser, and dqkv; at T = 1, a T that is not a multiple of the
// panel, and T = 1024, for head sizes 16, 64 and 128.
TEST(Attention, MatchesTheStoredProbabilityKernel) {
    for (const auto& [B, T, C, NH] :
         {std::array{2, 1, 32, 2}, std::array{2, 100, 64, 4}, std::array{1, 200, 128, 2},
          std::array{1, 1024, 128, 2}, std::array{1, 129, 256, 2}}) {
        AttentionCase ac(B, T, C, NH, 81 + static_cast<std::uint64_t>(T));
        const std::vector<float> dqkv = ac.backward(kGarbage);
        std::vector<float> out(ac.out.size()), att(static_cast<std::size_t>(B) * NH * T * T);
        test::attention_forward(out.data(), att.data(), ac.qkv.data(), B, T, C, NH);
        std::vector<float> ref_dqkv(ac.qkv.size(), kGarbage);
        std::vector<float> ref_scratch(
            static_cast<std::size_t>(test::attention_backward_scratch_size(T)));
        test::attention_backward(ref_dqkv.data(), ref_scratch.data(), ac.r.data(), ac.qkv.data(),
                                 att.data(), B, T, C, NH);
        const std::string where = "T=" + std::to_string(T) + " hs=" + std::to_string(C / NH);
        EXPECT_TRUE(all_close(ac.out, out, 1e-5, 1e-6)) << where;
        EXPECT_TRUE(all_close(dqkv, ref_dqkv, 1e-4, 1e-5)) << where;
        // The stored probability of key 0 is exp(score_i0 - lse_i): recompute score_i0.
        const int hs = C / NH;
        double worst = 0.0;
        for (int b = 0; b < B; ++b) {
            for (int h = 0; h < NH; ++h) {
                for (int i = 0; i < T; ++i) {
                    const float* q =
                        ac.qkv.data() + (static_cast<long>(b) * T + i) * 3 * C + h * hs;
                    const float* k = ac.qkv.data() + static_cast<long>(b) * T * 3 * C + C + h * hs;
                    double score = 0.0;
                    for (int e = 0; e < hs; ++e)
                        score += static_cast<double>(q[e]) * k[e];
                    score /= std::sqrt(static_cast<double>(hs));
                    const double p0 = att[((static_cast<std::size_t>(b) * NH + h) * T + i) * T];
                    const double lse = ac.lse[(static_cast<std::size_t>(b) * NH + h) * T + i];
                    worst = std::max(worst, std::abs(std::log(p0) - (score - lse)));
                }
            }
        }
        EXPECT_LT(worst, 1e-4) << where;
    }
}

// Nothing the scratch held before a call shows in the results.
TEST(Attention, ResultsDoNotDependOnWhatTheScratchHeld) {
    AttentionCase a(1, 130, 16, 2, 91), b(1, 130, 16, 2, 91);
    std::fill(b.scratch.begin(), b.scratch.end(), -3.0e30f);
    a.objective();
    b.objective();
    EXPECT_EQ(a.out, b.out);
    EXPECT_EQ(a.lse, b.lse);
}

// Document masking: attention over a window of packed documents, each query row seeing keys
// from its document's first token, equals attention run on each document alone (out, lse and
// dqkv), with documents that cross the 64-row panels, start mid-panel or at a panel's first row,
// hold one token, and fill a whole sequence.
TEST(Attention, DocumentMaskingEqualsEachDocumentAlone) {
    const int B = 2, T = 150, C = 32, NH = 2;
    // Each sequence's document starts (its first token always starts one).
    const std::vector<std::vector<int>> starts = {{0, 37, 64, 65, 100, 149}, {0}};
    AttentionCase ac(B, T, C, NH, 97);
    std::vector<std::int32_t> first_keys(static_cast<std::size_t>(B) * T);
    for (int b = 0; b < B; ++b) {
        for (int t = 0; t < T; ++t) {
            int first = 0;
            for (const int s : starts[static_cast<std::size_t>(b)])
                first = s <= t ? s : first;
            first_keys[static_cast<std::size_t>(b) * T + t] = first;
        }
    }
    attention_forward(ac.out.data(), ac.lse.data(), ac.scratch.data(), ac.qkv.data(), B, T, C, NH,
                      {}, first_keys);
    std::vector<float> dqkv(ac.qkv.size(), kGarbage);
    attention_backward(dqkv.data(), ac.scratch.data(), ac.r.data(), ac.out.data(), ac.lse.data(),
                       ac.qkv.data(), B, T, C, NH, {}, first_keys);

    const std::size_t C3 = 3 * C;
    for (int b = 0; b < B; ++b) {
        std::vector<int> bounds = starts[static_cast<std::size_t>(b)];
        bounds.push_back(T);
        for (std::size_t d = 0; d + 1 < bounds.size(); ++d) {
            const int s = bounds[d], n = bounds[d + 1] - s;
            const std::size_t row0 = static_cast<std::size_t>(b) * T + static_cast<std::size_t>(s);
            const auto rows = [&](const std::vector<float>& x, std::size_t width) {
                return std::vector<float>(x.begin() + static_cast<long>(row0 * width),
                                          x.begin() + static_cast<long>((row0 + n) * width));
            };
            const std::vector<float> qkv = rows(ac.qkv, C3), dout = rows(ac.r, C);
            std::vector<float> out(dout.size()), lse(static_cast<std::size_t>(NH) * n),
                scratch(attention_scratch_floats(n)), alone(qkv.size());
            attention_forward(out.data(), lse.data(), scratch.data(), qkv.data(), 1, n, C, NH);
            attention_backward(alone.data(), scratch.data(), dout.data(), out.data(), lse.data(),
                               qkv.data(), 1, n, C, NH);
            std::vector<float> masked_lse;
            for (int h = 0; h < NH; ++h) {
                const auto at = ac.lse.begin() + (static_cast<long>(b) * NH + h) * T + s;
                masked_lse.insert(masked_lse.end(), at, at + n);
            }
            const std::string where = "sequence " + std::to_string(b) + ", document at " +
                                      std::to_string(s) + " of " + std::to_string(n) + " tokens";
            EXPECT_TRUE(all_close(rows(ac.out, C), out, 1e-5, 1e-6)) << where;
            EXPECT_TRUE(all_close(masked_lse, lse, 1e-5, 1e-6)) << where;
            EXPECT_TRUE(all_close(rows(dqkv, C3), alone, 1e-4, 1e-5)) << where;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// GELU

TEST(GeluBackward, MatchesFiniteDifferencesAndMayAliasDout) {
    const int N = 80;
    std::vector<float> inp(N);
    for (int i = 0; i < N; ++i)
        inp[i] = -5.0f + 10.0f * static_cast<float>(i) / (N - 1) + 0.01f;  // avoid exact 0
    const std::vector<float> r = normal_vector(N, 81);
    std::vector<float> out(N);
    std::vector<float> dinp(N, kGarbage);
    gelu_backward(dinp.data(), inp.data(), r.data(), N);
    EXPECT_TRUE(matches_finite_differences(dinp, inp, [&] {
        gelu_forward(out.data(), inp.data(), N);
        return weighted_sum(out, r);
    }));
    std::vector<float> in_place = r;
    gelu_backward(in_place.data(), inp.data(), in_place.data(), N);
    EXPECT_TRUE(all_close(in_place, dinp, 0.0, 0.0));
}

// ---------------------------------------------------------------------------------------------
// cross-entropy

TEST(CrossEntropyForwardBackward, MatchesFiniteDifferencesAndIgnoresPadding) {
    const int R = 5, V = 37, Vp = 64;
    const float dloss = 0.37f;
    const std::vector<std::int32_t> targets = {0, 36, 17, 5, 17};
    std::vector<float> logits = normal_vector(static_cast<std::size_t>(R) * Vp, 91, 2.0f);
    // Huge padded logits: if they were read, they would dominate the softmax.
    for (int r = 0; r < R; ++r)
        for (int j = V; j < Vp; ++j)
            logits[static_cast<std::size_t>(r) * Vp + j] = 1.0e4f;

    // Loss in double over the first V columns only.
    std::vector<float> expected_losses(R);
    for (int r = 0; r < R; ++r) {
        const float* row = logits.data() + static_cast<std::size_t>(r) * Vp;
        double sum = 0.0;
        for (int j = 0; j < V; ++j)
            sum += std::exp(static_cast<double>(row[j]));
        expected_losses[r] = static_cast<float>(std::log(sum) - row[targets[r]]);
    }

    std::vector<float> losses(R);
    const auto objective = [&] {
        cross_entropy_forward(losses.data(), logits.data(), targets.data(), R, V, Vp);
        double sum = 0.0;
        for (const float l : losses)
            sum += static_cast<double>(dloss) * l;
        return sum;
    };
    objective();
    const std::vector<float> forward_losses = losses;
    EXPECT_TRUE(all_close(forward_losses, expected_losses, 1e-5, 1e-5));

    std::vector<float> dlogits = logits;
    std::vector<float> fused_losses(R);
    cross_entropy_forward_backward(fused_losses.data(), dlogits.data(), targets.data(), R, V, Vp,
                                   dloss);
    EXPECT_TRUE(all_close(fused_losses, expected_losses, 1e-5, 1e-5));

    // Padded columns: exactly zero gradient. Real columns: finite differences.
    std::vector<std::size_t> real_columns;
    for (int r = 0; r < R; ++r) {
        for (int j = 0; j < Vp; ++j) {
            const std::size_t i = static_cast<std::size_t>(r) * Vp + j;
            if (j < V) {
                real_columns.push_back(i);
            } else {
                EXPECT_EQ(dlogits[i], 0.0f) << "row " << r << " padded column " << j;
            }
        }
    }
    EXPECT_TRUE(matches_finite_differences(dlogits, logits, objective, real_columns));
    // Each row's gradient sums to zero (softmax minus one-hot).
    for (int r = 0; r < R; ++r) {
        double sum = 0.0;
        for (int j = 0; j < V; ++j)
            sum += dlogits[static_cast<std::size_t>(r) * Vp + j];
        EXPECT_NEAR(sum, 0.0, 1e-6) << "row " << r;
    }

    // Changing the padded logits changes neither loss.
    std::vector<float> other = logits;
    for (int r = 0; r < R; ++r)
        for (int j = V; j < Vp; ++j)
            other[static_cast<std::size_t>(r) * Vp + j] = -3.0f;
    std::vector<float> other_losses(R), other_fused(R);
    cross_entropy_forward(other_losses.data(), other.data(), targets.data(), R, V, Vp);
    cross_entropy_forward_backward(other_fused.data(), other.data(), targets.data(), R, V, Vp,
                                   dloss);
    EXPECT_TRUE(all_close(other_losses, forward_losses, 0.0, 0.0));
    EXPECT_TRUE(all_close(other_fused, fused_losses, 0.0, 0.0));
    EXPECT_TRUE(all_close(other, dlogits, 0.0, 0.0));
}

// ---------------------------------------------------------------------------------------------
// the MFU yardstick

TEST(FmaPeak, MeasuresAFiniteRateWithTheGemmKernelsInstructions) {
    const FmaPeak peak = measure_fma_peak();
    EXPECT_TRUE(std::isfinite(peak.gflops));
    EXPECT_GT(peak.gflops, 0.0);
    const std::string isa = peak.isa;
    EXPECT_TRUE(isa == "AVX-512 FMA" || isa == "AVX2 FMA" || isa == "SSE") << isa;
}

// AVX512_BF16's dot-product peak: a rate exactly where the CPU has the instructions, 0 elsewhere.
// The bounds only catch a miscounted or empty loop: a dot product does twice an FMA's work per
// lane, so issuing at a quarter to four times the FMAs' rate gives 0.5x-8x (a Sapphire Rapids:
// 0.48x, half an instruction per cycle against the FMAs' two; hence 0.1x below).
TEST(FmaPeak, TheBf16DotProductPeakIsMeasuredExactlyWhereTheCpuHasAvx512Bf16) {
    const double dot = measure_bf16_dot_peak();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bf16")) {
        EXPECT_EQ(dot, 0.0);
        return;
    }
    EXPECT_TRUE(std::isfinite(dot));
    const FmaPeak fma = measure_fma_peak();
    EXPECT_GT(dot, 0.1 * fma.gflops);
    EXPECT_LT(dot, 8.0 * fma.gflops);
}

}  // namespace
}  // namespace gpt2
