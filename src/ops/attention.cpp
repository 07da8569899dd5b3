#include "ops/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "ops/bf16.hpp"
#include "ops/gemm.hpp"
#include "ops/peak_flops.hpp"
#include "ops/vector_math.hpp"

namespace gpt2 {

namespace {
// One head of one sequence: its q, k and v (T, hs) each, rows `ld` apart.
template <typename Value>
struct Head {
    const Value *q, *k, *v;
    long ld;
};

// Where head h of sequence b starts in out and dout (B, T, C): its columns.
long output_columns(int b, int h, int T, int C, int NH) {
    return static_cast<long>(b) * T * C + static_cast<long>(h) * (C / NH);
}

// Forward: a row of scores becomes its softmax over the keys it sees, [first, visible), zeros in
// [0, first) and [visible, end); returns the row's log-sum-exp over those keys. One pass of exp,
// as a plain softmax takes. first is 0 without document masking.
float softmax_row(float* row, int first, int visible, int end) {
    float* const seen = row + first;
    const int n = visible - first;
    const float maxv = lane_max(seen, n);
    for (int j = 0; j < n; ++j)
        seen[j] = vexp(seen[j] - maxv);
    const float sum = lane_sum(n, [seen](int j) { return seen[j]; });
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

// The products of a panel, in fp32 through the fp32 GEMM (Fp32Products) or on bf16 operands
// with fp32 accumulation (Bf16Products); forward and backward take them through the same calls:
// start_head once per head, then per panel of query rows [i0, i0 + rows) against keys
// [k0, k0 + keys) (k0 > 0 only under document masking):
//   scores:               panel = scale * q[i0:] @ k^T (the same in forward and backward)
//   values:               o = P @ v
//   values_gradient:      dv (+)= P^T @ dO[i0:]
//   probability_gradient: dP = dO[i0:] @ v^T
//   score_gradients:      dq[i0:] = scale * dS @ k;  dk (+)= scale * dS^T @ q[i0:]
// The panel P or dS of values, values_gradient and score_gradients is handed over row by row as
// each row is finished (take_row), so the bf16 products round it while it is in L1.
class Fp32Products {
  public:
    // qkv (B, T, C + 2 KV): q (NH heads), k and v (kv_heads heads each) of C / NH, KV = kv_heads
    // x C / NH; query head h reads key/value head h / (NH / kv_heads) (grouped-query attention).
    Fp32Products(const float* qkv, int T, int C, int NH, int kv_heads, float scale)
        : qkv_(qkv),
          T_(T),
          hs_(C / NH),
          C_(C),
          KV_(kv_heads * (C / NH)),
          W_(C + 2 * kv_heads * (C / NH)),
          group_(NH / kv_heads),
          scale_(scale) {}

    // Head h of sequence b; dout: its first output gradient (rows C apart), null in forward.
    void start_head(int b, int h, const float* dout) {
        const float* row0 = qkv_ + static_cast<long>(b) * T_ * W_;
        const float* k = row0 + C_ + static_cast<long>(h / group_) * hs_;
        hd_ = Head<float>{row0 + static_cast<long>(h) * hs_, k, k + KV_, W_};
        dout_ = dout;
    }
    // The fp32 products read the panels themselves.
    void take_row(int /*r*/, int /*keys*/, const float* /*row*/) const {}
    void scores(float* panel, int i0, int rows, int k0, int keys) const {
        gemm_nt(rows, keys, hs_, scale_, hd_.q + static_cast<long>(i0) * W_, W_,
                hd_.k + static_cast<long>(k0) * W_, W_, 0.0f, panel, keys);
    }
    void values(float* o, int ldo, const float* p, int rows, int k0, int keys) const {
        gemm_nn(rows, hs_, keys, 1.0f, p, keys, hd_.v + static_cast<long>(k0) * W_, W_, 0.0f, o,
                ldo);
    }
    void values_gradient(float* dv, float beta, const float* p, int i0, int rows, int k0,
                         int keys) const {
        gemm_tn(keys, hs_, rows, 1.0f, p, keys, dout_ + static_cast<long>(i0) * C_, C_, beta,
                dv + static_cast<long>(k0) * W_, W_);
    }
    void probability_gradient(float* dp, int i0, int rows, int k0, int keys) const {
        gemm_nt(rows, keys, hs_, 1.0f, dout_ + static_cast<long>(i0) * C_, C_,
                hd_.v + static_cast<long>(k0) * W_, W_, 0.0f, dp, keys);
    }
    void score_gradients(float* dq, float* dk, float beta, const float* ds, int i0, int rows,
                         int k0, int keys) const {
        gemm_nn(rows, hs_, keys, scale_, ds, keys, hd_.k + static_cast<long>(k0) * W_, W_, 0.0f,
                dq + static_cast<long>(i0) * W_, W_);
        gemm_tn(keys, hs_, rows, scale_, ds, keys, hd_.q + static_cast<long>(i0) * W_, W_, beta,
                dk + static_cast<long>(k0) * W_, W_);
    }
    // Keys [0, count) that no panel of the head sees (document masking): their dk and dv are 0.
    void zero_unseen_keys(float* dk, float* dv, int count) const {
        for (int j = 0; j < count; ++j) {
            std::fill_n(dk + static_cast<long>(j) * W_, hs_, 0.0f);
            std::fill_n(dv + static_cast<long>(j) * W_, hs_, 0.0f);
        }
    }
    void finish_head(float* /*dk*/, float* /*dv*/, int /*T*/) const {}

  private:
    const float* qkv_;
    int T_, hs_, C_, KV_, W_, group_;
    float scale_;
    Head<float> hd_{};
    const float* dout_ = nullptr;
};

// rows x cols of `in` (rows ld apart) rounded into `out` (rows cols apart), scaled first.
void round_rows(Bf16* out, const float* in, int rows, int cols, long ld, float scale = 1.0f) {
    for (int r = 0; r < rows; ++r) {
        const float* row = in + r * ld;
        Bf16* dst = out + static_cast<long>(r) * cols;
        for (int c = 0; c < cols; ++c)
            dst[c] = to_bf16(scale * row[c]);
    }
}

// rows x cols of `in` (rows cols apart) into `out` (rows ld apart), scaled.
void copy_rows(float* out, long ld, const float* in, int rows, int cols, float scale = 1.0f) {
    for (int r = 0; r < rows; ++r) {
        float* dst = out + r * ld;
        const float* row = in + static_cast<long>(r) * cols;
        for (int c = 0; c < cols; ++c)
            dst[c] = scale * row[c];
    }
}

// The same products on bf16 operands: q, k and v read where the qkv product wrote them in bf16
// (each head's dense, as oneDNN 2.6 runs products on AMX only for operands whose rows are dense),
// the head's dO rounded once into the pieces scratch, each panel's P and dS rounded row by row
// (take_row); fp32 accumulation and fp32 results, so the softmax and its statistics stay fp32.
// The scale of the scores is oneDNN's (a power of 2 for GPT-2's head size 64, so it is exact and
// the results are those of scaled keys); dq and dk get it as they are copied out. Every product
// writes a dense result (rows exactly N apart): oneDNN 2.6 runs those on AMX, but strided results
// (the heads' columns of out and dqkv) on a generic kernel about 4x slower; so the outputs go
// through dense scratch, and dk and dv accumulate there over the head's panels.
class Bf16Products {
  public:
    // qkv (NH + 2 KVH, B * T, hs): attention_forward_bf16's layout.
    Bf16Products(const Bf16* qkv, int B, int T, int C, int NH, int kv_heads, float scale,
                 const AttentionBf16Scratch& scratch)
        : qkv_(qkv),
          N_(static_cast<long>(B) * T),
          T_(T),
          hs_(C / NH),
          C_(C),
          NH_(NH),
          KVH_(kv_heads),
          ld_(C + 2 * kv_heads * (C / NH)),
          scale_(scale),
          dout_(scratch.pieces),
          panel_(dout_ + static_cast<long>(T) * hs_),
          result_(scratch.floats + attention_scratch_floats(T)),
          dk_(result_ + static_cast<long>(kAttentionQueryRows) * hs_),
          dv_(dk_ + static_cast<long>(T) * hs_) {}

    // Query head h reads key/value head h / (NH / KVH) (grouped-query attention); the group's
    // heads come one after another, so dk and dv sum them in the scratch until finish_head.
    void start_head(int b, int h, const float* dout) {
        const auto block = [&](int index) {
            return qkv_ + (static_cast<long>(index) * N_ + static_cast<long>(b) * T_) * hs_;
        };
        const int g = h / (NH_ / KVH_);
        hd_ = Head<Bf16>{block(h), block(NH_ + g), block(NH_ + KVH_ + g), hs_};
        if (dout != nullptr) round_rows(dout_, dout, T_, hs_, C_);
    }
    // Row r of the panel the next product takes (P or dS), rounded while it is in L1.
    void take_row(int r, int keys, const float* row) const {
        round_rows(panel_ + static_cast<long>(r) * keys, row, 1, keys, keys);
    }
    void scores(float* panel, int i0, int rows, int k0, int keys) const {
        gemm_bf16_nt_scaled(rows, keys, hs_, scale_, hd_.q + i0 * hd_.ld, static_cast<int>(hd_.ld),
                            hd_.k + k0 * hd_.ld, static_cast<int>(hd_.ld), panel, keys);
    }
    void values(float* o, int ldo, const float* /*p*/, int rows, int k0, int keys) const {
        gemm_bf16_nn(rows, hs_, keys, panel_, keys, hd_.v + k0 * hd_.ld, static_cast<int>(hd_.ld),
                     0.0f, result_, hs_);
        copy_rows(o, ldo, result_, rows, hs_);
    }
    void values_gradient(float* /*dv*/, float beta, const float* /*p*/, int i0, int rows, int k0,
                         int keys) const {
        gemm_bf16_tn(keys, hs_, rows, panel_, keys, dout_ + static_cast<long>(i0) * hs_, hs_, beta,
                     dv_ + static_cast<long>(k0) * hs_, hs_);
    }
    void probability_gradient(float* dp, int i0, int rows, int k0, int keys) const {
        gemm_bf16_nt(rows, keys, hs_, dout_ + static_cast<long>(i0) * hs_, hs_, hd_.v + k0 * hd_.ld,
                     static_cast<int>(hd_.ld), 0.0f, dp, keys);
    }
    // dq = scale * dS @ k; dk (+)= dS^T @ q, scaled in finish_head.
    void score_gradients(float* dq, float* /*dk*/, float beta, const float* /*ds*/, int i0,
                         int rows, int k0, int keys) const {
        gemm_bf16_nn(rows, hs_, keys, panel_, keys, hd_.k + k0 * hd_.ld, static_cast<int>(hd_.ld),
                     0.0f, result_, hs_);
        copy_rows(dq + static_cast<long>(i0) * ld_, ld_, result_, rows, hs_, scale_);
        gemm_bf16_tn(keys, hs_, rows, panel_, keys, hd_.q + i0 * hd_.ld, static_cast<int>(hd_.ld),
                     beta, dk_ + static_cast<long>(k0) * hs_, hs_);
    }
    // Keys [0, count) that no panel of the head sees (document masking): their dk and dv are 0.
    void zero_unseen_keys(float* /*dk*/, float* /*dv*/, int count) const {
        std::fill_n(dk_, static_cast<long>(count) * hs_, 0.0f);
        std::fill_n(dv_, static_cast<long>(count) * hs_, 0.0f);
    }
    // The head's dk and dv, accumulated over its panels (and its group's earlier heads), into
    // dqkv: the group's last head writes the sums.
    void finish_head(float* dk, float* dv, int T) const {
        copy_rows(dk, ld_, dk_, T, hs_, scale_);
        copy_rows(dv, ld_, dv_, T, hs_);
    }

  private:
    const Bf16* qkv_;
    long N_;
    int T_, hs_, C_, NH_, KVH_, ld_;
    float scale_;
    Head<Bf16> hd_{};
    Bf16 *dout_, *panel_;        // (T, hs), then (kAttentionQueryRows, T)
    float *result_, *dk_, *dv_;  // (kAttentionQueryRows, hs), (T, hs), (T, hs)
};

template <typename Products>
void forward(Products& products, float* out, float* lse, float* scratch, int B, int T, int C,
             int NH, const DropoutMask& dropout, std::span<const std::int32_t> first_keys) {
    float* panel = scratch;
    for (int b = 0; b < B; ++b) {
        for (int h = 0; h < NH; ++h) {
            products.start_head(b, h, nullptr);
            float* const head_lse = lse + (static_cast<long>(b) * NH + h) * T;
            float* o = out + output_columns(b, h, T, C, NH);
            for (int i0 = 0; i0 < T; i0 += kAttentionQueryRows) {
                // Query rows [i0, i1) see keys [k0, i1): nothing above the diagonal's block, nor
                // (document masking) left of the rows' earliest document.
                const int i1 = std::min(T, i0 + kAttentionQueryRows), rows = i1 - i0;
                const int k0 = panel_first_key(first_keys, b, T, i0, i1), keys = i1 - k0;
                products.scores(panel, i0, rows, k0, keys);
                for (int r = 0; r < rows; ++r) {
                    float* row = panel + static_cast<long>(r) * keys;
                    const int first = first_key(first_keys, b, T, i0 + r) - k0;
                    const int visible = i0 + r + 1 - k0;
                    head_lse[i0 + r] = softmax_row(row, first, visible, keys);
                    if (dropout.active())
                        drop_row(row, first, visible, dropout, b,
                                 (static_cast<long>(h) * T + i0 + r) * T + k0);
                    products.take_row(r, keys, row);
                }
                // out[i0:i1] = P @ v[k0:i1]
                products.values(o + static_cast<long>(i0) * C, C, panel, rows, k0, keys);
            }
        }
    }
}

template <typename Products>
void backward(Products& products, float* dqkv, float* scratch, const float* dout, const float* out,
              const float* lse, int B, int T, int C, int NH, int kv_heads,
              const DropoutMask& dropout, std::span<const std::int32_t> first_keys) {
    const int hs = C / NH;
    const int group = NH / kv_heads;  // query heads per key/value head
    const long KV = static_cast<long>(kv_heads) * hs, W = C + 2 * KV;
    const int num_panels = (T + kAttentionQueryRows - 1) / kAttentionQueryRows;
    float* const p = scratch;                                                // (rows, i1)
    float* const ds = scratch + static_cast<long>(kAttentionQueryRows) * T;  // (rows, i1)
    float* const row_dot = ds + static_cast<long>(kAttentionQueryRows) * T;  // (rows)
    for (int b = 0; b < B; ++b) {
        for (int h = 0; h < NH; ++h) {
            float* const row0 = dqkv + static_cast<long>(b) * T * W;
            float* dq = row0 + static_cast<long>(h) * hs;
            float* dk = row0 + C + static_cast<long>(h / group) * hs;
            float* dv = dk + KV;
            // A key/value head's first query head initialises its dk and dv; the group's others
            // add to them.
            const bool first_of_group = h % group == 0;
            const float* const head_lse = lse + (static_cast<long>(b) * NH + h) * T;
            const long io = output_columns(b, h, T, C, NH);
            products.start_head(b, h, dout + io);
            // The last panel sees every key (from its k0 on: the rows before are zeroed here), so
            // it initialises all rows of dk and dv (beta 0) and the earlier panels accumulate
            // into them.
            if (first_of_group) {
                products.zero_unseen_keys(
                    dk, dv,
                    panel_first_key(first_keys, b, T, (num_panels - 1) * kAttentionQueryRows, T));
            }
            for (int panel = num_panels - 1; panel >= 0; --panel) {
                const int i0 = panel * kAttentionQueryRows;
                const int i1 = std::min(T, i0 + kAttentionQueryRows), rows = i1 - i0;
                const float beta = first_of_group && panel == num_panels - 1 ? 0.0f : 1.0f;
                const int k0 = panel_first_key(first_keys, b, T, i0, i1), keys = i1 - k0;
                const float* d = dout + io + static_cast<long>(i0) * C;
                const float* o = out + io + static_cast<long>(i0) * C;
                // sum_j P_ij dP_ij = dO_i . O_i: the softmax backward's row term, once per row.
                for (int r = 0; r < rows; ++r) {
                    float dot = 0.0f;
                    for (int e = 0; e < hs; ++e)
                        dot += d[static_cast<long>(r) * C + e] * o[static_cast<long>(r) * C + e];
                    row_dot[r] = dot;
                }
                products.scores(p, i0, rows, k0, keys);
                for (int r = 0; r < rows; ++r) {
                    probabilities_row(p + static_cast<long>(r) * keys,
                                      first_key(first_keys, b, T, i0 + r) - k0, i0 + r + 1 - k0,
                                      keys, head_lse[i0 + r]);
                    if (!dropout.active())
                        products.take_row(r, keys, p + static_cast<long>(r) * keys);
                }
                if (!dropout.active()) {
                    // dv[k0:i1] += P^T @ dO
                    products.values_gradient(dv, beta, p, i0, rows, k0, keys);
                    // dP = dO @ v^T, then dS = P * (dP - dO.O) (zero where P is).
                    products.probability_gradient(ds, i0, rows, k0, keys);
                    for (int r = 0; r < rows; ++r) {
                        const float* prow = p + static_cast<long>(r) * keys;
                        float* srow = ds + static_cast<long>(r) * keys;
                        const float dot = row_dot[r];
                        for (int j = 0; j < keys; ++j)
                            srow[j] = prow[j] * (srow[j] - dot);
                        products.take_row(r, keys, srow);
                    }
                } else {
                    // With the dropped probabilities D = M * P / (1 - rate): dD = dO @ v^T,
                    // dP = M * dD / (1 - rate), dS = P * (dP - dO.O) (dO.O is still sum_j P dP),
                    // and dv[k0:i1] += D^T @ dO, D made in place of P once dS is done.
                    products.probability_gradient(ds, i0, rows, k0, keys);
                    for (int r = 0; r < rows; ++r) {
                        drop_gradient_row(
                            p + static_cast<long>(r) * keys, ds + static_cast<long>(r) * keys,
                            first_key(first_keys, b, T, i0 + r) - k0, i0 + r + 1 - k0, keys,
                            row_dot[r], dropout, b, (static_cast<long>(h) * T + i0 + r) * T + k0);
                        products.take_row(r, keys, p + static_cast<long>(r) * keys);
                    }
                    products.values_gradient(dv, beta, p, i0, rows, k0, keys);
                    for (int r = 0; r < rows; ++r)
                        products.take_row(r, keys, ds + static_cast<long>(r) * keys);
                }
                // dq[i0:i1] = scale * dS @ k[k0:i1];  dk[k0:i1] += scale * dS^T @ q[i0:i1]
                products.score_gradients(dq, dk, beta, ds, i0, rows, k0, keys);
            }
            products.finish_head(dk, dv, T);
        }
    }
}

// kv_heads as the callers give it (0: NH), checked to divide NH.
int checked_kv_heads(int NH, int kv_heads) {
    const int KVH = kv_heads == 0 ? NH : kv_heads;
    if (KVH <= 0 || KVH > NH || NH % KVH != 0) {
        throw std::invalid_argument("attention: key/value heads must divide the query heads");
    }
    return KVH;
}

float score_scale(int C, int NH) {
    return 1.0f / std::sqrt(static_cast<float>(C / NH));
}

}  // namespace

std::size_t attention_scratch_floats(int T) {
    // backward: the probabilities panel, its gradient panel and one dO.O per query row.
    const auto panel = static_cast<std::size_t>(kAttentionQueryRows) * static_cast<std::size_t>(T);
    return 2 * panel + kAttentionQueryRows;
}

std::size_t attention_bf16_scratch_floats(int T, int hs) {
    // attention_scratch_floats, then a panel's (rows, hs) result and one head's dk and dv.
    const auto t = static_cast<std::size_t>(T), h = static_cast<std::size_t>(hs);
    return attention_scratch_floats(T) + static_cast<std::size_t>(kAttentionQueryRows) * h +
           2 * t * h;
}

std::size_t attention_bf16_scratch_pieces(int T, int hs) {
    // One head's dO, then one panel of P or dS.
    const auto t = static_cast<std::size_t>(T);
    return t * static_cast<std::size_t>(hs) + static_cast<std::size_t>(kAttentionQueryRows) * t;
}

void round_qkv_by_heads(Bf16* out, const float* qkv, int N, int C, int NH, int kv_heads) {
    const int hs = C / NH, blocks = NH + 2 * checked_kv_heads(NH, kv_heads);
    for (int block = 0; block < blocks; ++block) {
        round_rows(out + static_cast<long>(block) * N * hs, qkv + static_cast<long>(block) * hs, N,
                   hs, static_cast<long>(blocks) * hs);
    }
}

void attention_forward(float* out, float* lse, float* scratch, const float* qkv, int B, int T,
                       int C, int NH, const DropoutMask& dropout,
                       std::span<const std::int32_t> first_keys, int kv_heads) {
    check_first_keys(first_keys, B, T);
    const int KVH = checked_kv_heads(NH, kv_heads);
    Fp32Products products(qkv, T, C, NH, KVH, score_scale(C, NH));
    forward(products, out, lse, scratch, B, T, C, NH, dropout, first_keys);
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* out,
                        const float* lse, const float* qkv, int B, int T, int C, int NH,
                        const DropoutMask& dropout, std::span<const std::int32_t> first_keys,
                        int kv_heads) {
    check_first_keys(first_keys, B, T);
    const int KVH = checked_kv_heads(NH, kv_heads);
    Fp32Products products(qkv, T, C, NH, KVH, score_scale(C, NH));
    backward(products, dqkv, scratch, dout, out, lse, B, T, C, NH, KVH, dropout, first_keys);
}

void attention_forward_bf16(float* out, float* lse, const AttentionBf16Scratch& scratch,
                            const Bf16* qkv, int B, int T, int C, int NH,
                            const DropoutMask& dropout, std::span<const std::int32_t> first_keys,
                            int kv_heads) {
    check_first_keys(first_keys, B, T);
    const int KVH = checked_kv_heads(NH, kv_heads);
    Bf16Products products(qkv, B, T, C, NH, KVH, score_scale(C, NH), scratch);
    forward(products, out, lse, scratch.floats, B, T, C, NH, dropout, first_keys);
}

void attention_backward_bf16(float* dqkv, const AttentionBf16Scratch& scratch, const float* dout,
                             const float* out, const float* lse, const Bf16* qkv, int B, int T,
                             int C, int NH, const DropoutMask& dropout,
                             std::span<const std::int32_t> first_keys, int kv_heads) {
    check_first_keys(first_keys, B, T);
    const int KVH = checked_kv_heads(NH, kv_heads);
    Bf16Products products(qkv, B, T, C, NH, KVH, score_scale(C, NH), scratch);
    backward(products, dqkv, scratch.floats, dout, out, lse, B, T, C, NH, KVH, dropout, first_keys);
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

bool bf16_attention_pays() {
    static const bool pays = [] {
        const char* forced = std::getenv("GPT2_BF16_ATTENTION");
        if (forced != nullptr && std::strcmp(forced, "on") == 0) return true;
        if (forced != nullptr && std::strcmp(forced, "off") == 0) return false;
        switch (bf16_backend()) {
            case Bf16Backend::Amx:
                return true;
            case Bf16Backend::Avx512Bf16:
                // Measured: on a Sapphire Rapids held to AVX512_BF16 bf16 attention is slower
                // than fp32's (35 + 89 against 27 + 61 ms at T=1024); on AMD Zen 4 a whole 124M
                // step is 9% faster with it (docs/performance.md).
                return bf16_dots_outrun_fma();
            default:
                return false;
        }
    }();
    return pays;
}

}  // namespace gpt2
