#include "ops/decode_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/bf16.hpp"
#include "ops/gemm.hpp"
#include "ops/kernels.hpp"
#include "ops/prompt_products.hpp"
#include "ops/vector_math.hpp"

namespace gpt2 {

namespace {

// One cached element as fp32 (bf16 converts exactly).
inline float cached_as_float(float v) {
    return v;
}
inline float cached_as_float(Bf16 v) {
    return to_float(v);
}

// A prompt row's scores become their softmax over [0, visible), zeros in [visible, end). The
// maximum and the sum run in kLanes lanes combined in a fixed order, so that they vectorise
// (a prompt's rows are where attention's time goes: one running sum left it scalar).
void softmax_prompt_row(float* row, int visible, int end) {
    constexpr int kLanes = 16;
    float lane[kLanes];
    std::fill(lane, lane + kLanes, row[0]);
    const int body = visible / kLanes * kLanes;
    for (int j = 0; j < body; j += kLanes) {
        for (int l = 0; l < kLanes; ++l)
            lane[l] = lane[l] < row[j + l] ? row[j + l] : lane[l];
    }
    for (int j = body; j < visible; ++j)
        lane[0] = lane[0] < row[j] ? row[j] : lane[0];
    float maxv = lane[0];
    for (int l = 1; l < kLanes; ++l)
        maxv = maxv < lane[l] ? lane[l] : maxv;
    std::fill(lane, lane + kLanes, 0.0f);
    for (int j = 0; j < body; j += kLanes) {
        for (int l = 0; l < kLanes; ++l) {
            row[j + l] = vexp(row[j + l] - maxv);
            lane[l] += row[j + l];
        }
    }
    for (int j = body; j < visible; ++j) {
        row[j] = vexp(row[j] - maxv);
        lane[0] += row[j];
    }
    float sum = 0.0f;
    for (int l = 0; l < kLanes; ++l)
        sum += lane[l];
    const float inv = 1.0f / sum;
    for (int j = 0; j < visible; ++j)
        row[j] *= inv;
    std::fill(row + visible, row + end, 0.0f);
}

}  // namespace

template <typename T>
void attend_one_query(float* out, const float* q, const T* keys_t, const T* values, float* scores,
                      int pos, int hs, int maxT) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const int keys = pos + 1;
    // A cache line of elements, and so the prefetch distances below are the same in bytes for
    // either element type.
    constexpr int kLineElements = 64 / sizeof(T);
    float* __restrict s = scores;
    for (int j = 0; j < keys; ++j)
        s[j] = 0.0f;
    // The key rows are short strided streams the hardware prefetchers pick up late: ask for the
    // row two ahead while this one is summed (faster at long contexts: docs/performance.md).
    for (int d = 0; d < hs; ++d) {
        const float qd = q[d];
        const T* __restrict kd = keys_t + static_cast<long>(d) * maxT;
        if (d + 2 < hs) {
            for (int j = 0; j < keys; j += kLineElements)
                __builtin_prefetch(kd + 2L * maxT + j);
        }
        for (int j = 0; j < keys; ++j)
            s[j] += qd * cached_as_float(kd[j]);
    }
    for (int j = 0; j < keys; ++j)
        s[j] *= scale;
    causal_softmax_row(s, keys, keys);
    float* __restrict o = out;
    for (int d = 0; d < hs; ++d)
        o[d] = 0.0f;
    for (int j = 0; j < keys; ++j) {
        const float a = s[j];
        const T* __restrict vj = values + static_cast<long>(j) * hs;
        __builtin_prefetch(vj + static_cast<long>(kLineElements) * hs);  // 64 * hs bytes ahead
        for (int d = 0; d < hs; ++d)
            o[d] += a * cached_as_float(vj[d]);
    }
}

template void attend_one_query(float*, const float*, const float*, const float*, float*, int, int,
                               int);
template void attend_one_query(float*, const float*, const Bf16*, const Bf16*, float*, int, int,
                               int);

void attend_prompt_rows(float* out, int ldo, const float* q, int ldq, const float* keys_t,
                        const float* values, float* scores, int M, int pos0, int hs, int maxT) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    for (int i0 = 0; i0 < M; i0 += kPromptScoreRows) {
        const int i1 = std::min(M, i0 + kPromptScoreRows);
        const int keys = pos0 + i1;  // visible to the block's last row
        gemm_nn(i1 - i0, keys, hs, scale, q + static_cast<long>(i0) * ldq, ldq, keys_t, maxT, 0.0f,
                scores, maxT);
        for (int i = i0; i < i1; ++i)
            softmax_prompt_row(scores + static_cast<long>(i - i0) * maxT, pos0 + i + 1, keys);
        gemm_nn(i1 - i0, hs, keys, 1.0f, scores, maxT, values, hs, 0.0f,
                out + static_cast<long>(i0) * ldo, ldo);
    }
}

namespace {
// Keys are covered in blocks of this many positions by the bf16 products.
constexpr int kKeyBlock = 64;

[[nodiscard]] int padded_keys(int keys, int maxT) {
    return std::min(maxT, (keys + kKeyBlock - 1) / kKeyBlock * kKeyBlock);
}
}  // namespace

std::size_t prompt_attention_scratch_pieces(int hs, int maxT) {
    // The queries' pieces, then the probabilities' (one block of rows each).
    return static_cast<std::size_t>(kBf16Pieces) * kPromptScoreRows *
           static_cast<std::size_t>(hs + maxT);
}

std::size_t prompt_attention_scratch_floats(int hs, int maxT) {
    // The pieces' scores, then their outputs.
    return static_cast<std::size_t>(kBf16Pieces) * kPromptScoreRows *
           static_cast<std::size_t>(maxT + hs);
}

void attend_prompt_rows_bf16(float* out, int ldo, const float* q, int ldq, Bf16* keys_t,
                             Bf16* values, const PromptAttentionScratch& scratch, int M, int pos0,
                             int hs, int maxT) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    constexpr int rows = kPromptScoreRows, stacked = kBf16Pieces * kPromptScoreRows;
    const int end = pos0 + M, padded_end = padded_keys(end, maxT);
    for (int d = 0; d < hs; ++d) {
        std::fill(keys_t + static_cast<long>(d) * maxT + end,
                  keys_t + static_cast<long>(d) * maxT + padded_end, Bf16{});
    }
    std::fill(values + static_cast<long>(end) * hs, values + static_cast<long>(padded_end) * hs,
              Bf16{});
    Bf16* q_pieces = scratch.pieces;
    Bf16* p_pieces = q_pieces + static_cast<long>(stacked) * hs;
    float* scores = scratch.scores;  // (stacked, maxT): each piece's scores
    float* outputs = scores + static_cast<long>(stacked) * maxT;  // (stacked, hs)
    for (int i0 = 0; i0 < M; i0 += rows) {
        const int block = std::min(rows, M - i0);
        const int keys = padded_keys(pos0 + i0 + block, maxT);
        split_into_bf16_pieces(q_pieces, q + static_cast<long>(i0) * ldq, ldq, block, rows, hs, 0,
                               rows);
        gemm_bf16_nn(stacked, keys, hs, q_pieces, hs, keys_t, maxT, 0.0f, scores, maxT);
        // The pieces' scores summed into the first piece's rows, then each row's softmax.
        const long piece = static_cast<long>(rows) * maxT;
        for (int r = 0; r < block; ++r) {
            float* s = scores + static_cast<long>(r) * maxT;
            const float* mid = s + piece;
            const float* lo = mid + piece;
            for (int j = 0; j < keys; ++j)
                s[j] = ((s[j] + mid[j]) + lo[j]) * scale;
            softmax_prompt_row(s, pos0 + i0 + r + 1, keys);
        }
        split_into_bf16_pieces(p_pieces, scores, maxT, block, rows, keys, 0, rows);
        gemm_bf16_nn(stacked, hs, keys, p_pieces, keys, values, hs, 0.0f, outputs, hs);
        for (int r = 0; r < block; ++r) {
            const float* hi = outputs + static_cast<long>(r) * hs;
            const float* mid = hi + static_cast<long>(rows) * hs;
            const float* lo = mid + static_cast<long>(rows) * hs;
            float* o = out + static_cast<long>(i0 + r) * ldo;
            for (int d = 0; d < hs; ++d)
                o[d] = (hi[d] + mid[d]) + lo[d];
        }
    }
}

}  // namespace gpt2
