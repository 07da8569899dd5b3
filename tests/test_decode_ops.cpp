// The decoding kernels of ops/ against plain scalar loops in double: the matrix-vector products
// over fp32, bf16 and int8 rows (the dispatching overloads and the portable loop, at row counts
// and lengths that leave vector and four-row tails), one head's attention for a new token (fp32
// and bf16 caches) and for a prompt's rows, over lengths and head sizes that leave tails; and a
// prompt's products with compact rows: activations split into bf16/int8 pieces, the pieces'
// products (oneDNN, or its fallbacks) against the same double loop, and the int8 matmul exactly.
//
// Tolerances are worst-case rounding bounds, not fitted numbers: a float sum of K terms, in any
// order, is within (K - 1) u sum|term| of the exact one (u = 2^-24, Higham's bound, with products
// fused or rounded once more), so each result is allowed (K + 4) u (sum|terms| + |the additions|).
// A wrong kernel (a term skipped, a row or scale mixed up) is off by a whole term, ~1 here, which
// is thousands of times that bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/random.hpp"
#include "ops/bf16.hpp"
#include "ops/decode_attention.hpp"
#include "ops/decode_matvec.hpp"
#include "ops/prompt_products.hpp"
#include "test_support.hpp"

namespace gpt2 {
namespace {
using test::normal_vector;

constexpr double kUnitRoundoff = 0x1p-24;
// What the kernels must leave untouched (rows past n) or overwrite (y without accumulate).
constexpr float kGarbage = 777.0f;

double as_double(float w) {
    return w;
}
double as_double(Bf16 w) {
    return to_float(w);
}
double as_double(std::int8_t w) {
    return w;
}

// Weights of each format from normal floats: fp32 as they are, bf16 rounded, int8 spread over
// [-127, 127].
template <typename W>
std::vector<W> weights_from(const std::vector<float>& normal) {
    std::vector<W> w(normal.size());
    for (std::size_t i = 0; i < normal.size(); ++i) {
        if constexpr (std::is_same_v<W, float>) {
            w[i] = normal[i];
        } else if constexpr (std::is_same_v<W, Bf16>) {
            w[i] = to_bf16(normal[i]);
        } else {
            w[i] = static_cast<std::int8_t>(
                std::clamp(std::nearbyint(40.0f * normal[i]), -127.0f, 127.0f));
        }
    }
    return w;
}

// One matvec case: y_before holds n + 1 entries (the last must survive), the kernel's y after.
struct MatvecCase {
    int n;
    int K;
    bool with_bias;
    bool with_scales;
    bool accumulate;
};

// Checks y (n + 1 entries, after the kernel) against the double loop over the same inputs.
template <typename W>
::testing::AssertionResult matches_reference(const std::vector<float>& y,
                                             const std::vector<float>& y_before,
                                             const std::vector<float>& x, const std::vector<W>& w,
                                             const float* scales, const float* bias,
                                             const MatvecCase& mc) {
    for (int j = 0; j < mc.n; ++j) {
        double dot = 0.0, magnitude = 0.0;
        for (int k = 0; k < mc.K; ++k) {
            const double term = as_double(w[static_cast<std::size_t>(j) * mc.K + k]) * x[k];
            dot += term;
            magnitude += std::abs(term);
        }
        const double scale = scales != nullptr ? scales[j] : 1.0;
        const double base = (mc.accumulate ? y_before[j] : 0.0) + (bias != nullptr ? bias[j] : 0.0);
        const double expected = base + scale * dot;
        const double bound =
            (mc.K + 4) * kUnitRoundoff * (std::abs(scale) * magnitude + std::abs(base));
        if (!(std::abs(y[j] - expected) <= bound)) {
            return ::testing::AssertionFailure() << "row " << j << ": " << y[j] << " vs "
                                                 << expected << " (bound " << bound << ")";
        }
    }
    if (y[mc.n] != kGarbage) return ::testing::AssertionFailure() << "wrote past row n";
    return ::testing::AssertionSuccess();
}

// Row counts around the four-row blocks, lengths around the 16- and 32-wide vector loops.
std::vector<MatvecCase> matvec_cases() {
    std::vector<MatvecCase> cases;
    for (const int n : {1, 3, 4, 5, 13, 64}) {
        for (const int K : {1, 15, 16, 17, 31, 32, 33, 100, 257}) {
            cases.push_back({n, K, true, true, false});
            cases.push_back({n, K, false, false, true});
            cases.push_back({n, K, true, false, true});
        }
    }
    return cases;
}

// Runs `kernel(y, x, w, scales, bias, mc)` on every case and checks it against the reference;
// scales are passed only to kernels that take them (`scaled`).
template <typename W, typename Kernel>
void check_matvec(const Kernel& kernel, const std::string& name, bool scaled) {
    std::uint64_t seed = 1;
    for (const MatvecCase& mc : matvec_cases()) {
        const auto n = static_cast<std::size_t>(mc.n), K = static_cast<std::size_t>(mc.K);
        const std::vector<W> w = weights_from<W>(normal_vector(n * K, ++seed));
        const std::vector<float> x = normal_vector(K, ++seed);
        const std::vector<float> bias = normal_vector(n, ++seed);
        std::vector<float> scales = normal_vector(n, ++seed);
        for (float& s : scales)
            s = 0.01f + std::abs(s) * 0.02f;
        std::vector<float> y_before = normal_vector(n + 1, ++seed);
        if (!mc.accumulate) std::fill(y_before.begin(), y_before.end(), kGarbage);
        y_before[n] = kGarbage;
        std::vector<float> y = y_before;
        const float* s = scaled && mc.with_scales ? scales.data() : nullptr;
        const float* b = mc.with_bias ? bias.data() : nullptr;
        kernel(y.data(), x.data(), w.data(), s, b, mc);
        ASSERT_TRUE(matches_reference(y, y_before, x, w, s, b, mc))
            << name << " n=" << mc.n << " K=" << mc.K << " bias=" << mc.with_bias
            << " scales=" << mc.with_scales << " accumulate=" << mc.accumulate;
    }
}

TEST(DecodeMatvec, Fp32RowsMatchTheScalarLoop) {
    check_matvec<float>([](float* y, const float* x, const float* w, const float*, const float* b,
                           const MatvecCase& mc) { matvec(y, x, w, mc.n, mc.K, b, mc.accumulate); },
                        "fp32", false);
}

TEST(DecodeMatvec, Bf16RowsMatchTheScalarLoop) {
    check_matvec<Bf16>([](float* y, const float* x, const Bf16* w, const float*, const float* b,
                          const MatvecCase& mc) { matvec(y, x, w, mc.n, mc.K, b, mc.accumulate); },
                       "bf16", false);
}

TEST(DecodeMatvec, Int8RowsTimesTheirScalesMatchTheScalarLoop) {
    check_matvec<std::int8_t>(
        [](float* y, const float* x, const std::int8_t* w, const float* s, const float* b,
           MatvecCase mc) {
            // int8 rows always carry scales: the cases without get ones of 1.
            const std::vector<float> ones(static_cast<std::size_t>(mc.n), 1.0f);
            matvec(y, x, w, s != nullptr ? s : ones.data(), mc.n, mc.K, b, mc.accumulate);
        },
        "int8", true);
}

// The loop the overloads fall back to without AVX-512, checked on every machine.
TEST(DecodeMatvec, ThePortableLoopMatchesTheScalarLoopForEveryFormat) {
    const auto portable = [](auto* y, const float* x, const auto* w, const float* s, const float* b,
                             const MatvecCase& mc) {
        matvec_portable(y, x, w, s, mc.n, mc.K, b, mc.accumulate);
    };
    check_matvec<float>(portable, "portable fp32", true);
    check_matvec<Bf16>(portable, "portable bf16", true);
    check_matvec<std::int8_t>(portable, "portable int8", true);
}

// matvec_many gives every vector exactly matvec's bits (decoding several sequences at once must
// not change any of them), for 1 to 17 vectors (passes of eight and a remainder), row counts and
// lengths around the blocks and vector loops, with and without bias, scales and accumulation; the
// portable pair likewise. A product skipped or mixed up between vectors differs by a whole term.
template <typename W>
void check_matvec_many(bool portable) {
    std::uint64_t seed = 100;
    for (const int vectors : {1, 2, 3, 8, 9, 17}) {
        for (const int n : {1, 5, 16, 19, 40}) {
            for (const int K : {15, 32, 33, 100}) {
                const auto rows = static_cast<std::size_t>(n), cols = static_cast<std::size_t>(K);
                const std::vector<W> w = weights_from<W>(normal_vector(rows * cols, ++seed));
                const std::vector<float> bias = normal_vector(rows, ++seed);
                std::vector<float> scales = normal_vector(rows, ++seed);
                for (float& s : scales)
                    s = 0.01f + std::abs(s) * 0.02f;
                const bool accumulate = vectors % 2 == 1;
                const float* b = n % 2 == 1 ? bias.data() : nullptr;
                const float* sc = std::is_same_v<W, std::int8_t> ? scales.data() : nullptr;
                std::vector<std::vector<float>> xs, expected, ys;
                for (int v = 0; v < vectors; ++v) {
                    xs.push_back(normal_vector(cols, ++seed));
                    expected.push_back(normal_vector(rows, ++seed));
                    ys.push_back(expected.back());
                    float* y = expected.back().data();
                    if (portable) {
                        matvec_portable(y, xs.back().data(), w.data(), sc, n, K, b, accumulate);
                    } else if constexpr (std::is_same_v<W, std::int8_t>) {
                        matvec(y, xs.back().data(), w.data(), sc, n, K, b, accumulate);
                    } else {
                        matvec(y, xs.back().data(), w.data(), n, K, b, accumulate);
                    }
                }
                std::vector<float*> outputs;
                std::vector<const float*> inputs;
                for (int v = 0; v < vectors; ++v) {
                    outputs.push_back(ys[static_cast<std::size_t>(v)].data());
                    inputs.push_back(xs[static_cast<std::size_t>(v)].data());
                }
                if (portable) {
                    matvec_many_portable<W>(outputs, inputs, w.data(), sc, n, K, b, accumulate);
                } else if constexpr (std::is_same_v<W, std::int8_t>) {
                    matvec_many(outputs, inputs, w.data(), sc, n, K, b, accumulate);
                } else {
                    matvec_many(outputs, inputs, w.data(), n, K, b, accumulate);
                }
                for (int v = 0; v < vectors; ++v) {
                    ASSERT_EQ(ys[static_cast<std::size_t>(v)],
                              expected[static_cast<std::size_t>(v)])
                        << "vector " << v << " of " << vectors << ", n=" << n << " K=" << K
                        << (portable ? " (portable)" : "");
                }
            }
        }
    }
}

TEST(DecodeMatvec, ManyVectorsGetEachItsOwnProductsBits) {
    check_matvec_many<float>(false);
    check_matvec_many<Bf16>(false);
    check_matvec_many<std::int8_t>(false);
    check_matvec_many<float>(true);
    check_matvec_many<Bf16>(true);
    check_matvec_many<std::int8_t>(true);
}

// ---------------------------------------------------------------------------------------------
// attention

// One head's cache of maxT positions, `filled` of them with normal values and the rest NaN (a
// kernel that reads past the positions it may see returns NaN).
template <typename T>
struct HeadCacheCase {
    int hs;
    int maxT;
    std::vector<T> keys_t;  // (hs, maxT)
    std::vector<T> values;  // (maxT, hs)

    HeadCacheCase(int hs_, int maxT_, int filled, std::uint64_t seed)
        : hs(hs_),
          maxT(maxT_),
          keys_t(static_cast<std::size_t>(hs_) * maxT_),
          values(static_cast<std::size_t>(hs_) * maxT_) {
        const float nan = std::numeric_limits<float>::quiet_NaN();
        const std::vector<float> k = normal_vector(keys_t.size(), seed);
        const std::vector<float> v = normal_vector(values.size(), seed + 1);
        for (int d = 0; d < hs; ++d) {
            for (int p = 0; p < maxT; ++p) {
                const std::size_t kt = static_cast<std::size_t>(d) * maxT + p;
                const std::size_t vt = static_cast<std::size_t>(p) * hs + d;
                keys_t[kt] = element(p < filled ? k[kt] : nan);
                values[vt] = element(p < filled ? v[vt] : nan);
            }
        }
    }
    static T element(float f) {
        if constexpr (std::is_same_v<T, Bf16>) {
            return to_bf16(f);
        } else {
            return f;
        }
    }
    [[nodiscard]] double key(int position, int d) const {
        return as_double(keys_t[static_cast<std::size_t>(d) * maxT + position]);
    }
    [[nodiscard]] double value(int position, int d) const {
        return as_double(values[static_cast<std::size_t>(position) * hs + d]);
    }
};

// Checks out[0:hs] against softmax(q . keys[0:keys] / sqrt(hs)) @ values[0:keys] in double. The
// bound: a score is a dot of hs terms, off by at most d_s = (hs + 2) u sum|q_d k_d| / sqrt(hs);
// a probability is then off by at most 2 d_s relative, plus exp's 2e-7 twice and the rounding of
// a sum of `keys` positive terms, (keys + 3) u; the output, a sum of `keys` terms of total
// magnitude at most max|v|, adds keys u max|v|. Doubled for safety.
template <typename T>
::testing::AssertionResult attention_matches(const float* out, const float* q,
                                             const HeadCacheCase<T>& cache, int keys) {
    const int hs = cache.hs;
    const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
    std::vector<double> p(static_cast<std::size_t>(keys));
    double max_score_error = 0.0, max_value = 0.0, max_score = -1e300;
    for (int j = 0; j < keys; ++j) {
        double score = 0.0, magnitude = 0.0;
        for (int d = 0; d < hs; ++d) {
            score += q[d] * cache.key(j, d);
            magnitude += std::abs(q[d] * cache.key(j, d));
            max_value = std::max(max_value, std::abs(cache.value(j, d)));
        }
        p[static_cast<std::size_t>(j)] = score * scale;
        max_score = std::max(max_score, score * scale);
        max_score_error = std::max(max_score_error, (hs + 2) * kUnitRoundoff * magnitude * scale);
    }
    double sum = 0.0;
    for (double& pj : p) {
        pj = std::exp(pj - max_score);
        sum += pj;
    }
    const double bound =
        2.0 * (2.0 * max_score_error + 4e-7 + (2.0 * keys + 3.0) * kUnitRoundoff) * max_value;
    for (int d = 0; d < hs; ++d) {
        double expected = 0.0;
        for (int j = 0; j < keys; ++j)
            expected += p[static_cast<std::size_t>(j)] / sum * cache.value(j, d);
        if (!(std::abs(out[d] - expected) <= bound)) {
            return ::testing::AssertionFailure() << "d=" << d << ": " << out[d] << " vs "
                                                 << expected << " (bound " << bound << ")";
        }
    }
    return ::testing::AssertionSuccess();
}

// Head sizes around the vector widths (odd ones included), and cached lengths from one position
// to several hundred, each in a cache with room to spare.
template <typename T>
void check_one_query() {
    std::uint64_t seed = 100;
    for (const int hs : {1, 7, 16, 24, 64, 65}) {
        for (const int keys : {1, 2, 15, 16, 17, 33, 100, 257}) {
            const int maxT = keys + 7;
            const HeadCacheCase<T> cache(hs, maxT, keys, seed += 2);
            const std::vector<float> q = normal_vector(static_cast<std::size_t>(hs), ++seed);
            std::vector<float> scores(static_cast<std::size_t>(maxT), kGarbage);
            std::vector<float> out(static_cast<std::size_t>(hs) + 1, kGarbage);
            attend_one_query(out.data(), q.data(), cache.keys_t.data(), cache.values.data(),
                             scores.data(), keys - 1, hs, maxT);
            ASSERT_TRUE(attention_matches(out.data(), q.data(), cache, keys))
                << "hs=" << hs << " keys=" << keys;
            ASSERT_EQ(out[static_cast<std::size_t>(hs)], kGarbage) << "wrote past hs";
        }
    }
}

TEST(DecodeAttention, OneQueryAgainstAnFp32CacheMatchesTheScalarLoop) {
    check_one_query<float>();
}

TEST(DecodeAttention, OneQueryAgainstABf16CacheMatchesTheScalarLoop) {
    check_one_query<Bf16>();
}

// A prompt's M rows at positions pos0.. (rows C apart, the head at column offset `col`): row i
// sees the keys 0..pos0+i, in blocks of kPromptScoreRows rows (M below, at and above a block).
TEST(DecodeAttention, PromptRowsAreCausalAndMatchTheScalarLoop) {
    std::uint64_t seed = 500;
    for (const int hs : {7, 16, 64}) {
        for (const int pos0 : {0, 5}) {
            for (const int M : {2, 63, 64, 65, 140}) {
                const int C = 3 * hs, col = hs, maxT = pos0 + M + 3;
                const HeadCacheCase<float> cache(hs, maxT, pos0 + M, seed += 3);
                const std::vector<float> q =
                    normal_vector(static_cast<std::size_t>(M) * C, seed + 2);
                std::vector<float> scores(static_cast<std::size_t>(kPromptScoreRows) * maxT,
                                          kGarbage);
                std::vector<float> out(static_cast<std::size_t>(M) * C, kGarbage);
                attend_prompt_rows(out.data() + col, C, q.data() + col, C, cache.keys_t.data(),
                                   cache.values.data(), scores.data(), M, pos0, hs, maxT);
                for (int i = 0; i < M; ++i) {
                    const std::size_t row = static_cast<std::size_t>(i) * C;
                    ASSERT_TRUE(attention_matches(out.data() + row + col, q.data() + row + col,
                                                  cache, pos0 + i + 1))
                        << "hs=" << hs << " pos0=" << pos0 << " M=" << M << " row " << i;
                    // The other heads' columns are not written.
                    ASSERT_EQ(out[row], kGarbage);
                    ASSERT_EQ(out[row + 2 * static_cast<std::size_t>(hs)], kGarbage);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// prompt products

// Rows of activations for the splits: magnitudes spread over six orders (activations are not all
// alike), a zero row, and rows ldx = K + 3 apart with garbage between.
std::vector<float> activation_rows(int M, int K, std::uint64_t seed) {
    const int ldx = K + 3;
    std::vector<float> x = normal_vector(static_cast<std::size_t>(M) * ldx, seed);
    Rng rng(seed + 1);
    for (int i = 0; i < M; ++i) {
        const float row_scale = std::pow(10.0f, static_cast<float>(rng.below(7)) - 3.0f);
        for (int k = 0; k < ldx; ++k) {
            float& v = x[static_cast<std::size_t>(i) * ldx + k];
            v = k < K ? v * row_scale * std::pow(2.0f, static_cast<float>(rng.below(9)) - 4.0f)
                      : kGarbage;
        }
    }
    if (M > 2) std::fill_n(x.begin() + 2L * ldx, K, 0.0f);  // row 2: zeros
    return x;
}

// Splits rows [0, Mp) in two calls, as two workers would.
template <typename Split>
void split_in_two(const Split& split, int Mp) {
    split(0, Mp / 3);
    split(Mp / 3, Mp);
}

TEST(PromptProducts, Bf16PiecesSumToTheActivationsAndPadWithZeros) {
    for (const int K : {1, 17, 64}) {
        const int M = 5, Mp = 16, ldx = K + 3;
        std::vector<float> x = activation_rows(M, K, 40 + K);
        x[4L * ldx] = std::numeric_limits<float>::quiet_NaN();  // row 4: stays NaN
        const std::size_t count = static_cast<std::size_t>(kBf16Pieces) * Mp * K;
        std::vector<Bf16> pieces(count, to_bf16(kGarbage)), portable(count, to_bf16(kGarbage));
        split_in_two(
            [&](int i0, int i1) {
                split_into_bf16_pieces(pieces.data(), x.data(), ldx, M, Mp, K, i0, i1);
                split_into_bf16_pieces_portable(portable.data(), x.data(), ldx, M, Mp, K, i0, i1);
            },
            Mp);
        for (std::size_t e = 0; e < count; ++e) {
            ASSERT_EQ(static_cast<std::uint16_t>(pieces[e]),
                      static_cast<std::uint16_t>(portable[e]))
                << "K=" << K << ": the vector and portable splits differ at " << e;
        }
        ASSERT_TRUE(std::isnan(to_float(pieces[4L * K])));
        for (int i = 0; i < Mp; ++i) {
            for (int k = 0; k < K; ++k) {
                if (i == 4 && k == 0) continue;
                double sum = 0.0;
                for (int p = 0; p < kBf16Pieces; ++p)
                    sum += to_float(pieces[(static_cast<std::size_t>(p) * Mp + i) * K + k]);
                const double v = i < M ? x[static_cast<std::size_t>(i) * ldx + k] : 0.0;
                // Three pieces of 8 significant bits each: within 2^-24 |x|.
                ASSERT_LE(std::abs(sum - v), 0x1p-24 * std::abs(v))
                    << "K=" << K << " row " << i << " col " << k;
            }
        }
    }
}

TEST(PromptProducts, Int8PiecesSumToTheActivationsWithTheirRowScales) {
    for (const int K : {1, 17, 64, 300}) {
        const int M = 6, Mp = 16, ldx = K + 3;
        std::vector<float> x = activation_rows(M, K, 50 + K);
        x[3L * ldx + K / 2] = std::numeric_limits<float>::infinity();  // row 3
        x[4L * ldx] = std::numeric_limits<float>::quiet_NaN();         // row 4
        const std::size_t count = static_cast<std::size_t>(kInt8Pieces) * Mp * K;
        std::vector<std::int8_t> pieces(count, 99), portable(count, 99);
        std::vector<float> scales(static_cast<std::size_t>(kInt8Pieces) * Mp, kGarbage);
        std::vector<float> portable_scales = scales;
        split_in_two(
            [&](int i0, int i1) {
                split_into_int8_pieces(pieces.data(), scales.data(), x.data(), ldx, M, Mp, K, i0,
                                       i1);
                split_into_int8_pieces_portable(portable.data(), portable_scales.data(), x.data(),
                                                ldx, M, Mp, K, i0, i1);
            },
            Mp);
        ASSERT_EQ(pieces, portable) << "K=" << K << ": the vector and portable splits differ";
        for (std::size_t e = 0; e < scales.size(); ++e) {
            ASSERT_TRUE(scales[e] == portable_scales[e] ||
                        (std::isnan(scales[e]) && std::isnan(portable_scales[e])))
                << "scale " << e;
        }
        for (int i = 0; i < Mp; ++i) {
            const auto scale = [&](int p) { return scales[static_cast<std::size_t>(p) * Mp + i]; };
            const auto piece = [&](int p, int k) {
                return pieces[(static_cast<std::size_t>(p) * Mp + i) * K + k];
            };
            if (i == 3 || i == 4) {  // an infinity or a NaN: NaN scales, so NaN products
                for (int p = 0; p < kInt8Pieces; ++p)
                    ASSERT_TRUE(std::isnan(scale(p))) << "row " << i;
                continue;
            }
            double max_abs = 0.0;
            for (int k = 0; i < M && k < K; ++k)
                max_abs =
                    std::max(max_abs, std::abs(double{x[static_cast<std::size_t>(i) * ldx + k]}));
            // Each piece refines the last one's rounding error 254-fold: the first scale is the
            // row's largest magnitude over 127, the error left is half the last piece's step.
            ASSERT_FLOAT_EQ(scale(0), static_cast<float>(max_abs / 127.0)) << "row " << i;
            const double bound = 0.5 * scale(2) + 4 * kUnitRoundoff * max_abs;
            for (int k = 0; k < K; ++k) {
                double sum = 0.0;
                for (int p = 0; p < kInt8Pieces; ++p) {
                    ASSERT_LE(std::abs(piece(p, k)), 127) << "row " << i;
                    sum += static_cast<double>(scale(p)) * piece(p, k);
                }
                const double v = i < M ? x[static_cast<std::size_t>(i) * ldx + k] : 0.0;
                ASSERT_LE(std::abs(sum - v), bound) << "K=" << K << " row " << i << " col " << k;
                if (max_abs == 0.0) {
                    ASSERT_EQ(piece(0, k), 0) << "row " << i;
                }
            }
        }
    }
}

// M rows of activations times n weight rows through the pieces, against the double loop on the
// activations themselves: the splits' bounds above carried through a dot product, plus fp32
// rounding of the sums ((K + 8) u of the terms' magnitudes) and of the base.
template <typename W>
void check_pieces_product() {
    constexpr bool int8 = std::is_same_v<W, std::int8_t>;
    std::uint64_t seed = int8 ? 700 : 600;
    for (const int M : {2, 17}) {
        for (const int K : {1, 31, 64, 100}) {
            for (const int n : {1, 5, 33}) {
                for (const bool accumulate : {false, true}) {
                    const int Mp = (M + 15) / 16 * 16, ldx = K + 3, ldo = n + 2;
                    const std::vector<float> x = activation_rows(M, K, seed += 5);
                    const std::vector<W> w =
                        weights_from<W>(normal_vector(static_cast<std::size_t>(n) * K, seed + 1));
                    std::vector<float> row_scales =
                        normal_vector(static_cast<std::size_t>(n), seed + 2);
                    for (float& s : row_scales)
                        s = 0.01f + std::abs(s) * 0.02f;
                    const std::vector<float> bias =
                        normal_vector(static_cast<std::size_t>(n), seed + 3);
                    std::vector<float> out =
                        normal_vector(static_cast<std::size_t>(M) * ldo, seed + 4);
                    const std::vector<float> before = out;
                    constexpr int pieces_per_row = int8 ? kInt8Pieces : kBf16Pieces;
                    std::vector<W> pieces(static_cast<std::size_t>(pieces_per_row) * Mp * K);
                    std::vector<float> piece_scales(static_cast<std::size_t>(pieces_per_row) * Mp);
                    if constexpr (int8) {
                        split_into_int8_pieces(pieces.data(), piece_scales.data(), x.data(), ldx, M,
                                               Mp, K, 0, Mp);
                        std::vector<std::int32_t> scratch(static_cast<std::size_t>(pieces_per_row) *
                                                          Mp * n);
                        pieces_product(out.data(), ldo, pieces.data(), piece_scales.data(), M, Mp,
                                       K, w.data(), row_scales.data(), n, bias.data(), accumulate,
                                       scratch.data());
                    } else {
                        split_into_bf16_pieces(pieces.data(), x.data(), ldx, M, Mp, K, 0, Mp);
                        std::vector<float> scratch(static_cast<std::size_t>(pieces_per_row) * Mp *
                                                   n);
                        pieces_product(out.data(), ldo, pieces.data(), M, Mp, K, w.data(), n,
                                       bias.data(), accumulate, scratch.data());
                    }
                    for (int i = 0; i < M; ++i) {
                        double max_abs = 0.0;
                        for (int k = 0; k < K; ++k)
                            max_abs = std::max(
                                max_abs,
                                std::abs(double{x[static_cast<std::size_t>(i) * ldx + k]}));
                        for (int j = 0; j < ldo; ++j) {
                            const std::size_t at = static_cast<std::size_t>(i) * ldo + j;
                            if (j >= n) {
                                ASSERT_EQ(out[at], before[at]) << "wrote past column n";
                                continue;
                            }
                            double dot = 0.0, magnitude = 0.0, weights = 0.0;
                            for (int k = 0; k < K; ++k) {
                                const double wk = as_double(w[static_cast<std::size_t>(j) * K + k]);
                                const double term = wk * x[static_cast<std::size_t>(i) * ldx + k];
                                dot += term;
                                magnitude += std::abs(term);
                                weights += std::abs(wk);
                            }
                            const double scale =
                                int8 ? row_scales[static_cast<std::size_t>(j)] : 1.0;
                            const double base =
                                (accumulate ? before[at] : 0.0) + bias[static_cast<std::size_t>(j)];
                            const double expected = base + scale * dot;
                            // The pieces' own error: 2^-24 |x| per bf16 term; for int8 half the
                            // last piece's step per weight, max|x| / (127 * 254^2 * 2), and the
                            // float sums of the piece products (each of magnitude up to max|x|
                            // times the weights).
                            const double pieces_error = int8 ? (max_abs / (127.0 * 254 * 254 * 2) +
                                                                12 * kUnitRoundoff * max_abs) *
                                                                   weights
                                                             : 0x1p-24 * magnitude;
                            const double bound =
                                std::abs(scale) *
                                    (pieces_error + (K + 8) * kUnitRoundoff * magnitude) +
                                4 * kUnitRoundoff * (std::abs(base) + std::abs(expected));
                            ASSERT_LE(std::abs(out[at] - expected), bound)
                                << "M=" << M << " K=" << K << " n=" << n
                                << " accumulate=" << accumulate << " row " << i << " col " << j;
                        }
                    }
                }
            }
        }
    }
}

TEST(PromptProducts, Bf16PiecesTimesBf16RowsMatchTheDoubleLoop) {
    check_pieces_product<Bf16>();
}

TEST(PromptProducts, Int8PiecesTimesScaledInt8RowsMatchTheDoubleLoop) {
    check_pieces_product<std::int8_t>();
}

TEST(PromptProducts, TheInt8MatmulIsExact) {
    std::uint64_t seed = 900;
    for (const int M : {1, 16, 48}) {
        for (const int N : {1, 7, 64}) {
            for (const int K : {1, 63, 64, 300}) {
                const int lda = K + 5, ldb = K + 1, ldc = N + 3;
                const auto ints = [&](std::size_t count) {
                    std::vector<std::int8_t> v(count);
                    Rng rng(++seed);
                    for (auto& e : v)
                        e = static_cast<std::int8_t>(static_cast<int>(rng.below(255)) - 127);
                    return v;
                };
                const std::vector<std::int8_t> a = ints(static_cast<std::size_t>(M) * lda);
                const std::vector<std::int8_t> b = ints(static_cast<std::size_t>(N) * ldb);
                std::vector<std::int32_t> c(static_cast<std::size_t>(M) * ldc, -1);
                gemm_s8_nt(M, N, K, a.data(), lda, b.data(), ldb, c.data(), ldc);
                for (int i = 0; i < M; ++i) {
                    for (int j = 0; j < ldc; ++j) {
                        std::int32_t expected = -1;  // past column N: untouched
                        if (j < N) {
                            expected = 0;
                            for (int k = 0; k < K; ++k)
                                expected += a[static_cast<std::size_t>(i) * lda + k] *
                                            b[static_cast<std::size_t>(j) * ldb + k];
                        }
                        ASSERT_EQ(c[static_cast<std::size_t>(i) * ldc + j], expected)
                            << "M=" << M << " N=" << N << " K=" << K << " at " << i << "," << j;
                    }
                }
            }
        }
    }
}

}  // namespace
}  // namespace gpt2
