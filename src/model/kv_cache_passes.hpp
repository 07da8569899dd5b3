// What a KvCacheSession's two forward passes share (kv_cache_prompt.cpp, kv_cache_token.cpp): the
// workers' column shares, weight rows in the decoding format, a head's cache, run_workers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/range.hpp"
#include "model/decode_weights.hpp"
#include "model/kv_cache.hpp"
#include "ops/bf16.hpp"
#include "ops/decode_matvec.hpp"
#include "threads/barrier.hpp"

namespace gpt2 {
namespace kv_cache_detail {

// Column shares are multiples of a cache line so workers never write the same line.
constexpr std::size_t kLineFloats = 16;
// Compact weight rows converted to fp32 per GEMM call (bounds the scratch they are copied into).
// 32 rather than 64: how the GEMM sums decides which way a key or value that falls on a bf16
// rounding edge goes in the cache; over 200 20-token prompts of the prompt-vs-token test's model,
// 32 left the logits more than 1e-5 from the token path's twice in each format, 64 five and six
// times (a rounding edge is a step of 2^-8 in one cached value: no order avoids them all).
constexpr int kFp32RowsPerGemm = 32;
// Pieces products run on rows padded to a multiple of this, so that prompts of different lengths
// share oneDNN's primitives (created once per shape and worker) instead of each creating its own;
// the session's pieces buffers hold a chunk's rows padded so (a maxT of 24 pads to 32).
constexpr int kPiecesRowMultiple = 16;
// Output columns per pieces product: its partial results (3 x 256 rows x 256 columns) stay in L2
// for the sum that follows; 512 took some 15% longer, 128 no less.
constexpr int kPiecesColumns = 256;

// Worker w's share of n columns, cut at cache-line multiples.
[[nodiscard]] inline Range column_share(std::size_t n, int w, int W) {
    const Range units = split_range((n + kLineFloats - 1) / kLineFloats, w, W);
    return Range{std::min(n, units.begin * kLineFloats), std::min(n, units.end * kLineFloats)};
}

// n rows of K weights starting at one row of a matrix, in whichever format decoding reads: the
// fp32 parameters, or their bf16/int8 copy (DecodeWeights).
struct WeightRows {
    const float* fp32 = nullptr;
    QuantizedRows compact;

    // y[j] = (accumulate ? y[j] : 0) + bias[j] + rows[j] . x, for j < n.
    void matvec_into(float* y, const float* x, int n, int K, const float* bias,
                     bool accumulate) const {
        if (compact.bf16 != nullptr) {
            matvec(y, x, compact.bf16, n, K, bias, accumulate);
        } else if (compact.int8 != nullptr) {
            matvec(y, x, compact.int8, compact.scales, n, K, bias, accumulate);
        } else {
            matvec(y, x, fp32, n, K, bias, accumulate);
        }
    }
    // The same for several vectors, each row read once for all: ys[v] as matvec_into(ys[v],
    // xs[v], ...) computes it, bit for bit.
    void matvec_many_into(std::span<float* const> ys, std::span<const float* const> xs, int n,
                          int K, const float* bias, bool accumulate) const {
        if (compact.bf16 != nullptr) {
            matvec_many(ys, xs, compact.bf16, n, K, bias, accumulate);
        } else if (compact.int8 != nullptr) {
            matvec_many(ys, xs, compact.int8, compact.scales, n, K, bias, accumulate);
        } else {
            matvec_many(ys, xs, fp32, n, K, bias, accumulate);
        }
    }
    // Rows [r0, r0 + count) as fp32 for a GEMM: the parameters themselves, or a copy in `scratch`
    // (count * K floats), bf16 converted exactly, int8 multiplied by its row's scale.
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

// The `count` rows of a matrix starting at `weight` (a pointer into the fp32 parameters), in the
// format the session decodes with (`compact`, or the parameters when null). No rows are looked up
// for an empty share: with more workers than cache lines of columns, one may start at the
// matrix's end, which DecodeWeights::rows refuses (and nothing reads them).
[[nodiscard]] inline WeightRows weight_rows(const DecodeWeights* compact, const float* weight,
                                            long count) {
    return compact != nullptr && count > 0 ? WeightRows{nullptr, compact->rows(weight)}
                                           : WeightRows{weight, {}};
}

// One head's cache, laid out as ops/decode_attention.hpp says: keys transposed (hs, maxT), values
// (maxT, hs), each maxT * hs elements. T is float, or Bf16 for sessions with compact weights
// (half the bytes a token's attention reads).
template <typename T>
struct HeadCache {
    T* keys_t;  // [d * maxT + position]
    T* values;  // [position * hs + d]
};

}  // namespace kv_cache_detail

template <typename Forward>
void KvCacheSession::run_workers(Forward&& forward) {
    // A worker that fails releases the others from the barrier (they leave with BarrierAborted)
    // instead of leaving them waiting for it forever; the pool rethrows its error.
    barrier_->reset();
    pool_.run([&](int worker) {
        try {
            forward(worker);
        } catch (const BarrierAborted&) {
            return;
        } catch (...) {
            barrier_->abort();
            throw;
        }
    });
}

}  // namespace gpt2
