#include "ops/attention.hpp"

#include <algorithm>
#include <cmath>

#include "ops/gemm.hpp"
#include "ops/vector_math.hpp"

namespace gpt2 {

namespace {
// One head of one sequence inside qkv (B, T, 3C) and out/dout (B, T, C).
struct Head {
    const float *q, *k, *v;  // row stride 3C
    long lse;                // first of its T statistics in lse (B, NH, T)
};

Head head_of(const float* qkv, int b, int h, int T, int C, int NH) {
    const float* q = qkv + static_cast<long>(b) * T * 3 * C + static_cast<long>(h) * (C / NH);
    return Head{q, q + C, q + 2 * C, (static_cast<long>(b) * NH + h) * T};
}

// A panel of scaled scores (rows x keys, row stride `keys`) for query rows [i0, i0 + rows) against
// keys [0, keys): the same product in forward and backward, so both see the same scores.
void scores_panel(float* panel, const Head& hd, int i0, int rows, int keys, int hs, int C3,
                  float scale) {
    gemm_nt(rows, keys, hs, scale, hd.q + static_cast<long>(i0) * C3, C3, hd.k, C3, 0.0f, panel,
            keys);
}

// Lanes of the row reductions below: element j goes to lane j % kLanes and the lanes combine in a
// fixed order, so the compiler can vectorise them (a single running sum cannot be reordered) and
// every CPU gets the same result.
constexpr int kLanes = 16;

template <typename Combine>
float reduce_lanes(const float* x, int n, float init, Combine combine) {
    float lane[kLanes];
    std::fill(lane, lane + kLanes, init);
    int j = 0;
    for (; j + kLanes <= n; j += kLanes) {
        for (int l = 0; l < kLanes; ++l)
            lane[l] = combine(lane[l], x[j + l]);
    }
    for (int l = 0; j + l < n; ++l)
        lane[l] = combine(lane[l], x[j + l]);
    float result = lane[0];
    for (int l = 1; l < kLanes; ++l)
        result = combine(result, lane[l]);
    return result;
}

// Forward: a row of scores becomes its softmax over [0, visible), zeros in [visible, end);
// returns the row's log-sum-exp. One pass of exp, as a plain softmax takes.
float softmax_row(float* row, int visible, int end) {
    const float maxv =
        reduce_lanes(row, visible, row[0], [](float a, float b) { return std::max(a, b); });
    for (int j = 0; j < visible; ++j)
        row[j] = vexp(row[j] - maxv);
    const float sum = reduce_lanes(row, visible, 0.0f, [](float a, float b) { return a + b; });
    const float inv = 1.0f / sum;
    for (int j = 0; j < visible; ++j)
        row[j] *= inv;
    std::fill(row + visible, row + end, 0.0f);
    return maxv + std::log(sum);
}

// Backward: a row of scores becomes exp(s - lse) over [0, visible), zeros in [visible, end): the
// forward's probabilities up to rounding (a few units in the last place).
void probabilities_row(float* row, int visible, int end, float lse) {
    for (int j = 0; j < visible; ++j)
        row[j] = vexp(row[j] - lse);
    std::fill(row + visible, row + end, 0.0f);
}

// Forward's dropout of a row of probabilities over [0, visible): element `first + j` of sequence b.
void drop_row(float* row, int visible, const DropoutMask& dropout, int b, long first) {
    const std::uint64_t key = dropout.sequence_key(b);
    const std::uint32_t threshold = dropout.threshold();
    const float scale = dropout.scale();
    for (int j = 0; j < visible; ++j) {
        const auto e = static_cast<std::uint32_t>(first + j);
        row[j] *= dropout_keeps(key, e, threshold) ? scale : 0.0f;  // no branch: it vectorises
    }
}

// Backward's row with dropout: srow holds dD (the gradient of the dropped probabilities) and
// becomes dS; prow holds P and becomes D.
void drop_gradient_row(float* prow, float* srow, int visible, int end, float dot,
                       const DropoutMask& dropout, int b, long first) {
    const std::uint64_t key = dropout.sequence_key(b);
    const std::uint32_t threshold = dropout.threshold();
    const float scale = dropout.scale();
    for (int j = 0; j < end; ++j) {
        const float m =
            j < visible && dropout_keeps(key, static_cast<std::uint32_t>(first + j), threshold)
                ? scale
                : 0.0f;
        srow[j] = prow[j] * (m * srow[j] - dot);
        prow[j] *= m;
    }
}

}  // namespace

std::size_t attention_scratch_floats(int T) {
    // backward: the probabilities panel, its gradient panel and one dO.O per query row.
    const auto panel = static_cast<std::size_t>(kAttentionQueryRows) * static_cast<std::size_t>(T);
    return 2 * panel + kAttentionQueryRows;
}

void attention_forward(float* out, float* lse, float* scratch, const float* qkv, int B, int T,
                       int C, int NH, const DropoutMask& dropout) {
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    float* panel = scratch;
    for (int b = 0; b < B; ++b) {
        for (int h = 0; h < NH; ++h) {
            const Head hd = head_of(qkv, b, h, T, C, NH);
            float* o = out + static_cast<long>(b) * T * C + static_cast<long>(h) * hs;
            for (int i0 = 0; i0 < T; i0 += kAttentionQueryRows) {
                // Query rows [i0, i1) see keys [0, i1): nothing above the diagonal's block.
                const int i1 = std::min(T, i0 + kAttentionQueryRows), rows = i1 - i0;
                scores_panel(panel, hd, i0, rows, i1, hs, C3, scale);
                for (int r = 0; r < rows; ++r) {
                    float* row = panel + static_cast<long>(r) * i1;
                    lse[hd.lse + i0 + r] = softmax_row(row, i0 + r + 1, i1);
                    if (dropout.active())
                        drop_row(row, i0 + r + 1, dropout, b,
                                 (static_cast<long>(h) * T + i0 + r) * T);
                }
                // out[i0:i1] = P @ v[0:i1]
                gemm_nn(rows, hs, i1, 1.0f, panel, i1, hd.v, C3, 0.0f,
                        o + static_cast<long>(i0) * C, C);
            }
        }
    }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* out,
                        const float* lse, const float* qkv, int B, int T, int C, int NH,
                        const DropoutMask& dropout) {
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const int num_panels = (T + kAttentionQueryRows - 1) / kAttentionQueryRows;
    float* const p = scratch;                                                // (rows, i1)
    float* const ds = scratch + static_cast<long>(kAttentionQueryRows) * T;  // (rows, i1)
    float* const row_dot = ds + static_cast<long>(kAttentionQueryRows) * T;  // (rows)
    for (int b = 0; b < B; ++b) {
        for (int h = 0; h < NH; ++h) {
            const Head hd = head_of(qkv, b, h, T, C, NH);
            const long offset = hd.q - qkv;
            float* dq = dqkv + offset;
            float* dk = dq + C;
            float* dv = dq + 2 * C;
            const long io = static_cast<long>(b) * T * C + static_cast<long>(h) * hs;
            // The last panel sees every key, so it initialises all rows of dk and dv (beta 0) and
            // the earlier panels accumulate into them.
            for (int panel = num_panels - 1; panel >= 0; --panel) {
                const int i0 = panel * kAttentionQueryRows;
                const int i1 = std::min(T, i0 + kAttentionQueryRows), rows = i1 - i0;
                const float beta = panel == num_panels - 1 ? 0.0f : 1.0f;
                const float* d = dout + io + static_cast<long>(i0) * C;
                const float* o = out + io + static_cast<long>(i0) * C;
                // sum_j P_ij dP_ij = dO_i . O_i: the softmax backward's row term, once per row.
                for (int r = 0; r < rows; ++r) {
                    float dot = 0.0f;
                    for (int e = 0; e < hs; ++e)
                        dot += d[static_cast<long>(r) * C + e] * o[static_cast<long>(r) * C + e];
                    row_dot[r] = dot;
                }
                scores_panel(p, hd, i0, rows, i1, hs, C3, scale);
                for (int r = 0; r < rows; ++r)
                    probabilities_row(p + static_cast<long>(r) * i1, i0 + r + 1, i1,
                                      lse[hd.lse + i0 + r]);
                if (!dropout.active()) {
                    // dv[0:i1] += P^T @ dO
                    gemm_tn(i1, hs, rows, 1.0f, p, i1, d, C, beta, dv, C3);
                    // dP = dO @ v^T, then dS = P * (dP - dO.O) (zero where P is).
                    gemm_nt(rows, i1, hs, 1.0f, d, C, hd.v, C3, 0.0f, ds, i1);
                    for (int r = 0; r < rows; ++r) {
                        const float* prow = p + static_cast<long>(r) * i1;
                        float* srow = ds + static_cast<long>(r) * i1;
                        const float dot = row_dot[r];
                        for (int j = 0; j < i1; ++j)
                            srow[j] = prow[j] * (srow[j] - dot);
                    }
                } else {
                    // With the dropped probabilities D = M * P / (1 - rate): dD = dO @ v^T,
                    // dP = M * dD / (1 - rate), dS = P * (dP - dO.O) (dO.O is still sum_j P dP),
                    // and dv[0:i1] += D^T @ dO, D made in place of P once dS is done.
                    gemm_nt(rows, i1, hs, 1.0f, d, C, hd.v, C3, 0.0f, ds, i1);
                    for (int r = 0; r < rows; ++r) {
                        drop_gradient_row(p + static_cast<long>(r) * i1,
                                          ds + static_cast<long>(r) * i1, i0 + r + 1, i1,
                                          row_dot[r], dropout, b,
                                          (static_cast<long>(h) * T + i0 + r) * T);
                    }
                    gemm_tn(i1, hs, rows, 1.0f, p, i1, d, C, beta, dv, C3);
                }
                // dq[i0:i1] = scale * dS @ k[0:i1];  dk[0:i1] += scale * dS^T @ q[i0:i1]
                gemm_nn(rows, hs, i1, scale, ds, i1, hd.k, C3, 0.0f,
                        dq + static_cast<long>(i0) * C3, C3);
                gemm_tn(i1, hs, rows, scale, ds, i1, hd.q + static_cast<long>(i0) * C3, C3, beta,
                        dk, C3);
            }
        }
    }
}

}  // namespace gpt2
