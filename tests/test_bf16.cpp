// bf16 conversion and the bf16 matrix products against an fp32 reference on the same rounded
// operands (a product of two bf16 numbers is exact in fp32, so only the summation order differs),
// and bf16 attention against the fp32 attention kernel.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "ops/attention.hpp"
#include "ops/bf16.hpp"
#include "ops/kernels.hpp"
#include "ops/lm_head.hpp"
#include "test_support.hpp"

namespace gpt2 {
namespace {

TEST(Bf16, RoundsToNearestEven) {
    EXPECT_EQ(to_float(to_bf16(1.0f)), 1.0f);
    EXPECT_EQ(to_float(to_bf16(-2.5f)), -2.5f);
    // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
    EXPECT_EQ(to_float(to_bf16(1.0f + 0x1p-8f)), 1.0f);
    // 1 + 3*2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: ties go to 1 + 2^-6.
    EXPECT_EQ(to_float(to_bf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
    // Just above the halfway point rounds up.
    EXPECT_EQ(to_float(to_bf16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);
    EXPECT_TRUE(std::isnan(to_float(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
    EXPECT_EQ(to_float(to_bf16(std::numeric_limits<float>::infinity())),
              std::numeric_limits<float>::infinity());
    // The largest finite float rounds to infinity in bf16, as in PyTorch.
    EXPECT_TRUE(std::isinf(to_float(to_bf16(std::numeric_limits<float>::max()))));
}

TEST(Bf16, ConvertsArraysBothWays) {
    std::vector<float> values{0.1f, -3.14159f, 1e-20f, 65504.0f, 0.0f, -0.0f, 7.0f};
    std::vector<Bf16> packed(values.size());
    std::vector<float> back(values.size());
    convert_to_bf16(packed.data(), values.data(), values.size());
    convert_to_float(back.data(), packed.data(), values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
        EXPECT_EQ(back[i], to_float(to_bf16(values[i])));
        EXPECT_NEAR(back[i], values[i], std::abs(values[i]) * 0x1p-8f) << i;
    }
    EXPECT_TRUE(std::signbit(back[5]));
}

// Every kind of float the rounding meets: ties either way, values just off a tie, subnormals,
// zeros of both signs, infinities, quiet and signalling NaNs, the largest finite values (which
// round to infinity) and random bit patterns.
std::vector<float> awkward_values(std::size_t random_count) {
    std::vector<std::uint32_t> bits{
        0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, 0x00000001u, 0x00008000u, 0x00018000u,
        0x807fffffu, 0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u,
        0x7f800001u, 0x7fbfffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x7f7f7fffu};
    std::mt19937 rng(44);
    for (std::size_t i = 0; i < random_count; ++i)
        bits.push_back(static_cast<std::uint32_t>(rng()));
    std::vector<float> values(bits.size());
    std::memcpy(values.data(), bits.data(), bits.size() * sizeof(float));
    return values;
}

TEST(Bf16, ConvertsTransposedExactlyAsToBf16) {
    const std::vector<float> pool = awkward_values(4000);
    // Shapes below, at and across the conversion's tiles, not multiples of them.
    for (const auto& [rows, cols] :
         std::array<std::pair<int, int>, 5>{{{1, 1}, {1, 70}, {33, 1}, {37, 45}, {64, 96}}}) {
        std::vector<float> in(static_cast<std::size_t>(rows) * cols);
        for (std::size_t i = 0; i < in.size(); ++i)
            in[i] = pool[(i * 7) % pool.size()];
        std::vector<Bf16> out(in.size(), static_cast<Bf16>(0x1234));
        convert_to_bf16_transposed(out.data(), in.data(), rows, cols);
        for (int r = 0; r < rows; ++r) {
            for (int c = 0; c < cols; ++c) {
                ASSERT_EQ(
                    static_cast<std::uint16_t>(out[static_cast<std::size_t>(c) * rows + r]),
                    static_cast<std::uint16_t>(to_bf16(in[static_cast<std::size_t>(r) * cols + c])))
                    << rows << "x" << cols << " at " << r << "," << c;
            }
        }
    }
}

// matmul_backward_bf16 against sums over the operands rounded as it rounds them: dinp = dout @ W,
// dweight += dout^T @ inp (accumulated onto what was there), dbias += the columns' sums of dout.
TEST(Bf16Gemm, MatmulBackwardMatchesAReferenceOnTheRoundedOperands) {
    constexpr int N = 37, C = 45, OC = 70;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const auto random = [&](std::size_t count) {
        std::vector<float> v(count);
        for (float& x : v)
            x = normal(rng);
        return v;
    };
    const std::vector<float> dout = random(N * OC), inp = random(N * C), weight = random(OC * C);
    std::vector<Bf16> weight_bf16(weight.size());
    convert_to_bf16(weight_bf16.data(), weight.data(), weight.size());
    std::vector<float> dinp(N * C, 99.0f), dweight = random(OC * C), dbias = random(OC);
    const std::vector<float> dweight0 = dweight, dbias0 = dbias;
    std::vector<Bf16> dout_scratch(N * OC), inp_scratch(N * C);
    matmul_backward_bf16(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                         weight_bf16.data(), dout_scratch.data(), inp_scratch.data(), N, C, OC);
    const auto rounded = [](float x) { return static_cast<double>(to_float(to_bf16(x))); };
    for (int n = 0; n < N; ++n) {
        for (int c = 0; c < C; ++c) {
            double expected = 0.0, magnitude = 0.0;
            for (int o = 0; o < OC; ++o) {
                const double p = rounded(dout[n * OC + o]) * to_float(weight_bf16[o * C + c]);
                expected += p;
                magnitude += std::abs(p);
            }
            ASSERT_NEAR(dinp[n * C + c], expected, 1e-5 * (magnitude + 1.0)) << n << "," << c;
        }
    }
    for (int o = 0; o < OC; ++o) {
        for (int c = 0; c < C; ++c) {
            double expected = dweight0[o * C + c], magnitude = std::abs(expected);
            for (int n = 0; n < N; ++n) {
                const double p = rounded(dout[n * OC + o]) * rounded(inp[n * C + c]);
                expected += p;
                magnitude += std::abs(p);
            }
            ASSERT_NEAR(dweight[o * C + c], expected, 1e-5 * (magnitude + 1.0)) << o << "," << c;
        }
        double sum = dbias0[o];
        for (int n = 0; n < N; ++n)
            sum += dout[n * OC + o];
        EXPECT_NEAR(dbias[o], sum, 1e-4 * (std::abs(sum) + 1.0)) << o;
    }
    // Without the input gradient (a layer whose input needs none) the weight gradient is the same,
    // bit for bit: the call rounds dout itself (its scratch here is fresh, all zeros).
    std::vector<float> dweight_alone = dweight0;
    std::vector<Bf16> fresh_dout(N * OC), fresh_inp(N * C);
    matmul_backward_bf16(nullptr, dweight_alone.data(), nullptr, dout.data(), inp.data(),
                         weight_bf16.data(), fresh_dout.data(), fresh_inp.data(), N, C, OC);
    EXPECT_EQ(dweight_alone, dweight);
}

struct Matrix {
    int rows, cols, ld;
    std::vector<Bf16> data;
    [[nodiscard]] float at(int r, int c) const {
        return to_float(data[static_cast<std::size_t>(r) * ld + c]);
    }
};

Matrix random_matrix(int rows, int cols, int ld, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    Matrix m{rows, cols, ld, std::vector<Bf16>(static_cast<std::size_t>(rows) * ld)};
    for (auto& v : m.data)
        v = to_bf16(normal(rng));
    return m;
}

enum class Kind { nt, nn, tn };

// One product of each layout against a double-precision loop over the same bf16 values.
void check_product(Kind kind, int M, int N, int K, bool accumulate) {
    std::mt19937 rng(static_cast<unsigned>(M * 131 + N * 7 + K + static_cast<int>(kind)));
    const int pad = 3;  // leading dimensions larger than the rows, as sub-matrices have
    const Matrix A =
        kind == Kind::tn ? random_matrix(K, M, M + pad, rng) : random_matrix(M, K, K + pad, rng);
    const Matrix B =
        kind == Kind::nt ? random_matrix(N, K, K + pad, rng) : random_matrix(K, N, N + pad, rng);
    const int ldc = N + pad;
    std::vector<float> C(static_cast<std::size_t>(M) * ldc, 0.5f);
    const std::vector<float> C0 = C;
    const float beta = accumulate ? 1.0f : 0.0f;
    switch (kind) {
        case Kind::nt:
            gemm_bf16_nt(M, N, K, A.data.data(), A.ld, B.data.data(), B.ld, beta, C.data(), ldc);
            break;
        case Kind::nn:
            gemm_bf16_nn(M, N, K, A.data.data(), A.ld, B.data.data(), B.ld, beta, C.data(), ldc);
            break;
        case Kind::tn:
            gemm_bf16_tn(M, N, K, A.data.data(), A.ld, B.data.data(), B.ld, beta, C.data(), ldc);
            break;
    }
    for (int i = 0; i < M; ++i) {
        for (int j = 0; j < ldc; ++j) {
            const std::size_t at = static_cast<std::size_t>(i) * ldc + j;
            if (j >= N) {  // outside the product: untouched
                ASSERT_EQ(C[at], C0[at]);
                continue;
            }
            double expected = accumulate ? C0[at] : 0.0;
            double magnitude = 0.0;
            for (int k = 0; k < K; ++k) {
                const double a = kind == Kind::tn ? A.at(k, i) : A.at(i, k);
                const double b = kind == Kind::nt ? B.at(j, k) : B.at(k, j);
                expected += a * b;
                magnitude += std::abs(a * b);
            }
            ASSERT_NEAR(C[at], expected, 1e-5 * (magnitude + 1.0))
                << "i=" << i << " j=" << j << " backend " << bf16_backend_name(bf16_backend());
        }
    }
}

TEST(Bf16Gemm, MatchesAReferenceOnTheSameRoundedOperands) {
    for (const Kind kind : {Kind::nt, Kind::nn, Kind::tn}) {
        for (const bool accumulate : {false, true}) {
            SCOPED_TRACE(::testing::Message()
                         << "layout " << static_cast<int>(kind) << " accumulate " << accumulate);
            check_product(kind, 37, 45, 64, accumulate);
            check_product(kind, 1, 130, 17, accumulate);
            check_product(kind, 64, 3, 200, accumulate);
        }
    }
}

// The nt product's extras against the same double-precision loop: a bias row added (fp32 results,
// and results rounded to bf16), and a scale. A rounded result is the exact sum rounded to bf16, so
// it may be off by half a bf16 unit (2^-8 of the value) on top of the fp32 sum's own error.
TEST(Bf16Gemm, BiasScaleAndRoundedResultsMatchAReference) {
    constexpr int M = 37, N = 45, K = 64, pad = 3, ldc = N + pad;
    std::mt19937 rng(5);
    const Matrix A = random_matrix(M, K, K + pad, rng);
    const Matrix B = random_matrix(N, K, K + pad, rng);
    std::vector<float> bias(N);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& b : bias)
        b = normal(rng);
    constexpr float alpha = 0.125f;
    std::vector<float> with_bias(static_cast<std::size_t>(M) * ldc, 0.5f), scaled = with_bias;
    std::vector<Bf16> rounded(static_cast<std::size_t>(M) * ldc, to_bf16(0.5f));
    gemm_bf16_nt_bias(M, N, K, A.data.data(), A.ld, B.data.data(), B.ld, bias.data(),
                      with_bias.data(), ldc);
    gemm_bf16_nt_bias_rounded(M, N, K, A.data.data(), A.ld, B.data.data(), B.ld, bias.data(),
                              rounded.data(), ldc);
    gemm_bf16_nt_scaled(M, N, K, alpha, A.data.data(), A.ld, B.data.data(), B.ld, scaled.data(),
                        ldc);
    for (int i = 0; i < M; ++i) {
        for (int j = 0; j < ldc; ++j) {
            const std::size_t at = static_cast<std::size_t>(i) * ldc + j;
            if (j >= N) {  // outside the product: untouched
                ASSERT_EQ(with_bias[at], 0.5f);
                ASSERT_EQ(scaled[at], 0.5f);
                ASSERT_EQ(to_float(rounded[at]), 0.5f);
                continue;
            }
            double sum = 0.0, magnitude = 0.0;
            for (int k = 0; k < K; ++k) {
                sum += static_cast<double>(A.at(i, k)) * B.at(j, k);
                magnitude += std::abs(static_cast<double>(A.at(i, k)) * B.at(j, k));
            }
            const double error = 1e-5 * (magnitude + std::abs(bias[j]) + 1.0);
            const double expected = sum + bias[j];
            ASSERT_NEAR(with_bias[at], expected, error) << i << " " << j;
            ASSERT_NEAR(to_float(rounded[at]), expected, error + std::ldexp(std::abs(expected), -8))
                << i << " " << j;
            ASSERT_NEAR(scaled[at], alpha * sum, alpha * error) << i << " " << j;
        }
    }
}

// The qkv product by heads: block j of the rounded results holds output columns [j * 64, j * 64 +
// 64) of the plain product's rows, rounded (within one bf16 unit of the fp32 product's value: the
// two products may sum in different orders), and round_qkv_by_heads lays an fp32 qkv out the same
// way, rounding as to_bf16 does.
TEST(Bf16Gemm, QkvByHeadsHoldsEachHeadsColumnsDense) {
    constexpr int N = 37, C = 128, NH = 2, hs = C / NH, OC = 3 * C;
    std::mt19937 rng(6);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> inp(static_cast<std::size_t>(N) * C),
        weight(static_cast<std::size_t>(OC) * C), bias(OC);
    for (float& v : inp)
        v = normal(rng);
    for (float& v : weight)
        v = 0.1f * normal(rng);
    for (float& v : bias)
        v = normal(rng);
    std::vector<Bf16> weight_bf16(weight.size()), scratch(inp.size());
    convert_to_bf16(weight_bf16.data(), weight.data(), weight.size());
    std::vector<float> plain(static_cast<std::size_t>(N) * OC);
    matmul_forward_bf16(plain.data(), nullptr, inp.data(), scratch.data(), weight_bf16.data(),
                        bias.data(), N, C, OC);
    std::vector<Bf16> by_heads(plain.size()), laid_out(plain.size());
    matmul_forward_bf16_by_blocks(by_heads.data(), inp.data(), scratch.data(), weight_bf16.data(),
                                  bias.data(), N, C, OC, hs);
    round_qkv_by_heads(laid_out.data(), plain.data(), N, C, NH);
    for (int block = 0; block < 3 * NH; ++block) {
        for (int n = 0; n < N; ++n) {
            for (int e = 0; e < hs; ++e) {
                const float value = plain[static_cast<std::size_t>(n) * OC + block * hs + e];
                const std::size_t at = (static_cast<std::size_t>(block) * N + n) * hs + e;
                ASSERT_EQ(laid_out[at], to_bf16(value)) << block << " " << n << " " << e;
                ASSERT_NEAR(to_float(by_heads[at]), value, std::ldexp(std::abs(value), -7))
                    << block << " " << n << " " << e;
            }
        }
    }
}

TEST(Bf16Gemm, NamesWhatItRunsOn) {
    const std::string name = bf16_backend_name(bf16_backend());
    EXPECT_FALSE(name.empty());
    const char* forced = std::getenv("GPT2_BF16_GEMM");
    if (forced != nullptr && std::string(forced) == "emulate") {
        EXPECT_EQ(bf16_backend(), Bf16Backend::Fp32Emulated);
        EXPECT_NE(name.find("emulation"), std::string::npos);
    }
}

// ---------------------------------------------------------------------------------------------
// bf16 attention against the fp32 kernel.
//
// Tolerance: the project's bf16 tolerance, 2e-2 relative in norm per tensor (test_model_reference,
// test_dropout). Each rounding to bf16 is within 2^-9 = 2e-3 relative; an output goes through at
// most three roundings in a chain (q and k -> scores -> P or dS -> product), whose errors add to
// about 6e-3 in the worst element and, averaging over a product's terms, well under that in norm
// (measured 4.3e-3 to 4.5e-3 here, AMX and emulated alike): 2e-2 leaves room without letting a
// wrong factor (an unscaled dk is 8x off, a missed panel or key is O(1) off) through.
constexpr double kBf16Tolerance = 2e-2;

struct AttentionRun {
    std::vector<float> out, lse, dqkv;
};

// One forward and backward of attention on (B, T, C) random q, k, v and output gradient, in fp32
// or bf16; the scratch starts out as garbage.
// `first_keys`: document masking's first key per query row (empty: none); `kv_heads`: key/value
// heads (0: NH), qkv then (B, T, C + 2 KV).
AttentionRun run_attention(bool bf16, int B, int T, int C, int NH, const DropoutMask& dropout,
                           std::span<const std::int32_t> first_keys = {}, int kv_heads = 0) {
    std::mt19937 rng(static_cast<unsigned>(B * 1000 + T * 10 + NH));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int W = C + 2 * (kv_heads == 0 ? NH : kv_heads) * (C / NH);
    std::vector<float> qkv(static_cast<std::size_t>(B) * T * W),
        dout(static_cast<std::size_t>(B) * T * C);
    for (float& v : qkv)
        v = normal(rng);
    for (float& v : dout)
        v = normal(rng);
    const int hs = C / NH;
    std::vector<float> scratch(attention_bf16_scratch_floats(T, hs), -7.0e20f);
    std::vector<Bf16> pieces(attention_bf16_scratch_pieces(T, hs), to_bf16(-7.0e20f));
    const AttentionBf16Scratch bf16_scratch{scratch.data(), pieces.data()};
    AttentionRun run{std::vector<float>(dout.size()),
                     std::vector<float>(static_cast<std::size_t>(B) * NH * T),
                     std::vector<float>(qkv.size(), -7.0e20f)};
    if (bf16) {  // q, k and v come rounded by heads, as the qkv product writes them
        std::vector<Bf16> qkv_bf16(qkv.size());
        round_qkv_by_heads(qkv_bf16.data(), qkv.data(), B * T, C, NH, kv_heads);
        attention_forward_bf16(run.out.data(), run.lse.data(), bf16_scratch, qkv_bf16.data(), B, T,
                               C, NH, dropout, first_keys, kv_heads);
        attention_backward_bf16(run.dqkv.data(), bf16_scratch, dout.data(), run.out.data(),
                                run.lse.data(), qkv_bf16.data(), B, T, C, NH, dropout, first_keys,
                                kv_heads);
    } else {
        attention_forward(run.out.data(), run.lse.data(), scratch.data(), qkv.data(), B, T, C, NH,
                          dropout, first_keys, kv_heads);
        attention_backward(run.dqkv.data(), scratch.data(), dout.data(), run.out.data(),
                           run.lse.data(), qkv.data(), B, T, C, NH, dropout, first_keys, kv_heads);
    }
    return run;
}

// Part `part` (0 q, 1 k, 2 v) of every row of a (B*T, C + 2 KV) gradient (KV = C: GPT-2's 3C).
std::vector<float> qkv_part(const std::vector<float>& dqkv, int C, int part, int KV = 0) {
    if (KV == 0) KV = C;
    const std::size_t W = static_cast<std::size_t>(C + 2 * KV);
    const int start = part == 0 ? 0 : C + (part - 1) * KV, width = part == 0 ? C : KV;
    std::vector<float> out;
    for (std::size_t row = 0; row < dqkv.size() / W; ++row) {
        const auto first = dqkv.begin() + static_cast<long>(row * W + start);
        out.insert(out.end(), first, first + width);
    }
    return out;
}

// The blocked bf16 LM head against double-precision sums over its rounded operands: three
// vocabulary blocks (the last partial, with padded columns), an ignored row, targets in every
// block. The losses' only error is the products' summation order (1e-5 of the magnitudes, as
// above, carried through the log-sum-exp). dlogits enter the backward products rounded to bf16,
// each within 2^-8 of its value, so dinp and dwte may differ from the unrounded sums by 2^-8 of
// the sum of the terms' magnitudes.
TEST(Bf16LmHead, MatchesADoubleReferenceOnTheRoundedOperands) {
    constexpr int R = 37, C = 45, V = 2 * kLmHeadVocabBlock + 52, Vp = 2 * kLmHeadVocabBlock + 64;
    constexpr float dloss = 0.25f;
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> inp(R * C), wte(static_cast<std::size_t>(Vp) * C, 0.0f);
    for (float& x : inp)
        x = normal(rng);
    for (std::size_t i = 0; i < static_cast<std::size_t>(V) * C; ++i)
        wte[i] = 0.5f * normal(rng);  // the padded rows stay 0, as the model's
    std::vector<Bf16> wte_bf16(wte.size());
    convert_to_bf16(wte_bf16.data(), wte.data(), wte.size());
    std::vector<std::int32_t> targets(R);
    for (int r = 0; r < R; ++r)
        targets[r] = static_cast<std::int32_t>((r * 977 + 13) % V);
    targets[3] = -1;
    targets[4] = V - 1;
    targets[5] = kLmHeadVocabBlock;

    std::vector<float> logits(lm_head_bf16_scratch_floats(R, Vp));
    std::vector<Bf16> pieces(lm_head_bf16_scratch_pieces(R, C));
    const LmHeadBf16Scratch scratch{logits.data(), logits.data() + static_cast<std::size_t>(R) * Vp,
                                    pieces.data(), pieces.data() + R * C};
    std::vector<float> losses(R, 99.0f), only_losses(R, 99.0f), dinp(R * C, 99.0f);
    std::vector<float> dwte(wte.size());
    for (float& x : dwte)
        x = normal(rng);
    const std::vector<float> dwte0 = dwte;
    lm_head_forward_backward_bf16(losses.data(), dinp.data(), dwte.data(), inp.data(),
                                  wte_bf16.data(), targets.data(), R, C, V, Vp, dloss, scratch);
    lm_head_loss_bf16(only_losses.data(), inp.data(), wte_bf16.data(), targets.data(), R, C, V, Vp,
                      scratch);

    const auto rounded = [](float x) { return static_cast<double>(to_float(to_bf16(x))); };
    std::vector<double> d(static_cast<std::size_t>(R) * Vp, 0.0);  // dlogits
    for (int r = 0; r < R; ++r) {
        EXPECT_EQ(only_losses[r], losses[r]) << r;
        std::vector<double> z(V);
        double magnitude = 0.0, maxz = -1e300;
        for (int v = 0; v < V; ++v) {
            double sum = 0.0, mag = 0.0;
            for (int c = 0; c < C; ++c) {
                const double p = rounded(inp[r * C + c]) * to_float(wte_bf16[v * C + c]);
                sum += p;
                mag += std::abs(p);
            }
            z[v] = sum;
            magnitude = std::max(magnitude, mag);
            maxz = std::max(maxz, sum);
        }
        if (targets[r] < 0) {
            EXPECT_EQ(losses[r], 0.0f);
            continue;
        }
        double total = 0.0;
        for (int v = 0; v < V; ++v)
            total += std::exp(z[v] - maxz);
        const double lse = maxz + std::log(total);
        EXPECT_NEAR(losses[r], lse - z[targets[r]], 1e-5 * (2 * magnitude + 1.0)) << r;
        for (int v = 0; v < V; ++v)
            d[static_cast<std::size_t>(r) * Vp + v] =
                (std::exp(z[v] - lse) - (v == targets[r] ? 1.0 : 0.0)) * dloss;
    }
    const double kRounding = 1.0 / 256;  // bf16's relative rounding error, at most 2^-8
    for (int r = 0; r < R; ++r) {
        for (int c = 0; c < C; ++c) {
            double expected = 0.0, magnitude = 0.0;
            for (int v = 0; v < Vp; ++v) {
                const double p =
                    d[static_cast<std::size_t>(r) * Vp + v] * to_float(wte_bf16[v * C + c]);
                expected += p;
                magnitude += std::abs(p);
            }
            ASSERT_NEAR(dinp[r * C + c], expected, kRounding * magnitude + 1e-6) << r << "," << c;
        }
    }
    for (int v = 0; v < Vp; ++v) {
        for (int c = 0; c < C; ++c) {
            const std::size_t at = static_cast<std::size_t>(v) * C + c;
            double expected = dwte0[at], magnitude = 0.0;
            for (int r = 0; r < R; ++r) {
                const double p = d[static_cast<std::size_t>(r) * Vp + v] * rounded(inp[r * C + c]);
                expected += p;
                magnitude += std::abs(p);
            }
            if (v >= V) {  // padded: no gradient
                ASSERT_EQ(dwte[at], dwte0[at]) << v << "," << c;
                continue;
            }
            ASSERT_NEAR(dwte[at], expected,
                        kRounding * magnitude + 1e-6 * (std::abs(expected) + 1.0))
                << v << "," << c;
        }
    }
}

// T = 130 (three panels, the last partial) with GPT-2's head size 64, two sequences; T = 200 with
// head size 32 (a scale that is not a power of two); with and without dropout of probabilities.
TEST(Bf16Attention, MatchesTheFp32KernelWithinBf16Tolerance) {
    for (const auto& [B, T, C, NH] : {std::array{2, 130, 128, 2}, std::array{1, 200, 96, 3}}) {
        for (const float rate : {0.0f, 0.2f}) {
            SCOPED_TRACE(::testing::Message()
                         << "T=" << T << " hs=" << C / NH << " dropout " << rate << " on "
                         << bf16_backend_name(bf16_backend()));
            const DropoutMask dropout{rate, 0x5eedULL, 3};
            const AttentionRun fp32 = run_attention(false, B, T, C, NH, dropout);
            const AttentionRun bf16 = run_attention(true, B, T, C, NH, dropout);
            EXPECT_TRUE(test::norm_close(bf16.out, fp32.out, kBf16Tolerance)) << "out";
            EXPECT_TRUE(test::norm_close(bf16.lse, fp32.lse, kBf16Tolerance)) << "lse";
            const char* names[] = {"dq", "dk", "dv"};
            for (int part = 0; part < 3; ++part) {
                EXPECT_TRUE(test::norm_close(qkv_part(bf16.dqkv, C, part),
                                             qkv_part(fp32.dqkv, C, part), kBf16Tolerance))
                    << names[part];
            }
            double worst = test::difference_norms(bf16.out, fp32.out).relative();
            for (int part = 0; part < 3; ++part) {
                worst = std::max(worst, test::difference_norms(qkv_part(bf16.dqkv, C, part),
                                                               qkv_part(fp32.dqkv, C, part))
                                            .relative());
            }
            std::printf("bf16 attention T=%d hs=%d dropout %.1f: worst relative error %.2e\n", T,
                        C / NH, static_cast<double>(rate), worst);
            // Measurably not fp32: the products really took bf16 operands.
            EXPECT_GT(test::difference_norms(bf16.out, fp32.out).relative(), 1e-5);
            EXPECT_GT(test::difference_norms(bf16.dqkv, fp32.dqkv).relative(), 1e-5);
        }
    }
}

// Document masking (--attention-within-documents) through the bf16 products: the panels skip the
// keys left of their earliest document and the keys no panel sees get dk = dv = 0, in the dense
// accumulators of the bf16 path as in dqkv for fp32. Documents begin at 40 and 100 in sequence 0
// (the panel of rows 64..127 starts at key 40, the last panel at key 100) and at 64, 65 (a
// one-token document) and 127 in sequence 1.
TEST(Bf16Attention, DocumentMaskingMatchesTheFp32KernelWithinBf16Tolerance) {
    const int B = 2, T = 130, C = 128, NH = 2;
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(B) * T, 1);
    for (const int start : {40, 100, T + 64, T + 65, T + 127})
        tokens[static_cast<std::size_t>(start)] = 0;
    std::vector<std::int32_t> first_keys(tokens.size());
    document_first_keys(first_keys, tokens, B, T, 0);
    for (const float rate : {0.0f, 0.2f}) {
        SCOPED_TRACE(::testing::Message()
                     << "dropout " << rate << " on " << bf16_backend_name(bf16_backend()));
        const DropoutMask dropout{rate, 0x5eedULL, 3};
        const AttentionRun fp32 = run_attention(false, B, T, C, NH, dropout, first_keys);
        const AttentionRun bf16 = run_attention(true, B, T, C, NH, dropout, first_keys);
        EXPECT_TRUE(test::norm_close(bf16.out, fp32.out, kBf16Tolerance)) << "out";
        EXPECT_TRUE(test::norm_close(bf16.lse, fp32.lse, kBf16Tolerance)) << "lse";
        const char* names[] = {"dq", "dk", "dv"};
        for (int part = 0; part < 3; ++part) {
            EXPECT_TRUE(test::norm_close(qkv_part(bf16.dqkv, C, part), qkv_part(fp32.dqkv, C, part),
                                         kBf16Tolerance))
                << names[part];
        }
        // Masking changes the result: the unmasked kernel is O(1) away.
        const AttentionRun unmasked = run_attention(true, B, T, C, NH, dropout);
        EXPECT_GT(test::difference_norms(unmasked.out, fp32.out).relative(), 0.1);
    }
}

// Grouped-query heads (the Llama family's): four query heads on two and on one key/value head,
// q, k and v by heads in (NH + 2 KVH) blocks; a key/value head's dk and dv sum its query heads'
// (a head's alone would be O(1) off), T = 130 over three panels, with and without dropout.
TEST(Bf16Attention, GroupedQueryHeadsMatchTheFp32KernelWithinBf16Tolerance) {
    const int B = 2, T = 130, C = 128, NH = 4;
    for (const int kv_heads : {2, 1}) {
        for (const float rate : {0.0f, 0.2f}) {
            SCOPED_TRACE(::testing::Message() << kv_heads << " key/value heads, dropout " << rate
                                              << " on " << bf16_backend_name(bf16_backend()));
            const DropoutMask dropout{rate, 0x5eedULL, 3};
            const AttentionRun fp32 = run_attention(false, B, T, C, NH, dropout, {}, kv_heads);
            const AttentionRun bf16 = run_attention(true, B, T, C, NH, dropout, {}, kv_heads);
            EXPECT_TRUE(test::norm_close(bf16.out, fp32.out, kBf16Tolerance)) << "out";
            EXPECT_TRUE(test::norm_close(bf16.lse, fp32.lse, kBf16Tolerance)) << "lse";
            const int KV = kv_heads * (C / NH);
            const char* names[] = {"dq", "dk", "dv"};
            for (int part = 0; part < 3; ++part) {
                EXPECT_TRUE(test::norm_close(qkv_part(bf16.dqkv, C, part, KV),
                                             qkv_part(fp32.dqkv, C, part, KV), kBf16Tolerance))
                    << names[part];
            }
            EXPECT_GT(test::difference_norms(bf16.dqkv, fp32.dqkv).relative(), 1e-5);
        }
    }
}

// Nothing the scratch held shows, and a second call gives the same bits.
TEST(Bf16Attention, IsBitwiseRepeatable) {
    const DropoutMask dropout{0.1f, 0xabcULL, 0};
    const AttentionRun first = run_attention(true, 1, 70, 128, 2, dropout);
    const AttentionRun second = run_attention(true, 1, 70, 128, 2, dropout);
    EXPECT_EQ(first.out, second.out);
    EXPECT_EQ(first.lse, second.lse);
    EXPECT_EQ(first.dqkv, second.dqkv);
}

}  // namespace
}  // namespace gpt2
