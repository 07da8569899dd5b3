#include "ops/attention.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

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
// keys [k0, k0 + keys): the same product in forward and backward, so both see the same scores.
void scores_panel(float* panel, const Head& hd, int i0, int rows, int k0, int keys, int hs, int C3,
                  float scale) {
    gemm_nt(rows, keys, hs, scale, hd.q + static_cast<long>(i0) * C3, C3,
            hd.k + static_cast<long>(k0) * C3, C3, 0.0f, panel, keys);
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

// Forward: a row of scores becomes its softmax over the keys it sees, [first, visible), zeros in
// [0, first) and [visible, end); returns the row's log-sum-exp over those keys. One pass of exp,
// as a plain softmax takes. first is 0 without document masking.
float softmax_row(float* row, int first, int visible, int end) {
    float* const seen = row + first;
    const int n = visible - first;
    const float maxv =
        reduce_lanes(seen, n, seen[0], [](float a, float b) { return std::max(a, b); });
    for (int j = 0; j < n; ++j)
        seen[j] = vexp(seen[j] - maxv);
    const float sum = reduce_lanes(seen, n, 0.0f, [](float a, float b) { return a + b; });
    const float inv = 1.0f / sum;
    for (int j = 0; j < n; ++j)
        seen[j] *= inv;
    std::fill(row, seen, 0.0f);
    std::fill(row + visible, row + end, 0.0f);
    return maxv + std::log(sum);
}

// Backward: a row of scores becomes exp(s - lse) over [first, visible), zeros in [0, first) and
// [visible, end): the forward's probabilities up to rounding (a few units in the last place).
void probabilities_row(float* row, int first, int visible, int end, float lse) {
    for (int j = first; j < visible; ++j)
        row[j] = vexp(row[j] - lse);
    std::fill(row, row + first, 0.0f);
    std::fill(row + visible, row + end, 0.0f);
}

// Forward's dropout of a row of probabilities over [first, visible): row[j] is element
// `element0 + j` of sequence b.
void drop_row(float* row, int first, int visible, const DropoutMask& dropout, int b,
              long element0) {
    const std::uint64_t key = dropout.sequence_key(b);
    const std::uint32_t threshold = dropout.threshold();
    const float scale = dropout.scale();
    for (int j = first; j < visible; ++j) {
        const auto e = static_cast<std::uint32_t>(element0 + j);
        row[j] *= dropout_keeps(key, e, threshold) ? scale : 0.0f;  // no branch: it vectorises
    }
}

// Backward's row with dropout: srow holds dD (the gradient of the dropped probabilities) and
// becomes dS; prow holds P (zero outside [first, visible)) and becomes D.
void drop_gradient_row(float* prow, float* srow, int first, int visible, int end, float dot,
                       const DropoutMask& dropout, int b, long element0) {
    const std::uint64_t key = dropout.sequence_key(b);
    const std::uint32_t threshold = dropout.threshold();
    const float scale = dropout.scale();
    for (int j = 0; j < end; ++j) {
        const float m =
            j >= first && j < visible &&
                    dropout_keeps(key, static_cast<std::uint32_t>(element0 + j), threshold)
                ? scale
                : 0.0f;
        srow[j] = prow[j] * (m * srow[j] - dot);
        prow[j] *= m;
    }
}

// The first key query row i of sequence b sees: its document's first token, or 0 without
// document masking.
int first_key(std::span<const std::int32_t> first_keys, int b, int T, int i) {
    return first_keys.empty() ? 0 : first_keys[static_cast<std::size_t>(b) * T + i];
}

// The first key any of query rows [i0, i1) sees: keys left of it are no row's, so the panel skips
// them (0 without document masking).
int panel_first_key(std::span<const std::int32_t> first_keys, int b, int T, int i0, int i1) {
    if (first_keys.empty()) return 0;
    const auto row0 = first_keys.begin() + static_cast<long>(b) * T;
    return *std::min_element(row0 + i0, row0 + i1);
}

void check_first_keys(std::span<const std::int32_t> first_keys, int B, int T) {
    if (!first_keys.empty() && first_keys.size() != static_cast<std::size_t>(B) * T) {
        throw std::invalid_argument("attention: document first keys are not one per token");
    }
}

}  // namespace

std::size_t attention_scratch_floats(int T) {
    // backward: the probabilities panel, its gradient panel and one dO.O per query row.
    const auto panel = static_cast<std::size_t>(kAttentionQueryRows) * static_cast<std::size_t>(T);
    return 2 * panel + kAttentionQueryRows;
}

void attention_forward(float* out, float* lse, float* scratch, const float* qkv, int B, int T,
                       int C, int NH, const DropoutMask& dropout,
                       std::span<const std::int32_t> first_keys) {
    check_first_keys(first_keys, B, T);
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    float* panel = scratch;
    for (int b = 0; b < B; ++b) {
        for (int h = 0; h < NH; ++h) {
            const Head hd = head_of(qkv, b, h, T, C, NH);
            float* o = out + static_cast<long>(b) * T * C + static_cast<long>(h) * hs;
            for (int i0 = 0; i0 < T; i0 += kAttentionQueryRows) {
                // Query rows [i0, i1) see keys [k0, i1): nothing above the diagonal's block, nor
                // (document masking) left of the rows' earliest document.
                const int i1 = std::min(T, i0 + kAttentionQueryRows), rows = i1 - i0;
                const int k0 = panel_first_key(first_keys, b, T, i0, i1), keys = i1 - k0;
                scores_panel(panel, hd, i0, rows, k0, keys, hs, C3, scale);
                for (int r = 0; r < rows; ++r) {
                    float* row = panel + static_cast<long>(r) * keys;
                    const int first = first_key(first_keys, b, T, i0 + r) - k0;
                    const int visible = i0 + r + 1 - k0;
                    lse[hd.lse + i0 + r] = softmax_row(row, first, visible, keys);
                    if (dropout.active())
                        drop_row(row, first, visible, dropout, b,
                                 (static_cast<long>(h) * T + i0 + r) * T + k0);
                }
                // out[i0:i1] = P @ v[k0:i1]
                gemm_nn(rows, hs, keys, 1.0f, panel, keys, hd.v + static_cast<long>(k0) * C3, C3,
                        0.0f, o + static_cast<long>(i0) * C, C);
            }
        }
    }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* out,
                        const float* lse, const float* qkv, int B, int T, int C, int NH,
                        const DropoutMask& dropout, std::span<const std::int32_t> first_keys) {
    check_first_keys(first_keys, B, T);
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
            // The last panel sees every key (from its k0 on: the rows before are zeroed here), so
            // it initialises all rows of dk and dv (beta 0) and the earlier panels accumulate
            // into them.
            const int last_k0 =
                panel_first_key(first_keys, b, T, (num_panels - 1) * kAttentionQueryRows, T);
            for (int j = 0; j < last_k0; ++j) {
                std::fill_n(dk + static_cast<long>(j) * C3, hs, 0.0f);
                std::fill_n(dv + static_cast<long>(j) * C3, hs, 0.0f);
            }
            for (int panel = num_panels - 1; panel >= 0; --panel) {
                const int i0 = panel * kAttentionQueryRows;
                const int i1 = std::min(T, i0 + kAttentionQueryRows), rows = i1 - i0;
                const int k0 = panel_first_key(first_keys, b, T, i0, i1), keys = i1 - k0;
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
                scores_panel(p, hd, i0, rows, k0, keys, hs, C3, scale);
                for (int r = 0; r < rows; ++r)
                    probabilities_row(p + static_cast<long>(r) * keys,
                                      first_key(first_keys, b, T, i0 + r) - k0, i0 + r + 1 - k0,
                                      keys, lse[hd.lse + i0 + r]);
                const long kv0 = static_cast<long>(k0) * C3;  // key k0's row in k, v, dk and dv
                if (!dropout.active()) {
                    // dv[k0:i1] += P^T @ dO
                    gemm_tn(keys, hs, rows, 1.0f, p, keys, d, C, beta, dv + kv0, C3);
                    // dP = dO @ v^T, then dS = P * (dP - dO.O) (zero where P is).
                    gemm_nt(rows, keys, hs, 1.0f, d, C, hd.v + kv0, C3, 0.0f, ds, keys);
                    for (int r = 0; r < rows; ++r) {
                        const float* prow = p + static_cast<long>(r) * keys;
                        float* srow = ds + static_cast<long>(r) * keys;
                        const float dot = row_dot[r];
                        for (int j = 0; j < keys; ++j)
                            srow[j] = prow[j] * (srow[j] - dot);
                    }
                } else {
                    // With the dropped probabilities D = M * P / (1 - rate): dD = dO @ v^T,
                    // dP = M * dD / (1 - rate), dS = P * (dP - dO.O) (dO.O is still sum_j P dP),
                    // and dv[k0:i1] += D^T @ dO, D made in place of P once dS is done.
                    gemm_nt(rows, keys, hs, 1.0f, d, C, hd.v + kv0, C3, 0.0f, ds, keys);
                    for (int r = 0; r < rows; ++r) {
                        drop_gradient_row(
                            p + static_cast<long>(r) * keys, ds + static_cast<long>(r) * keys,
                            first_key(first_keys, b, T, i0 + r) - k0, i0 + r + 1 - k0, keys,
                            row_dot[r], dropout, b, (static_cast<long>(h) * T + i0 + r) * T + k0);
                    }
                    gemm_tn(keys, hs, rows, 1.0f, p, keys, d, C, beta, dv + kv0, C3);
                }
                // dq[i0:i1] = scale * dS @ k[k0:i1];  dk[k0:i1] += scale * dS^T @ q[i0:i1]
                gemm_nn(rows, hs, keys, scale, ds, keys, hd.k + kv0, C3, 0.0f,
                        dq + static_cast<long>(i0) * C3, C3);
                gemm_tn(keys, hs, rows, scale, ds, keys, hd.q + static_cast<long>(i0) * C3, C3,
                        beta, dk + kv0, C3);
            }
        }
    }
}

void document_first_keys(std::span<std::int32_t> first_keys, std::span<const std::int32_t> tokens,
                         int B, int T, std::int32_t document_start) {
    const std::size_t n = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
    if (first_keys.size() < n || tokens.size() < n) {
        throw std::invalid_argument("document_first_keys: fewer than B * T tokens or keys");
    }
    for (int b = 0; b < B; ++b) {
        const std::size_t row0 = static_cast<std::size_t>(b) * static_cast<std::size_t>(T);
        std::int32_t first = 0;
        for (int t = 0; t < T; ++t) {
            if (tokens[row0 + t] == document_start) first = t;
            first_keys[row0 + t] = first;
        }
    }
}

}  // namespace gpt2
