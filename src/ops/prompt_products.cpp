#include "ops/prompt_products.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#endif

namespace gpt2 {

namespace {

// Each int8 piece after the first is scaled to the previous one's rounding error, at most half
// its step: 254 steps of the next piece span one step of the last.
constexpr float kInt8Refinement = 254.0f;
// Rows whose largest magnitude is below this split into zeros (2^-100).
constexpr float kSmallestSplitRow = 7.8886091e-31f;

// v rounded to an integer in [-127, 127] (v is finite: rows with an infinity or NaN are not split).
// Plain min/max so that the loops around it vectorise.
inline float round_to_int8_grid(float v) {
    const float r = std::nearbyint(v);
    const float low = r < -127.0f ? -127.0f : r;
    return low > 127.0f ? 127.0f : low;
}

// The largest magnitude in x[0:K], or a NaN when x holds an infinity or NaN. Computed on the bits:
// the magnitudes of finite floats order as their bit patterns do, and every infinity or NaN
// pattern is above them all, so one integer maximum (which vectorises) finds both.
inline float largest_magnitude(const float* x, int K) {
    std::uint32_t largest = 0;
    for (int k = 0; k < K; ++k) {
        std::uint32_t bits;
        std::memcpy(&bits, x + k, sizeof(bits));
        bits &= 0x7fffffffu;
        largest = largest < bits ? bits : largest;
    }
    if (largest >= 0x7f800000u) return std::nanf("");
    float magnitude;
    std::memcpy(&magnitude, &largest, sizeof(magnitude));
    return magnitude;
}

// What a product's result is added to: the output itself when accumulating, and the bias.
inline float base_of(const float* out, int j, const float* bias, bool accumulate) {
    return (accumulate ? out[j] : 0.0f) + (bias != nullptr ? bias[j] : 0.0f);
}

// One row's pieces, the portable way (the compiler vectorises these loops for whatever it targets).
void split_bf16_row_portable(Bf16* hi, Bf16* mid, Bf16* lo, const float* row, int K) {
    for (int k = 0; k < K; ++k) {
        // Each remainder is exact: a value and its rounding share their leading bits.
        const Bf16 h = to_bf16(row[k]);
        const float r = row[k] - to_float(h);
        const Bf16 m = to_bf16(r);
        hi[k] = h;
        mid[k] = m;
        lo[k] = to_bf16(r - to_float(m));
    }
}

void split_int8_row_portable(std::int8_t* q0, std::int8_t* q1, std::int8_t* q2, const float* row,
                             int K, float s0, float s1, float s2) {
    const float inv0 = 1.0f / s0, inv1 = 1.0f / s1, inv2 = 1.0f / s2;
    for (int k = 0; k < K; ++k) {
        const float v = row[k];
        const float a = round_to_int8_grid(v * inv0);
        const float r0 = std::fma(-a, s0, v);
        const float b = round_to_int8_grid(r0 * inv1);
        const float r1 = std::fma(-b, s1, r0);
        q0[k] = static_cast<std::int8_t>(a);
        q1[k] = static_cast<std::int8_t>(b);
        q2[k] = static_cast<std::int8_t>(round_to_int8_grid(r1 * inv2));
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// The same rows with explicit AVX-512 (the compiler's own vectorisation of the clamps and
// conversions above ran at a fraction of this): the same arithmetic, so the same pieces.
inline __mmask16 tail_mask(int left) {
    return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

// Every lane: the maskz forms of the intrinsics with all lanes set, because GCC 12 warns that the
// plain forms read an undefined vector (as in decode_matvec.cpp).
constexpr __mmask16 kAll = 0xFFFF;

// 16 floats rounded to bf16 as to_bf16 rounds (nearest even; a NaN stays a quiet NaN), widened
// back to fp32 in `widened`.
inline __m256i to_bf16_x16(__m512 v, __m512& widened) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i high = _mm512_maskz_srli_epi32(kAll, bits, 16);
    const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_maskz_srli_epi32(
        kAll, _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __m512i quiet = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    const __m512i half = _mm512_mask_blend_epi32(nan, rounded, quiet);
    widened = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAll, half, 16));
    return _mm512_maskz_cvtepi32_epi16(kAll, half);
}

void split_bf16_row(Bf16* hi, Bf16* mid, Bf16* lo, const float* row, int K) {
    for (int k = 0; k < K; k += 16) {
        const __mmask16 m = tail_mask(K - k);
        const __m512 v = _mm512_maskz_loadu_ps(m, row + k);
        __m512 h, md, l;
        const __m256i hb = to_bf16_x16(v, h);
        const __m512 r = _mm512_sub_ps(v, h);
        const __m256i mb = to_bf16_x16(r, md);
        const __m256i lb = to_bf16_x16(_mm512_sub_ps(r, md), l);
        _mm256_mask_storeu_epi16(hi + k, m, hb);
        _mm256_mask_storeu_epi16(mid + k, m, mb);
        _mm256_mask_storeu_epi16(lo + k, m, lb);
    }
}

inline __m512 round_to_int8_grid_x16(__m512 v) {
    const __m512 r =
        _mm512_maskz_roundscale_ps(kAll, v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_maskz_min_ps(kAll, _mm512_maskz_max_ps(kAll, r, _mm512_set1_ps(-127.0f)),
                               _mm512_set1_ps(127.0f));
}

void split_int8_row(std::int8_t* q0, std::int8_t* q1, std::int8_t* q2, const float* row, int K,
                    float s0, float s1, float s2) {
    const __m512 inv0 = _mm512_set1_ps(1.0f / s0), inv1 = _mm512_set1_ps(1.0f / s1),
                 inv2 = _mm512_set1_ps(1.0f / s2);
    const __m512 step0 = _mm512_set1_ps(s0), step1 = _mm512_set1_ps(s1);
    for (int k = 0; k < K; k += 16) {
        const __mmask16 m = tail_mask(K - k);
        const __m512 v = _mm512_maskz_loadu_ps(m, row + k);
        const __m512 a = round_to_int8_grid_x16(_mm512_mul_ps(v, inv0));
        const __m512 r0 = _mm512_fnmadd_ps(a, step0, v);
        const __m512 b = round_to_int8_grid_x16(_mm512_mul_ps(r0, inv1));
        const __m512 r1 = _mm512_fnmadd_ps(b, step1, r0);
        const __m512 c = round_to_int8_grid_x16(_mm512_mul_ps(r1, inv2));
        _mm512_mask_cvtepi32_storeu_epi8(q0 + k, m, _mm512_maskz_cvtps_epi32(kAll, a));
        _mm512_mask_cvtepi32_storeu_epi8(q1 + k, m, _mm512_maskz_cvtps_epi32(kAll, b));
        _mm512_mask_cvtepi32_storeu_epi8(q2 + k, m, _mm512_maskz_cvtps_epi32(kAll, c));
    }
}
#else
void split_bf16_row(Bf16* hi, Bf16* mid, Bf16* lo, const float* row, int K) {
    split_bf16_row_portable(hi, mid, lo, row, K);
}
void split_int8_row(std::int8_t* q0, std::int8_t* q1, std::int8_t* q2, const float* row, int K,
                    float s0, float s1, float s2) {
    split_int8_row_portable(q0, q1, q2, row, K, s0, s1, s2);
}
#endif

// The splits over rows, with the row kernels above (`portable`: the portable ones).
void split_bf16_rows(Bf16* out, const float* x, int ldx, int M, int Mp, int K, int i0, int i1,
                     bool portable) {
    static_assert(kBf16Pieces == 3);
    const long piece = static_cast<long>(Mp) * K;
    for (int i = i0; i < i1; ++i) {
        Bf16* hi = out + static_cast<long>(i) * K;
        Bf16* mid = hi + piece;
        Bf16* lo = mid + piece;
        if (i >= M) {
            for (Bf16* p : {hi, mid, lo})
                std::fill_n(p, K, Bf16{});
            continue;
        }
        const float* row = x + static_cast<long>(i) * ldx;
        if (portable) {
            split_bf16_row_portable(hi, mid, lo, row, K);
        } else {
            split_bf16_row(hi, mid, lo, row, K);
        }
    }
}

void split_int8_rows(std::int8_t* out, float* scales, const float* x, int ldx, int M, int Mp, int K,
                     int i0, int i1, bool portable) {
    static_assert(kInt8Pieces == 3);
    const long piece = static_cast<long>(Mp) * K;
    for (int i = i0; i < i1; ++i) {
        std::int8_t* q0 = out + static_cast<long>(i) * K;
        std::int8_t* q1 = q0 + piece;
        std::int8_t* q2 = q1 + piece;
        const float* row = x + static_cast<long>(i) * ldx;
        const float max_abs = i < M ? largest_magnitude(row, K) : 0.0f;
        // A padding row, a row of zeros, or one so small that the last piece's scale would not
        // be a normal float (below 2^-100: nothing a network's activations come near) has zero
        // pieces; a row with an infinity or NaN gets zero pieces and a NaN scale, so that its
        // products are NaN as the matvec's would be.
        if (!(max_abs >= kSmallestSplitRow)) {
            const float nan_or_zero = std::isnan(max_abs) ? max_abs : 0.0f;
            for (std::int8_t* q : {q0, q1, q2})
                std::memset(q, 0, static_cast<std::size_t>(K));
            for (int p = 0; p < kInt8Pieces; ++p)
                scales[p * Mp + i] = nan_or_zero;
            continue;
        }
        // Each element's remainder is carried through the pieces (fma: the remainder of rounding
        // to a piece's grid is exact).
        const float s0 = max_abs / 127.0f, s1 = s0 / kInt8Refinement, s2 = s1 / kInt8Refinement;
        scales[i] = s0;
        scales[Mp + i] = s1;
        scales[2 * Mp + i] = s2;
        if (portable) {
            split_int8_row_portable(q0, q1, q2, row, K, s0, s1, s2);
        } else {
            split_int8_row(q0, q1, q2, row, K, s0, s1, s2);
        }
    }
}

}  // namespace

void split_into_bf16_pieces(Bf16* out, const float* x, int ldx, int M, int Mp, int K, int i0,
                            int i1) {
    split_bf16_rows(out, x, ldx, M, Mp, K, i0, i1, false);
}

void split_into_bf16_pieces_portable(Bf16* out, const float* x, int ldx, int M, int Mp, int K,
                                     int i0, int i1) {
    split_bf16_rows(out, x, ldx, M, Mp, K, i0, i1, true);
}

void split_into_int8_pieces(std::int8_t* out, float* scales, const float* x, int ldx, int M, int Mp,
                            int K, int i0, int i1) {
    split_int8_rows(out, scales, x, ldx, M, Mp, K, i0, i1, false);
}

void split_into_int8_pieces_portable(std::int8_t* out, float* scales, const float* x, int ldx,
                                     int M, int Mp, int K, int i0, int i1) {
    split_int8_rows(out, scales, x, ldx, M, Mp, K, i0, i1, true);
}

void pieces_product(float* out, int ldo, const Bf16* pieces, int M, int Mp, int K, const Bf16* w,
                    int n, const float* bias, bool accumulate, float* scratch) {
    if (M <= 0 || n <= 0) return;
    gemm_bf16_nt(kBf16Pieces * Mp, n, K, pieces, K, w, K, 0.0f, scratch, n);
    const long piece = static_cast<long>(Mp) * n;
    for (int i = 0; i < M; ++i) {
        const float* hi = scratch + static_cast<long>(i) * n;
        const float* mid = hi + piece;
        const float* lo = mid + piece;
        float* o = out + static_cast<long>(i) * ldo;
        for (int j = 0; j < n; ++j)
            o[j] = base_of(o, j, bias, accumulate) + ((hi[j] + mid[j]) + lo[j]);
    }
}

void pieces_product(float* out, int ldo, const std::int8_t* pieces, const float* piece_scales,
                    int M, int Mp, int K, const std::int8_t* w, const float* row_scales, int n,
                    const float* bias, bool accumulate, std::int32_t* scratch) {
    if (M <= 0 || n <= 0) return;
    gemm_s8_nt(kInt8Pieces * Mp, n, K, pieces, K, w, K, scratch, n);
    const long piece = static_cast<long>(Mp) * n;
    for (int i = 0; i < M; ++i) {
        const std::int32_t* d0 = scratch + static_cast<long>(i) * n;
        const std::int32_t* d1 = d0 + piece;
        const std::int32_t* d2 = d1 + piece;
        const float s0 = piece_scales[i], s1 = piece_scales[Mp + i], s2 = piece_scales[2 * Mp + i];
        float* o = out + static_cast<long>(i) * ldo;
        for (int j = 0; j < n; ++j) {
            const float dot = (s0 * static_cast<float>(d0[j]) + s1 * static_cast<float>(d1[j])) +
                              s2 * static_cast<float>(d2[j]);
            o[j] = base_of(o, j, bias, accumulate) + dot * row_scales[j];
        }
    }
}

}  // namespace gpt2
