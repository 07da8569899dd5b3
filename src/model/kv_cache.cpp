#include "model/kv_cache.hpp"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include "core/error.hpp"
#include "ops/gemm.hpp"
#include "ops/kernels.hpp"

namespace gpt2 {

namespace {
// Prompt positions encoded per forward: bounds the scratch (it does not grow with maxT) while
// keeping the GEMMs large enough to run near peak.
constexpr int kChunkRows = 128;
// Query rows whose attention scores are materialised at once (per worker).
// Prefill attention works on this many query rows at a time (their score rows fit in cache).
constexpr int kPrefillScoreRows = 32;
// Column shares are multiples of a cache line so workers never write the same line.
constexpr std::size_t kLineFloats = 16;

[[nodiscard]] std::size_t round_to_line(std::size_t count) {
    return (count + kLineFloats - 1) / kLineFloats * kLineFloats;
}

// Worker w's share of n columns, cut at cache-line multiples.
[[nodiscard]] Range column_share(std::size_t n, int w, int W) {
    const Range units = split_range((n + kLineFloats - 1) / kLineFloats, w, W);
    return Range{std::min(n, units.begin * kLineFloats), std::min(n, units.end * kLineFloats)};
}

// A weight as fp32: bf16 widens exactly, int8 is multiplied by its row's scale after the dot.
inline float widen(float w) {
    return w;
}
inline float widen(Bf16 w) {
    return to_float(w);
}
inline float widen(std::int8_t w) {
    return static_cast<float>(w);
}

// How matvec writes row j's dot product: y[j] = (accumulate ? y[j] : 0) + bias[j] + scale[j] * dot
// (bias and scales may be null).
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
        sum += widen(w[k]) * x[k];
    return sum;
}

// Asks for the weights 8 KiB ahead of four row streams. One token's products are bound by how
// fast the weights arrive; the hardware prefetchers alone left decoding at about half the rate
// this reaches (measured on Sapphire Rapids: bf16 70 -> 110 tok/s, int8 100 -> 185 for 124M).
template <typename W>
inline void prefetch_rows_ahead(const W* w0, const W* w1, const W* w2, const W* w3) {
    constexpr int kAhead = 8192 / sizeof(W);
    for (const W* p : {w0, w1, w2, w3})
        __builtin_prefetch(p + kAhead);
}

// y[j] = ((accumulate ? y[j] : 0) + bias[j]) + scale[j] * dot(w[j, 0:K], x) for j < n (bias and
// scales may be null), rows of w ldw apart. Four rows at a time with one accumulator per lane, so
// x is reused from registers and w (the only large operand) streams through once: one token's
// products are bandwidth-bound, and sgemm with M = 1 packs w first and runs about three times
// slower. W is float, Bf16 or int8: the narrower, the fewer bytes per token.
template <typename W>
void matvec(float* y, const float* x, const W* w, long ldw, int n, int K, const float* bias,
            bool accumulate, const float* scales = nullptr) {
    const RowResults finish{y, bias, scales, accumulate};
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
                a0[l] += widen(w0[k + l]) * xv;
                a1[l] += widen(w1[k + l]) * xv;
                a2[l] += widen(w2[k + l]) * xv;
                a3[l] += widen(w3[k + l]) * xv;
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
                a0[l] += widen(w0[k + l]) * x[k + l];
        }
        float s0 = 0.0f;
        for (int l = 0; l < kLanes; ++l)
            s0 += a0[l];
        finish(j, s0 + tail_dot(w0, x, body, K));
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// 16 weights widened to fp32: bf16 by a shift into the high half, int8 by sign extension.
inline __m512 widen16(const Bf16* p) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(
        _mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, bits), 16));
}
inline __m512 widen16(const std::int8_t* p) {
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

// The compact formats' matvec with explicit AVX-512: the compiler does not vectorise the widening
// inside matvec's lanes well (measured: bf16 and int8 only 1.25x faster than fp32 that way).
// Four rows share each load of x; two vectors of 16 per row keep eight FMAs in flight.
template <typename W>
void matvec_compact(float* y, const float* x, const W* w, long ldw, int n, int K, const float* bias,
                    bool accumulate, const float* scales) {
    const RowResults finish{y, bias, scales, accumulate};
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
            a0 = _mm512_fmadd_ps(widen16(w0 + k), x0, a0);
            a1 = _mm512_fmadd_ps(widen16(w1 + k), x0, a1);
            a2 = _mm512_fmadd_ps(widen16(w2 + k), x0, a2);
            a3 = _mm512_fmadd_ps(widen16(w3 + k), x0, a3);
            b0 = _mm512_fmadd_ps(widen16(w0 + k + 16), x1, b0);
            b1 = _mm512_fmadd_ps(widen16(w1 + k + 16), x1, b1);
            b2 = _mm512_fmadd_ps(widen16(w2 + k + 16), x1, b2);
            b3 = _mm512_fmadd_ps(widen16(w3 + k + 16), x1, b3);
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
            a0 = _mm512_fmadd_ps(widen16(w0 + k), _mm512_loadu_ps(x + k), a0);
            b0 = _mm512_fmadd_ps(widen16(w0 + k + 16), _mm512_loadu_ps(x + k + 16), b0);
        }
        float s0 = sum_lanes(_mm512_add_ps(a0, b0));
        finish(j, s0 + tail_dot(w0, x, body, K));
    }
}
#else
template <typename W>
void matvec_compact(float* y, const float* x, const W* w, long ldw, int n, int K, const float* bias,
                    bool accumulate, const float* scales) {
    matvec(y, x, w, ldw, n, K, bias, accumulate, scales);
}
#endif

// n rows of K weights starting at one row of a matrix, in whichever format decoding reads: the
// fp32 parameters, or their bf16/int8 copy (DecodeWeights).
struct WeightRows {
    const float* fp32 = nullptr;
    QuantizedRows compact;

    // y[j] = (accumulate ? y[j] : 0) + bias[j] + rows[j] . x, for j < n.
    void matvec_into(float* y, const float* x, int n, int K, const float* bias,
                     bool accumulate) const {
        if (compact.bf16 != nullptr) {
            matvec_compact(y, x, compact.bf16, K, n, K, bias, accumulate, nullptr);
        } else if (compact.int8 != nullptr) {
            matvec_compact(y, x, compact.int8, K, n, K, bias, accumulate, compact.scales);
        } else {
            matvec(y, x, fp32, K, n, K, bias, accumulate);
        }
    }
    // Rows [r0, r0 + count) as fp32 for a GEMM: the parameters themselves, or widened into
    // `scratch` (count * K floats).
    const float* as_fp32(int r0, int count, int K, float* scratch) const {
        const long first = static_cast<long>(r0) * K;
        if (compact.bf16 == nullptr && compact.int8 == nullptr) return fp32 + first;
        for (int r = 0; r < count; ++r) {
            float* out = scratch + static_cast<long>(r) * K;
            if (compact.bf16 != nullptr) {
                convert_to_float(out, compact.bf16 + first + static_cast<long>(r) * K,
                                 static_cast<std::size_t>(K));
            } else {
                const std::int8_t* q = compact.int8 + first + static_cast<long>(r) * K;
                const float scale = compact.scales[r0 + r];
                for (int k = 0; k < K; ++k)
                    out[k] = static_cast<float>(q[k]) * scale;
            }
        }
        return scratch;
    }
};

// Weight rows widened per GEMM call when decoding reads compact weights (bounds the scratch).
constexpr int kWidenRows = 64;

// out[i, 0:n] (row stride ldo) = (accumulate ? out : 0) + bias[0:n] + inp[i, 0:K] @ weight(n, K)^T
// for i < M: a slice of a linear layer, in the same order of operations as matmul_forward and
// matmul_residual_forward (bias first, then the product added onto it).
void linear_slice(float* out, int ldo, const float* inp, int M, int K, const WeightRows& weight,
                  const float* bias, int n, bool accumulate, float* widen_scratch) {
    if (n <= 0) return;
    if (M == 1) {
        weight.matvec_into(out, inp, n, K, bias, accumulate);
        return;
    }
    for (int i = 0; i < M; ++i) {
        float* o = out + static_cast<long>(i) * ldo;
        if (accumulate) {
            for (int j = 0; j < n; ++j)
                o[j] += bias[j];
        } else {
            std::memcpy(o, bias, sizeof(float) * static_cast<std::size_t>(n));
        }
    }
    for (int j0 = 0; j0 < n; j0 += kWidenRows) {
        const int rows = std::min(kWidenRows, n - j0);
        gemm_nt(M, rows, K, 1.0f, inp, K, weight.as_fp32(j0, rows, K, widen_scratch), K, 1.0f,
                out + j0, ldo);
    }
}

// One head's cache: keys transposed, (hs, maxT), so that one query's scores are a sum of hs
// contiguous rows scaled by q[d] (vector work with no horizontal sums, streaming through memory);
// values (maxT, hs), so that its output is a sum of contiguous rows. Each is maxT * hs floats.
struct HeadCache {
    float* keys_t;  // [d * maxT + position]
    float* values;  // [position * hs + d]
};

// Causal attention of one head for M query rows (row stride C, offset to the head) at positions
// pos0.. against cached positions 0..pos0+M-1; out likewise. scores holds kPrefillScoreRows rows
// of stride maxT.
void attention_head(float* out, const float* q, const HeadCache& cache, float* scores, int M,
                    int pos0, int C, int hs, int maxT) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    if (M == 1) {
        // One query (GEMM with one row would copy the cache first).
        const int keys = pos0 + 1;
        float* __restrict s = scores;
        std::fill(s, s + keys, 0.0f);
        for (int d = 0; d < hs; ++d) {
            const float qd = q[d];
            const float* __restrict kd = cache.keys_t + static_cast<long>(d) * maxT;
            if (d + 2 < hs) {  // as in attention_step_bf16
                for (int j = 0; j < keys; j += 16)
                    __builtin_prefetch(kd + 2L * maxT + j);
            }
            for (int j = 0; j < keys; ++j)
                s[j] += qd * kd[j];
        }
        for (int j = 0; j < keys; ++j)
            s[j] *= scale;
        causal_softmax_row(s, keys, keys);
        float* __restrict o = out;
        for (int d = 0; d < hs; ++d)  // a loop, not std::fill: GCC 12 warns on fill's size here
            o[d] = 0.0f;
        for (int j = 0; j < keys; ++j) {
            const float a = s[j];
            const float* __restrict vj = cache.values + static_cast<long>(j) * hs;
            __builtin_prefetch(vj + 16L * hs);
            for (int d = 0; d < hs; ++d)
                o[d] += a * vj[d];
        }
        return;
    }
    for (int i0 = 0; i0 < M; i0 += kPrefillScoreRows) {
        const int i1 = std::min(M, i0 + kPrefillScoreRows);
        const int keys = pos0 + i1;  // visible to the block's last row
        gemm_nn(i1 - i0, keys, hs, scale, q + static_cast<long>(i0) * C, C, cache.keys_t, maxT,
                0.0f, scores, maxT);
        for (int i = i0; i < i1; ++i)
            causal_softmax_row(scores + static_cast<long>(i - i0) * maxT, pos0 + i + 1, keys);
        gemm_nn(i1 - i0, hs, keys, 1.0f, scores, maxT, cache.values, hs, 0.0f,
                out + static_cast<long>(i0) * C, C);
    }
}

// Appends M rows of keys, ln(M, C) @ wk(hs, C)^T + bias, to a head's transposed key cache at
// positions pos0.. (column pos0 + i of keys_t). `row` is hs floats of scratch for M = 1.
// The bf16 cache that sessions with compact weights keep (half the bytes a token's attention
// reads), in the same layout as HeadCache.
struct HeadCacheBf16 {
    Bf16* keys_t;
    Bf16* values;
};

// attention_head for one query (M = 1) reading the bf16 cache directly.
void attention_step_bf16(float* out, const float* q, const HeadCacheBf16& cache, float* scores,
                         int pos0, int hs, int maxT) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const int keys = pos0 + 1;
    float* __restrict s = scores;
    for (int j = 0; j < keys; ++j)
        s[j] = 0.0f;
    // The key rows are short strided streams the hardware prefetchers pick up late: ask for the
    // row two ahead while this one is summed (measured: attention at a 512 context 1.5x faster).
    constexpr int kLineBf16 = 32;
    for (int d = 0; d < hs; ++d) {
        const float qd = q[d];
        const Bf16* __restrict kd = cache.keys_t + static_cast<long>(d) * maxT;
        if (d + 2 < hs) {
            for (int j = 0; j < keys; j += kLineBf16)
                __builtin_prefetch(kd + 2L * maxT + j);
        }
        for (int j = 0; j < keys; ++j)
            s[j] += qd * to_float(kd[j]);
    }
    for (int j = 0; j < keys; ++j)
        s[j] *= scale;
    causal_softmax_row(s, keys, keys);
    float* __restrict o = out;
    for (int d = 0; d < hs; ++d)
        o[d] = 0.0f;
    for (int j = 0; j < keys; ++j) {
        const float a = s[j];
        const Bf16* __restrict vj = cache.values + static_cast<long>(j) * hs;
        __builtin_prefetch(vj + 32L * hs);  // 32 rows ahead of a forward stream
        for (int d = 0; d < hs; ++d)
            o[d] += a * to_float(vj[d]);
    }
}

// Copies positions [first, last) of a head's cache between the bf16 store and an fp32 staging
// copy (same layout), in the direction `widen` says.
void copy_positions(const HeadCacheBf16& store, const HeadCache& stage, int first, int last, int hs,
                    int maxT, bool widen) {
    if (last <= first) return;
    const auto count = static_cast<std::size_t>(last - first);
    for (int d = 0; d < hs; ++d) {
        const long at = static_cast<long>(d) * maxT + first;
        if (widen) {
            convert_to_float(stage.keys_t + at, store.keys_t + at, count);
        } else {
            convert_to_bf16(store.keys_t + at, stage.keys_t + at, count);
        }
    }
    const long at = static_cast<long>(first) * hs;
    if (widen) {
        convert_to_float(stage.values + at, store.values + at, count * hs);
    } else {
        convert_to_bf16(store.values + at, stage.values + at, count * hs);
    }
}

void append_keys(float* keys_t, int maxT, const float* ln, int M, int C, const WeightRows& wk,
                 const float* bias, int hs, int pos0, float* row, float* widen_scratch) {
    if (M == 1) {
        wk.matvec_into(row, ln, hs, C, bias, false);
        for (int d = 0; d < hs; ++d)
            keys_t[static_cast<long>(d) * maxT + pos0] = row[d];
        return;
    }
    for (int d = 0; d < hs; ++d)
        std::fill_n(keys_t + static_cast<long>(d) * maxT + pos0, M, bias[d]);
    // keys_t(hs, M) += wk(hs, C) @ ln(M, C)^T
    for (int d0 = 0; d0 < hs; d0 += kWidenRows) {
        const int rows = std::min(kWidenRows, hs - d0);
        gemm_nt(rows, M, C, 1.0f, wk.as_fp32(d0, rows, C, widen_scratch), C, ln, C, 1.0f,
                keys_t + static_cast<long>(d0) * maxT + pos0, maxT);
    }
}

}  // namespace

namespace {

// Decode phases take tens to hundreds of microseconds and the workers arrive close together: a
// short spin (some 10-30 microseconds) usually avoids the sleep and wake-up.
constexpr int kDecodeBarrierSpins = 1000;

[[nodiscard]] int checked_keep(const ModelConfig& c, int slide_keep) {
    const int maxT = c.max_seq_len;
    const int keep = slide_keep == 0 ? std::max(1, maxT / 2) : slide_keep;
    if (keep < 1 || keep > maxT) {
        throw std::invalid_argument("KvCacheSession: slide_keep " + std::to_string(slide_keep) +
                                    " is outside [1, " + std::to_string(maxT) + "]");
    }
    return keep;
}
}  // namespace

KvCacheSession::KvCacheSession(const Model& model, ThreadPool& pool, int slide_keep,
                               const DecodeWeights* compact)
    : model_(model),
      compact_(compact),
      pool_(pool),
      slide_keep_(checked_keep(model.config, slide_keep)),
      chunk_rows_(std::min(kChunkRows, model.config.max_seq_len)),
      workers_(pool.size()),
      barrier_(std::make_unique<WorkerBarrier>(pool.size(), kDecodeBarrierSpins)) {
    const ModelConfig& c = model.config;
    validate_config(c, "KvCacheSession");
    const auto L = static_cast<std::size_t>(c.num_layers);
    const auto C = static_cast<std::size_t>(c.channels);
    const auto maxT = static_cast<std::size_t>(c.max_seq_len);
    const auto rows = static_cast<std::size_t>(chunk_rows_);
    const auto W = static_cast<std::size_t>(workers_);
    context_.reserve(maxT);
    window_.reserve(maxT);
    if (compact != nullptr) {
        kv_bf16_ = AlignedBuffer<Bf16>(L * 2 * maxT * C);
    } else {
        kv_ = AlignedBuffer<float>(L * 2 * maxT * C);
    }

    const std::size_t x = round_to_line(rows * C), q = x, atty = x;
    const std::size_t fch = round_to_line(rows * 4 * C);
    const std::size_t logits = round_to_line(static_cast<std::size_t>(c.vocab_size));
    const std::size_t ln = round_to_line(rows * C), stats = round_to_line(2 * rows);
    const std::size_t scores = round_to_line(kPrefillScoreRows * maxT);
    const std::size_t widen = compact != nullptr ? round_to_line(kWidenRows * 4 * C) : 0;
    // bf16 cache: an fp32 staging copy of one head's cache for prompts (keys and values).
    const std::size_t stage = compact != nullptr ? round_to_line(2 * maxT * C / c.num_heads) : 0;
    scratch_ = AlignedBuffer<float>(x + q + atty + fch + logits +
                                    W * (ln + stats + scores + widen + stage));
    float* p = scratch_.data();
    const auto carve = [&p](std::size_t count) {
        float* start = p;
        p += count;
        return start;
    };
    x_ = carve(x);
    q_ = carve(q);
    atty_ = carve(atty);
    fch_ = carve(fch);
    logits_ = carve(logits);
    ln_ = carve(W * ln);
    ln_stats_ = carve(W * stats);
    scores_ = carve(W * scores);
    widen_ = carve(W * widen);
    widen_stride_ = widen;
    stage_ = carve(W * stage);
    stage_stride_ = stage;
}

KvCacheSession::~KvCacheSession() = default;

void KvCacheSession::check_token(std::int32_t token) const {
    if (token < 0 || token >= model_.config.vocab_size) {
        throw InputError("token id " + std::to_string(token) +
                         " is outside the model's vocabulary [0, " +
                         std::to_string(model_.config.vocab_size) + ")");
    }
}

std::span<const float> KvCacheSession::prefill(std::span<const std::int32_t> tokens) {
    if (tokens.empty()) throw std::invalid_argument("KvCacheSession::prefill: no tokens");
    for (const std::int32_t t : tokens)
        check_token(t);
    const std::size_t n = std::min(tokens.size(), static_cast<std::size_t>(config().max_seq_len));
    // Staged through window_ so that a caller may pass context() itself.
    window_.assign(tokens.end() - static_cast<std::ptrdiff_t>(n), tokens.end());
    encode_window();
    return {logits_, static_cast<std::size_t>(config().vocab_size)};
}

std::span<const float> KvCacheSession::step(std::int32_t token) {
    check_token(token);
    if (length() < config().max_seq_len) {
        forward_rows(std::span<const std::int32_t>(&token, 1), true);
        return {logits_, static_cast<std::size_t>(config().vocab_size)};
    }
    // Full: re-encode the last slide_keep tokens (the new one included) from position 0.
    window_.assign(context_.end() - (slide_keep_ - 1), context_.end());
    window_.push_back(token);
    ++slides_;
    encode_window();
    return {logits_, static_cast<std::size_t>(config().vocab_size)};
}

void KvCacheSession::encode_window() {
    context_.clear();
    const std::span<const std::int32_t> all(window_);
    const auto chunk = static_cast<std::size_t>(chunk_rows_);
    for (std::size_t start = 0; start < all.size(); start += chunk) {
        const std::size_t rows = std::min(chunk, all.size() - start);
        forward_rows(all.subspan(start, rows), start + rows == all.size());
    }
}

// Longer than the usual screen, on purpose: it is one thread-pool task whose phases (embed,
// per layer: LayerNorm, QKV, attention, projections, MLP; then the head) are separated by
// barriers and share a dozen locals; cut into functions, each would need all of them passed in.
void KvCacheSession::forward_rows(std::span<const std::int32_t> tokens, bool logits) {
    const ModelConfig& c = model_.config;
    const int M = static_cast<int>(tokens.size());
    const int pos0 = length();
    const int C = c.channels, NH = c.num_heads, hs = c.head_size(), maxT = c.max_seq_len;
    const int W = workers_;
    const std::span<const float> w = model_.weights();
    const float* wte = model_.layout.tensor(w, ParamTensor::wte).data();
    const float* wpe = model_.layout.tensor(w, ParamTensor::wpe).data();
    const std::size_t ln_stride = round_to_line(static_cast<std::size_t>(chunk_rows_) * C);
    const std::size_t stats_stride = round_to_line(2 * static_cast<std::size_t>(chunk_rows_));
    const std::size_t scores_stride =
        round_to_line(static_cast<std::size_t>(kPrefillScoreRows) * maxT);
    // Each worker's private LayerNorm output (recomputed by all: cheaper than a barrier).
    const auto head_cache = [&](int l, int h) {
        float* keys = kv_.data() + (static_cast<long>(l) * 2 * NH + h) * maxT * hs;
        return HeadCache{keys, keys + static_cast<long>(NH) * maxT * hs};
    };
    const auto head_cache_bf16 = [&](int l, int h) {
        Bf16* keys = kv_bf16_.data() + (static_cast<long>(l) * 2 * NH + h) * maxT * hs;
        return HeadCacheBf16{keys, keys + static_cast<long>(NH) * maxT * hs};
    };
    const bool bf16_cache = kv_bf16_.size() > 0;
    const auto worker_ln = [&](int worker, const float* inp, const float* weight, const float* bias,
                               int rows) {
        float* out = ln_ + ln_stride * static_cast<std::size_t>(worker);
        float* mean = ln_stats_ + stats_stride * static_cast<std::size_t>(worker);
        layernorm_forward(out, mean, mean + chunk_rows_, inp, weight, bias, rows, C);
        return out;
    };

    for (int i = 0; i < M; ++i) {
        const float* te = wte + static_cast<long>(tokens[static_cast<std::size_t>(i)]) * C;
        const float* pe = wpe + static_cast<long>(pos0 + i) * C;
        float* o = x_ + static_cast<long>(i) * C;
        for (int j = 0; j < C; ++j)
            o[j] = te[j] + pe[j];
    }

    const float* lnfw = model_.layout.tensor(w, ParamTensor::lnfw).data();
    const float* lnfb = model_.layout.tensor(w, ParamTensor::lnfb).data();
    // One pool.run per forward; the phases inside are separated by barriers (4 per layer). Each
    // phase writes only its worker's share, and the next reads what all shares wrote.
    // The rows of a matrix starting at `weight` (a pointer into the fp32 parameters), in the
    // format this session decodes with.
    const auto rows_at = [&](const float* weight) {
        return compact_ != nullptr ? WeightRows{nullptr, compact_->rows(weight)}
                                   : WeightRows{weight, {}};
    };
    pool_.run([&](int worker) {
        float* scores = scores_ + scores_stride * static_cast<std::size_t>(worker);
        float* widen = widen_ + widen_stride_ * static_cast<std::size_t>(worker);
        float* stage = stage_ + stage_stride_ * static_cast<std::size_t>(worker);
        for (int l = 0; l < c.num_layers; ++l) {
            const LayerView<const float> p = layer_view(model_.layout, model_.weights(), l);
            // qkv and attention, by head: a head's attention needs only its own q, k and v.
            const float* ln = worker_ln(worker, x_, p.ln1w, p.ln1b, M);
            const Range heads = split_range(static_cast<std::size_t>(NH), worker, W);
            for (auto h = static_cast<int>(heads.begin); h < static_cast<int>(heads.end); ++h) {
                const long col = static_cast<long>(h) * hs;
                linear_slice(q_ + col, C, ln, M, C, rows_at(p.qkvw + col * C), p.qkvb + col, hs,
                             false, widen);
                const WeightRows wk = rows_at(p.qkvw + (C + col) * C);
                const WeightRows wv = rows_at(p.qkvw + (2L * C + col) * C);
                if (bf16_cache && M == 1) {
                    // One token: its key and value rounded into the bf16 cache, which the query
                    // then reads directly.
                    const HeadCacheBf16 store = head_cache_bf16(l, h);
                    float* row = scores + maxT;
                    wk.matvec_into(row, ln, hs, C, p.qkvb + C + col, false);
                    for (int d = 0; d < hs; ++d)
                        store.keys_t[static_cast<long>(d) * maxT + pos0] = to_bf16(row[d]);
                    wv.matvec_into(row, ln, hs, C, p.qkvb + 2 * C + col, false);
                    convert_to_bf16(store.values + static_cast<long>(pos0) * hs, row,
                                    static_cast<std::size_t>(hs));
                    attention_step_bf16(atty_ + col, q_ + col, store, scores, pos0, hs, maxT);
                    continue;
                }
                // fp32 cache, or a prompt with the bf16 cache: the fp32 path on a staging copy
                // of the head's earlier positions, the new ones rounded back afterwards.
                const HeadCache cache = bf16_cache
                                            ? HeadCache{stage, stage + static_cast<long>(maxT) * hs}
                                            : head_cache(l, h);
                if (bf16_cache)
                    copy_positions(head_cache_bf16(l, h), cache, 0, pos0, hs, maxT, true);
                append_keys(cache.keys_t, maxT, ln, M, C, wk, p.qkvb + C + col, hs, pos0,
                            scores + maxT, widen);
                linear_slice(cache.values + static_cast<long>(pos0) * hs, hs, ln, M, C, wv,
                             p.qkvb + 2 * C + col, hs, false, widen);
                if (bf16_cache) {
                    // Round the new positions, and attend with the rounded values as a step
                    // would (the prompt's logits then match token-by-token decoding).
                    copy_positions(head_cache_bf16(l, h), cache, pos0, pos0 + M, hs, maxT, false);
                    copy_positions(head_cache_bf16(l, h), cache, pos0, pos0 + M, hs, maxT, true);
                }
                attention_head(atty_ + col, q_ + col, cache, scores, M, pos0, C, hs, maxT);
            }
            barrier_->arrive_and_wait();
            // Attention projection onto the residual stream, by output column.
            const Range r = column_share(static_cast<std::size_t>(C), worker, W);
            const auto b = static_cast<long>(r.begin);
            const int n = static_cast<int>(r.end - r.begin);
            linear_slice(x_ + b, C, atty_, M, C, rows_at(p.attprojw + b * C), p.attprojb + b, n,
                         true, widen);
            barrier_->arrive_and_wait();
            // MLP up-projection and GELU, by hidden column.
            const float* ln2 = worker_ln(worker, x_, p.ln2w, p.ln2b, M);
            const Range r4 = column_share(4 * static_cast<std::size_t>(C), worker, W);
            const auto b4 = static_cast<long>(r4.begin);
            const int n4 = static_cast<int>(r4.end - r4.begin);
            linear_slice(fch_ + b4, 4 * C, ln2, M, C, rows_at(p.fcw + b4 * C), p.fcb + b4, n4,
                         false, widen);
            for (int i = 0; i < M; ++i) {
                float* h = fch_ + static_cast<long>(i) * 4 * C + b4;
                gelu_forward(h, h, n4);
            }
            barrier_->arrive_and_wait();
            // MLP down-projection onto the residual stream, by output column.
            linear_slice(x_ + b, C, fch_, M, 4 * C, rows_at(p.fcprojw + b * 4 * C), p.fcprojb + b,
                         n, true, widen);
            barrier_->arrive_and_wait();
        }
        if (!logits) return;
        // Final LayerNorm of the last row and the LM head (tied to wte), by vocabulary row; the
        // padded rows >= V are never predicted, so they are not computed.
        const float* lnf = worker_ln(worker, x_ + static_cast<long>(M - 1) * C, lnfw, lnfb, 1);
        const Range r = column_share(static_cast<std::size_t>(c.vocab_size), worker, W);
        rows_at(wte + static_cast<long>(r.begin) * C)
            .matvec_into(logits_ + r.begin, lnf, static_cast<int>(r.end - r.begin), C, nullptr,
                         false);
    });
    context_.insert(context_.end(), tokens.begin(), tokens.end());
}

GenerationStats generate_kv(KvCacheSession& session, std::vector<std::int32_t>& tokens, int count,
                            const SamplingParams& params, Rng& rng,
                            const std::function<void(std::int32_t)>& on_token, int vocab_limit) {
    if (tokens.empty()) throw std::invalid_argument("generate_kv: empty prompt");
    GenerationStats stats;
    if (count <= 0) {
        stats.prompt_tokens =
            std::min<int>(static_cast<int>(tokens.size()), session.config().max_seq_len);
        return stats;
    }
    using Clock = std::chrono::steady_clock;
    const int V = session.config().vocab_size;
    const auto limit = static_cast<std::size_t>(vocab_limit > 0 ? std::min(vocab_limit, V) : V);
    const int slides_before = session.slides();
    tokens.reserve(tokens.size() + static_cast<std::size_t>(count));
    std::vector<std::pair<float, int>> scratch;
    scratch.reserve(limit);

    const auto t0 = Clock::now();
    std::span<const float> logits = session.prefill(tokens);
    const auto t1 = Clock::now();
    stats.prompt_tokens = session.length();
    for (int n = 0; n < count; ++n) {
        const int next = sample_token(logits.first(limit), params, rng, scratch);
        tokens.push_back(next);
        ++stats.generated_tokens;
        if (on_token) on_token(next);
        if (n + 1 < count) logits = session.step(next);
    }
    const auto t2 = Clock::now();
    stats.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
    stats.generate_seconds = std::chrono::duration<double>(t2 - t1).count();
    stats.slides = session.slides() - slides_before;
    return stats;
}

}  // namespace gpt2
