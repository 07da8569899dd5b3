#include "ops/decode_matvec.hpp"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#endif

namespace gpt2 {

namespace {

// One weight as fp32: bf16 converts exactly, int8 is multiplied by its row's scale after the dot.
inline float weight_as_float(float w) {
    return w;
}
inline float weight_as_float(Bf16 w) {
    return to_float(w);
}
inline float weight_as_float(std::int8_t w) {
    return static_cast<float>(w);
}

// How a matvec writes row j's dot product: y[j] = (accumulate ? y[j] : 0) + bias[j] + scale[j] *
// dot (bias and scales may be null).
struct RowResults {
    float* y;
    const float* bias;
    const float* scales;
    bool accumulate;
    void operator()(int j, float dot) const {
        const float base = (accumulate ? y[j] : 0.0f) + (bias != nullptr ? bias[j] : 0.0f);
        y[j] = base + (scales != nullptr ? dot * scales[j] : dot);
    }
};

// The dot product of the columns [from, K) that the vector loop left over.
template <typename W>
inline float tail_dot(const W* w, const float* x, int from, int K) {
    float sum = 0.0f;
    for (int k = from; k < K; ++k)
        sum += weight_as_float(w[k]) * x[k];
    return sum;
}

// Asks for the weights 8 KiB ahead of four row streams. One token's products are bound by how
// fast the weights arrive; the hardware prefetchers alone left decoding at about half the rate
// this reaches (docs/performance.md).
template <typename W>
inline void prefetch_rows_ahead(const W* w0, const W* w1, const W* w2, const W* w3) {
    constexpr int kAhead = 8192 / sizeof(W);
    for (const W* p : {w0, w1, w2, w3})
        __builtin_prefetch(p + kAhead);
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// 16 weights loaded as fp32: bf16 by a shift into the high half, int8 by sign extension.
inline __m512 load16_as_float(const Bf16* p) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(
        _mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, bits), 16));
}
inline __m512 load16_as_float(const std::int8_t* p) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_maskz_cvtepi32_ps(0xFFFF, _mm512_maskz_cvtepi8_epi32(0xFFFF, bytes));
}

// Sum of the lanes (not _mm512_reduce_add_ps: GCC 12 warns about its undefined upper halves).
inline float sum_lanes(__m512 v) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, v);
    float sum = 0.0f;
    for (const float lane : lanes)
        sum += lane;
    return sum;
}

// The compact formats' matvec with explicit AVX-512: the compiler does not vectorise the
// conversion inside matvec_portable's lanes well (bf16 and int8 gained little over fp32 that way:
// docs/performance.md). Four rows share each load of x; two vectors of 16 per row keep eight FMAs
// in flight.
template <typename W>
void matvec_avx512(float* y, const float* x, const W* w, const float* scales, int n, int K,
                   const float* bias, bool accumulate) {
    const RowResults finish{y, bias, scales, accumulate};
    const long ldw = K;
    const int body = K / 32 * 32;
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        const W* w0 = w + j * ldw;
        const W* w1 = w0 + ldw;
        const W* w2 = w1 + ldw;
        const W* w3 = w2 + ldw;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        for (int k = 0; k < body; k += 32) {
            prefetch_rows_ahead(w0 + k, w1 + k, w2 + k, w3 + k);
            const __m512 x0 = _mm512_loadu_ps(x + k), x1 = _mm512_loadu_ps(x + k + 16);
            a0 = _mm512_fmadd_ps(load16_as_float(w0 + k), x0, a0);
            a1 = _mm512_fmadd_ps(load16_as_float(w1 + k), x0, a1);
            a2 = _mm512_fmadd_ps(load16_as_float(w2 + k), x0, a2);
            a3 = _mm512_fmadd_ps(load16_as_float(w3 + k), x0, a3);
            b0 = _mm512_fmadd_ps(load16_as_float(w0 + k + 16), x1, b0);
            b1 = _mm512_fmadd_ps(load16_as_float(w1 + k + 16), x1, b1);
            b2 = _mm512_fmadd_ps(load16_as_float(w2 + k + 16), x1, b2);
            b3 = _mm512_fmadd_ps(load16_as_float(w3 + k + 16), x1, b3);
        }
        float s0 = sum_lanes(_mm512_add_ps(a0, b0));
        float s1 = sum_lanes(_mm512_add_ps(a1, b1));
        float s2 = sum_lanes(_mm512_add_ps(a2, b2));
        float s3 = sum_lanes(_mm512_add_ps(a3, b3));
        finish(j, s0 + tail_dot(w0, x, body, K));
        finish(j + 1, s1 + tail_dot(w1, x, body, K));
        finish(j + 2, s2 + tail_dot(w2, x, body, K));
        finish(j + 3, s3 + tail_dot(w3, x, body, K));
    }
    for (; j < n; ++j) {
        const W* w0 = w + j * ldw;
        __m512 a0 = _mm512_setzero_ps(), b0 = a0;
        for (int k = 0; k < body; k += 32) {
            a0 = _mm512_fmadd_ps(load16_as_float(w0 + k), _mm512_loadu_ps(x + k), a0);
            b0 = _mm512_fmadd_ps(load16_as_float(w0 + k + 16), _mm512_loadu_ps(x + k + 16), b0);
        }
        float s0 = sum_lanes(_mm512_add_ps(a0, b0));
        finish(j, s0 + tail_dot(w0, x, body, K));
    }
}
#endif

// bf16 and int8 rows: the AVX-512 loop where the build has it, the portable one otherwise.
template <typename W>
void matvec_compact(float* y, const float* x, const W* w, const float* scales, int n, int K,
                    const float* bias, bool accumulate) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
    matvec_avx512(y, x, w, scales, n, K, bias, accumulate);
#else
    matvec_portable(y, x, w, scales, n, K, bias, accumulate);
#endif
}

}  // namespace

// Four rows at a time with one accumulator per lane, so x is reused from registers and w (the only
// large operand) streams through once: one token's products are bandwidth-bound, and sgemm with
// M = 1 packs w first and runs about three times slower.
template <typename W>
void matvec_portable(float* y, const float* x, const W* w, const float* scales, int n, int K,
                     const float* bias, bool accumulate) {
    const RowResults finish{y, bias, scales, accumulate};
    const long ldw = K;
    constexpr int kLanes = 16;
    const int body = K / kLanes * kLanes;
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        const W* w0 = w + j * ldw;
        const W* w1 = w0 + ldw;
        const W* w2 = w1 + ldw;
        const W* w3 = w2 + ldw;
        float a0[kLanes] = {}, a1[kLanes] = {}, a2[kLanes] = {}, a3[kLanes] = {};
        for (int k = 0; k < body; k += kLanes) {
            prefetch_rows_ahead(w0 + k, w1 + k, w2 + k, w3 + k);
            for (int l = 0; l < kLanes; ++l) {
                const float xv = x[k + l];
                a0[l] += weight_as_float(w0[k + l]) * xv;
                a1[l] += weight_as_float(w1[k + l]) * xv;
                a2[l] += weight_as_float(w2[k + l]) * xv;
                a3[l] += weight_as_float(w3[k + l]) * xv;
            }
        }
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        for (int l = 0; l < kLanes; ++l) {
            s0 += a0[l];
            s1 += a1[l];
            s2 += a2[l];
            s3 += a3[l];
        }
        finish(j, s0 + tail_dot(w0, x, body, K));
        finish(j + 1, s1 + tail_dot(w1, x, body, K));
        finish(j + 2, s2 + tail_dot(w2, x, body, K));
        finish(j + 3, s3 + tail_dot(w3, x, body, K));
    }
    for (; j < n; ++j) {
        const W* w0 = w + j * ldw;
        float a0[kLanes] = {};
        for (int k = 0; k < body; k += kLanes) {
            for (int l = 0; l < kLanes; ++l)
                a0[l] += weight_as_float(w0[k + l]) * x[k + l];
        }
        float s0 = 0.0f;
        for (int l = 0; l < kLanes; ++l)
            s0 += a0[l];
        finish(j, s0 + tail_dot(w0, x, body, K));
    }
}

template void matvec_portable(float*, const float*, const float*, const float*, int, int,
                              const float*, bool);
template void matvec_portable(float*, const float*, const Bf16*, const float*, int, int,
                              const float*, bool);
template void matvec_portable(float*, const float*, const std::int8_t*, const float*, int, int,
                              const float*, bool);

void matvec(float* y, const float* x, const float* w, int n, int K, const float* bias,
            bool accumulate) {
    matvec_portable(y, x, w, nullptr, n, K, bias, accumulate);
}

void matvec(float* y, const float* x, const Bf16* w, int n, int K, const float* bias,
            bool accumulate) {
    matvec_compact(y, x, w, nullptr, n, K, bias, accumulate);
}

void matvec(float* y, const float* x, const std::int8_t* w, const float* scales, int n, int K,
            const float* bias, bool accumulate) {
    matvec_compact(y, x, w, scales, n, K, bias, accumulate);
}

}  // namespace gpt2
