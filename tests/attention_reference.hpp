// The attention kernel training used before flash attention, kept only as a test reference: it
// stores every (T x T) probability in att (B, NH, T, T) and backward reads them back.
#pragma once

#include <algorithm>
#include <cmath>

#include "ops/gemm.hpp"
#include "ops/kernels.hpp"

namespace gpt2::test {

inline constexpr int kTrainingQueryRows = 64;

inline void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C,
                              int NH) {
    const int hs = C / NH;
    const int C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    for (int b = 0; b < B; ++b) {
        for (int h = 0; h < NH; ++h) {
            const float* q = qkv + static_cast<long>(b) * T * C3 + h * hs;
            const float* k = q + C;
            const float* v = q + 2 * C;
            float* a = att + (static_cast<long>(b) * NH + h) * T * T;
            float* o = out + static_cast<long>(b) * T * C + h * hs;
            for (int i0 = 0; i0 < T; i0 += kTrainingQueryRows) {
                const int i1 = std::min(T, i0 + kTrainingQueryRows);
                float* rows = a + static_cast<long>(i0) * T;
                // Scores against the keys visible to this block, then a causal softmax per row.
                gemm_nt(i1 - i0, i1, hs, scale, q + static_cast<long>(i0) * C3, C3, k, C3, 0.0f,
                        rows, T);
                for (int i = i0; i < i1; ++i) {
                    float* row = a + static_cast<long>(i) * T;
                    causal_softmax_row(row, i + 1, T);
                }
                gemm_nn(i1 - i0, hs, i1, 1.0f, rows, T, v, C3, 0.0f, o + static_cast<long>(i0) * C,
                        C);
            }
        }
    }
}

inline int attention_backward_scratch_size(int T) {
    return kTrainingQueryRows * T;
}

inline void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                               const float* att, int B, int T, int C, int NH) {
    const int hs = C / NH;
    const int C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const int num_blocks = (T + kTrainingQueryRows - 1) / kTrainingQueryRows;
    for (int b = 0; b < B; ++b) {
        for (int h = 0; h < NH; ++h) {
            const long base = static_cast<long>(b) * T * C3 + h * hs;
            const float* q = qkv + base;
            const float* k = q + C;
            const float* v = q + 2 * C;
            float* dq = dqkv + base;
            float* dk = dq + C;
            float* dv = dq + 2 * C;
            const float* a = att + (static_cast<long>(b) * NH + h) * T * T;
            const float* d = dout + static_cast<long>(b) * T * C + h * hs;
            // Last block first: it sees every key, so it initialises all rows of dk and dv and
            // the earlier blocks can accumulate.
            for (int blk = num_blocks - 1; blk >= 0; --blk) {
                const int i0 = blk * kTrainingQueryRows;
                const int i1 = std::min(T, i0 + kTrainingQueryRows);
                const int rows = i1 - i0;
                const float beta = blk == num_blocks - 1 ? 0.0f : 1.0f;
                const float* p = a + static_cast<long>(i0) * T;
                const float* drow = d + static_cast<long>(i0) * C;
                // dv[0:i1] += p^T @ dout
                gemm_tn(i1, hs, rows, 1.0f, p, T, drow, C, beta, dv, C3);
                // dp = dout @ v^T, then softmax backward in place: ds = p * (dp - sum(p * dp)).
                float* ds = scratch;
                gemm_nt(rows, i1, hs, 1.0f, drow, C, v, C3, 0.0f, ds, i1);
                for (int r = 0; r < rows; ++r) {
                    const float* prow = p + static_cast<long>(r) * T;
                    float* srow = ds + static_cast<long>(r) * i1;
                    const int visible = i0 + r + 1;
                    float dot = 0.0f;
                    for (int j = 0; j < visible; ++j)
                        dot += prow[j] * srow[j];
                    for (int j = 0; j < visible; ++j)
                        srow[j] = prow[j] * (srow[j] - dot);
                    for (int j = visible; j < i1; ++j)
                        srow[j] = 0.0f;
                }
                // dq[i0:i1] = scale * ds @ k[0:i1];  dk[0:i1] += scale * ds^T @ q[i0:i1]
                gemm_nn(rows, hs, i1, scale, ds, i1, k, C3, 0.0f, dq + static_cast<long>(i0) * C3,
                        C3);
                gemm_tn(i1, hs, rows, scale, ds, i1, q + static_cast<long>(i0) * C3, C3, beta, dk,
                        C3);
            }
        }
    }
}

}  // namespace gpt2::test
