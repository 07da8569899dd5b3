#include "ops/decode_matvec.hpp"

#include <algorithm>
#include <stdexcept>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

// Which explicit loops matvec_many runs (matvec's own AVX-512 loop, or on AVX2 the same sums as
// matvec_portable's vectorised lanes); neither: the portable loop.
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define GPT2_MATVEC_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define GPT2_MATVEC_AVX2 1
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

// a * b + c, fused where the CPU has FMA: every loop below names its multiply-adds explicitly, so
// that one vector's products and several vectors' products (matvec_many) round alike whatever
// the compiler would contract.
inline float mul_add(float a, float b, float c) {
#if defined(__FMA__)
    return __builtin_fmaf(a, b, c);
#else
    return a * b + c;
#endif
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
        y[j] = scales != nullptr ? mul_add(dot, scales[j], base) : base + dot;
    }
};

// Vectors handled per pass over a block of rows: V accumulator pairs stay in registers (16 of
// AVX-512's 32 registers at 8; 8 of AVX2's 16 at 4).
#if defined(GPT2_MATVEC_AVX512)
constexpr int kVectorsPerPass = 8;
#else
constexpr int kVectorsPerPass = 4;
#endif
// Rows per block: a block of the widest rows (4C = 3072 fp32 for GPT-2 124M) stays in L2 while
// each pass of up to eight vectors reads it.
constexpr int kRowsPerBlock = 16;
// Columns per block of matvec_many's explicit loops (a multiple of 32).
constexpr int kColumnsPerBlock = 768;

// The dot product of the columns [from, K) that the vector loop left over.
template <typename W>
inline float tail_dot(const W* w, const float* x, int from, int K) {
    float sum = 0.0f;
    for (int k = from; k < K; ++k)
        sum = mul_add(weight_as_float(w[k]), x[k], sum);
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

#if defined(GPT2_MATVEC_AVX512)
// 16 weights loaded as fp32: bf16 by a shift into the high half, int8 by sign extension.
inline __m512 load16_as_float(const float* p) {
    return _mm512_loadu_ps(p);
}
inline __m512 load16_as_float(const Bf16* p) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(
        _mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, bits), 16));
}
inline __m512 load16_as_float(const std::int8_t* p) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_maskz_cvtepi32_ps(0xFFFF, _mm512_maskz_cvtepi8_epi32(0xFFFF, bytes));
}

// Sum of the lanes by halves (8 + 8, 4 + 4, 2 + 2, 1 + 1): a fixed order, and a few shuffles
// where adding the 16 lanes one after another cost as much as a 768-long row's FMAs once several
// vectors share each row. GCC 12 implements the 512-to-256 cast as an extract from an undefined
// vector and warns about it (as about _mm512_reduce_add_ps): nothing is read from it.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
inline float sum_lanes(__m512 v) {
    const __m256 low = _mm512_castps512_ps256(v);
    const __m256 high = _mm512_castps512_ps256(_mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 eight = _mm256_add_ps(low, high);
    const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
    const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
    const __m128 one = _mm_add_ss(two, _mm_movehdup_ps(two));
    return _mm_cvtss_f32(one);
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// The matvec with explicit AVX-512 for every format: the compiler does not vectorise the
// conversion inside matvec_portable's lanes well (bf16 and int8 gained little over fp32 that way:
// docs/performance.md). Four rows share each load of x; two vectors of 16 per row keep eight FMAs
// in flight. A row's dot is sum_lanes(a + b) + its tail, a and b summing the columns k % 32 < 16
// and >= 16 in order: rows_times_vectors computes each row so too.
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

// Rows [j0, j1) of w (at most kRowsPerBlock) times V vectors: each row's 16-weight pieces loaded
// (and converted) once for all the vectors, each (row, vector) summed exactly as matvec_avx512
// sums a row. The columns go in blocks of kColumnsPerBlock, every row's partial sums kept between
// blocks (the same FMAs in the same order), so that the vectors' block (8 x 768 floats: 24 KiB)
// stays in L1: 8 vectors 3072 long (GPT-2's MLP down-projection) read from L2 ran at half the
// rate. The next block of rows is prefetched into L2 meanwhile.
template <typename W, int V>
void rows_times_vectors(float* const* ys, const float* const* xs, const W* w, const float* scales,
                        int j0, int j1, int K, const float* bias, bool accumulate) {
    const int body = K / 32 * 32;
    const long next_rows = static_cast<long>(kRowsPerBlock) * K;
    __m512 saved[kRowsPerBlock][V][2];
    for (int k0 = 0;; k0 += kColumnsPerBlock) {
        const int k1 = std::min(body, k0 + kColumnsPerBlock);
        const bool last = k1 == body;
        for (int j = j0; j < j1; ++j) {
            const W* row = w + static_cast<long>(j) * K;
            __m512 a[V], b[V];
            for (int v = 0; v < V; ++v) {
                a[v] = k0 == 0 ? _mm512_setzero_ps() : saved[j - j0][v][0];
                b[v] = k0 == 0 ? _mm512_setzero_ps() : saved[j - j0][v][1];
            }
            for (int k = k0; k < k1; k += 32) {
                const char* ahead = reinterpret_cast<const char*>(row + next_rows + k);
                __builtin_prefetch(ahead, 0, 2);
                if constexpr (sizeof(W) == 4) __builtin_prefetch(ahead + 64, 0, 2);
                const __m512 w0 = load16_as_float(row + k), w1 = load16_as_float(row + k + 16);
                for (int v = 0; v < V; ++v) {
                    a[v] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xs[v] + k), a[v]);
                    b[v] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xs[v] + k + 16), b[v]);
                }
            }
            for (int v = 0; v < V; ++v) {
                if (!last) {
                    saved[j - j0][v][0] = a[v];
                    saved[j - j0][v][1] = b[v];
                    continue;
                }
                const float dot = sum_lanes(_mm512_add_ps(a[v], b[v]));
                RowResults{ys[v], bias, scales, accumulate}(j, dot + tail_dot(row, xs[v], body, K));
            }
        }
        if (last) break;
    }
}
#endif

// One row's dot over the columns [0, body) in matvec_portable's arithmetic: 16 lane sums over
// the columns in order, added lane by lane. Apart (not inlined) so that the compiler vectorises its
// loop, which inlined among matvec_many's passes it left scalar (a fifth of the rate on AVX2).
template <typename W>
[[gnu::noinline]] float row_dot_portable(const W* row, const float* x, int body, int) {
    constexpr int kLanes = 16;
    float a[kLanes] = {};
    for (int k = 0; k < body; k += kLanes) {
        for (int l = 0; l < kLanes; ++l)
            a[l] = mul_add(weight_as_float(row[k + l]), x[k + l], a[l]);
    }
    float dot = 0.0f;
    for (int l = 0; l < kLanes; ++l)
        dot += a[l];
    return dot;
}

// Rows [j0, j1) times V vectors in matvec_portable's arithmetic: per (row, vector) 16 lane sums
// over the columns in order, added lane by lane, then the tail.
template <typename W, int V>
void rows_times_vectors_portable(float* const* ys, const float* const* xs, const W* w,
                                 const float* scales, int j0, int j1, int K, const float* bias,
                                 bool accumulate) {
    constexpr int kLanes = 16;
    const int body = K / kLanes * kLanes;
    // Vector by vector over each row, the row then read from L1.
    for (int j = j0; j < j1; ++j) {
        const W* row = w + static_cast<long>(j) * K;
        for (int v = 0; v < V; ++v) {
            RowResults{ys[v], bias, scales, accumulate}(
                j, row_dot_portable(row, xs[v], body, kLanes) + tail_dot(row, xs[v], body, K));
        }
    }
}

#if defined(GPT2_MATVEC_AVX2)
// 8 weights loaded as fp32: bf16 by a shift into the high half, int8 by sign extension.
inline __m256 load8_as_float(const float* p) {
    return _mm256_loadu_ps(p);
}
inline __m256 load8_as_float(const Bf16* p) {
    const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
inline __m256 load8_as_float(const std::int8_t* p) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}

// AVX2: rows [j0, j1) (at most kRowsPerBlock) times V vectors, each row's 8-weight pieces loaded
// once for all of them, each (row, vector) summed as row_dot_portable sums it: lanes 0-7 and 8-15
// of its 16 lane sums in two registers, FMAs in column order, the lanes then added one by one
// (which matvec_portable's vectorised loops also compute, so the bits are matvec's). Columns in
// blocks, as the AVX-512 loop.
template <typename W, int V>
void rows_times_vectors(float* const* ys, const float* const* xs, const W* w, const float* scales,
                        int j0, int j1, int K, const float* bias, bool accumulate) {
    constexpr int kLanes = 16;
    const int body = K / kLanes * kLanes;
    const long next_rows = static_cast<long>(kRowsPerBlock) * K;
    __m256 saved[kRowsPerBlock][V][2];
    for (int k0 = 0;; k0 += kColumnsPerBlock) {
        const int k1 = std::min(body, k0 + kColumnsPerBlock);
        const bool last = k1 == body;
        for (int j = j0; j < j1; ++j) {
            const W* row = w + static_cast<long>(j) * K;
            __m256 a[V], b[V];
            for (int v = 0; v < V; ++v) {
                a[v] = k0 == 0 ? _mm256_setzero_ps() : saved[j - j0][v][0];
                b[v] = k0 == 0 ? _mm256_setzero_ps() : saved[j - j0][v][1];
            }
            for (int k = k0; k < k1; k += kLanes) {
                __builtin_prefetch(row + next_rows + k, 0, 2);
                const __m256 w0 = load8_as_float(row + k), w1 = load8_as_float(row + k + 8);
                for (int v = 0; v < V; ++v) {
                    a[v] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xs[v] + k), a[v]);
                    b[v] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xs[v] + k + 8), b[v]);
                }
            }
            for (int v = 0; v < V; ++v) {
                if (!last) {
                    saved[j - j0][v][0] = a[v];
                    saved[j - j0][v][1] = b[v];
                    continue;
                }
                alignas(32) float lanes[kLanes];
                _mm256_store_ps(lanes, a[v]);
                _mm256_store_ps(lanes + 8, b[v]);
                float dot = 0.0f;
                for (const float lane : lanes)
                    dot += lane;
                RowResults{ys[v], bias, scales, accumulate}(j, dot + tail_dot(row, xs[v], body, K));
            }
        }
        if (last) break;
    }
}
#endif

template <typename W, int V>
void rows_times_vectors_any(float* const* ys, const float* const* xs, const W* w,
                            const float* scales, int j0, int j1, int K, const float* bias,
                            bool accumulate, bool portable) {
#if defined(GPT2_MATVEC_AVX512) || defined(GPT2_MATVEC_AVX2)
    if (!portable) {
        rows_times_vectors<W, V>(ys, xs, w, scales, j0, j1, K, bias, accumulate);
        return;
    }
#endif
    rows_times_vectors_portable<W, V>(ys, xs, w, scales, j0, j1, K, bias, accumulate);
}

// rows_times_vectors_any for a pass of `count` vectors (1..V), V fixed at compile time so that
// the accumulators stay in registers.
template <typename W, int V = 1>
void run_pass(int count, float* const* ys, const float* const* xs, const W* w, const float* scales,
              int j0, int j1, int K, const float* bias, bool accumulate, bool portable) {
    if constexpr (V < kVectorsPerPass) {
        if (count > V) {
            run_pass<W, V + 1>(count, ys, xs, w, scales, j0, j1, K, bias, accumulate, portable);
            return;
        }
    }
    rows_times_vectors_any<W, V>(ys, xs, w, scales, j0, j1, K, bias, accumulate, portable);
}

template <typename W>
void matvec_many_impl(std::span<float* const> ys, std::span<const float* const> xs, const W* w,
                      const float* scales, int n, int K, const float* bias, bool accumulate,
                      bool portable) {
    if (ys.size() != xs.size()) throw std::invalid_argument("matvec_many: one output per input");
    const auto vectors = static_cast<int>(ys.size());
    for (int j0 = 0; j0 < n; j0 += kRowsPerBlock) {
        const int j1 = std::min(n, j0 + kRowsPerBlock);
        for (int v0 = 0; v0 < vectors; v0 += kVectorsPerPass) {
            float* const* y = ys.data() + v0;
            const float* const* x = xs.data() + v0;
            run_pass(std::min(kVectorsPerPass, vectors - v0), y, x, w, scales, j0, j1, K, bias,
                     accumulate, portable);
        }
    }
}

// Every format: the AVX-512 loop where the build has it, the portable one otherwise.
template <typename W>
void matvec_compact(float* y, const float* x, const W* w, const float* scales, int n, int K,
                    const float* bias, bool accumulate) {
#if defined(GPT2_MATVEC_AVX512)
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
                a0[l] = mul_add(weight_as_float(w0[k + l]), xv, a0[l]);
                a1[l] = mul_add(weight_as_float(w1[k + l]), xv, a1[l]);
                a2[l] = mul_add(weight_as_float(w2[k + l]), xv, a2[l]);
                a3[l] = mul_add(weight_as_float(w3[k + l]), xv, a3[l]);
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
                a0[l] = mul_add(weight_as_float(w0[k + l]), x[k + l], a0[l]);
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
    matvec_compact(y, x, w, nullptr, n, K, bias, accumulate);
}

void matvec(float* y, const float* x, const Bf16* w, int n, int K, const float* bias,
            bool accumulate) {
    matvec_compact(y, x, w, nullptr, n, K, bias, accumulate);
}

void matvec(float* y, const float* x, const std::int8_t* w, const float* scales, int n, int K,
            const float* bias, bool accumulate) {
    matvec_compact(y, x, w, scales, n, K, bias, accumulate);
}

template <typename W>
void matvec_many_portable(std::span<float* const> ys, std::span<const float* const> xs, const W* w,
                          const float* scales, int n, int K, const float* bias, bool accumulate) {
    matvec_many_impl(ys, xs, w, scales, n, K, bias, accumulate, true);
}

template void matvec_many_portable(std::span<float* const>, std::span<const float* const>,
                                   const float*, const float*, int, int, const float*, bool);
template void matvec_many_portable(std::span<float* const>, std::span<const float* const>,
                                   const Bf16*, const float*, int, int, const float*, bool);
template void matvec_many_portable(std::span<float* const>, std::span<const float* const>,
                                   const std::int8_t*, const float*, int, int, const float*, bool);

void matvec_many(std::span<float* const> ys, std::span<const float* const> xs, const float* w,
                 int n, int K, const float* bias, bool accumulate) {
    matvec_many_impl(ys, xs, w, nullptr, n, K, bias, accumulate, false);
}

void matvec_many(std::span<float* const> ys, std::span<const float* const> xs, const Bf16* w, int n,
                 int K, const float* bias, bool accumulate) {
    matvec_many_impl(ys, xs, w, nullptr, n, K, bias, accumulate, false);
}

void matvec_many(std::span<float* const> ys, std::span<const float* const> xs, const std::int8_t* w,
                 const float* scales, int n, int K, const float* bias, bool accumulate) {
    matvec_many_impl(ys, xs, w, scales, n, K, bias, accumulate, false);
}

}  // namespace gpt2
