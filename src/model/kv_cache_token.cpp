// The decode step of a KvCacheSession: one token's forward at the next position, its matrix-vector
// products split across the workers, its key and value appended to the cache.
#include "model/block_parts.hpp"
#include "model/kv_cache.hpp"
#include "model/kv_cache_passes.hpp"
#include "ops/decode_attention.hpp"
#include "ops/kernels.hpp"

namespace gpt2 {

using namespace kv_cache_detail;

// Longer than the usual screen, on purpose: it is one thread-pool task whose phases (per layer:
// LayerNorm, QKV and attention, projections, MLP; then the head) are separated by barriers and
// share a dozen locals; cut into functions, each would need all of them passed in. The block's
// variants (the norm, rotary positions, QK-norm, grouped-query heads, the MLP's activation, biases
// or none) are the training block's (model/block_parts.hpp, ops/block_kernels.hpp).
void KvCacheSession::forward_token(std::int32_t token) {
    const ModelConfig& c = model_.config;
    const int pos = length();
    const int C = c.channels, hs = c.head_size(), maxT = c.max_seq_len;
    const int KVH = c.kv_heads(), group = c.num_heads / KVH, KV = KVH * hs;
    const int H = c.mlp_hidden();
    const bool rotary = c.arch.positions == PositionKind::Rotary;
    const int W = workers_;
    const bool bf16_cache = kv_bf16_.size() > 0;
    embed({&token, 1}, pos, x_);
    const auto rows_at = [&](const float* weight, long count) {
        return weight_rows(compact_, weight, count);
    };
    // A bias at `offset`, or none where the model has no biases.
    const auto at = [](const float* bias, long offset) {
        return bias != nullptr ? bias + offset : nullptr;
    };
    // One pool.run per token; the phases inside are separated by barriers (4 per layer). Each
    // phase writes only its worker's share, and the next reads what all shares wrote.
    run_workers([&](int worker) {
        WorkerScratch& ws = worker_scratch_[static_cast<std::size_t>(worker)];
        // The worker's norm of the residual row (recomputed by all: cheaper than a barrier).
        const auto norm = [&](const float* inp, const float* weight, const float* bias) {
            norm_forward(c, ws.ln, ws.ln_stats, ws.ln_stats + 1, inp, weight, bias, 1);
            return ws.ln;
        };
        float* row = ws.scores + maxT;  // hs floats: a new key or value
        // QK-norm on one head of q or k, where the architecture has it (before rotary).
        const auto qk_norm = [&](float* head) {
            float rstd = 0.0f;
            if (c.arch.qk_norm)
                rmsnorm_forward(head, &rstd, head, nullptr, 1, hs, c.arch.norm_eps, hs);
        };
        for (int l = 0; l < c.num_layers; ++l) {
            const LayerView<const float> p = layer_view(model_.layout, model_.weights(), l);
            // qkv and attention, by key/value head: its key and value into the cache, then its
            // group's queries (one for GPT-2), each head's attention needing only its own q.
            const float* ln = norm(x_, p.ln1w, p.ln1b);
            const Range kv_heads = split_range(static_cast<std::size_t>(KVH), worker, W);
            for (auto g = static_cast<int>(kv_heads.begin); g < static_cast<int>(kv_heads.end);
                 ++g) {
                const long kcol = static_cast<long>(g) * hs;
                const WeightRows wk = rows_at(p.qkvw + (C + kcol) * C, hs);
                const WeightRows wv = rows_at(p.qkvw + (C + KV + kcol) * C, hs);
                const long head = (static_cast<long>(l) * 2 * KVH + g) * maxT * hs;
                const long values = static_cast<long>(KVH) * maxT * hs;
                // Its key and value into the cache (rounded to bf16 with compact weights), which
                // the queries then read.
                wk.matvec_into(row, ln, hs, C, at(p.qkvb, C + kcol), false);
                qk_norm(row);
                if (rotary) rotary_forward(row, gen_.rotary_, 1, 1, pos, 1, hs, hs);
                if (bf16_cache) {
                    const HeadCache<Bf16> store{kv_bf16_.data() + head,
                                                kv_bf16_.data() + head + values};
                    for (int d = 0; d < hs; ++d)
                        store.keys_t[static_cast<long>(d) * maxT + pos] = to_bf16(row[d]);
                    wv.matvec_into(row, ln, hs, C, at(p.qkvb, C + KV + kcol), false);
                    convert_to_bf16(store.values + static_cast<long>(pos) * hs, row,
                                    static_cast<std::size_t>(hs));
                } else {
                    const HeadCache<float> cache{kv_.data() + head, kv_.data() + head + values};
                    for (int d = 0; d < hs; ++d)
                        cache.keys_t[static_cast<long>(d) * maxT + pos] = row[d];
                    wv.matvec_into(cache.values + static_cast<long>(pos) * hs, ln, hs, C,
                                   at(p.qkvb, C + KV + kcol), false);
                }
                for (int h = g * group; h < (g + 1) * group; ++h) {
                    const long col = static_cast<long>(h) * hs;
                    float* q = qkv_ + col;
                    rows_at(p.qkvw + col * C, hs).matvec_into(q, ln, hs, C, at(p.qkvb, col), false);
                    qk_norm(q);
                    if (rotary) rotary_forward(q, gen_.rotary_, 1, 1, pos, 1, hs, hs);
                    if (bf16_cache) {
                        attend_one_query(atty_ + col, q, kv_bf16_.data() + head,
                                         kv_bf16_.data() + head + values, ws.scores, pos, hs, maxT);
                    } else {
                        attend_one_query(atty_ + col, q, kv_.data() + head,
                                         kv_.data() + head + values, ws.scores, pos, hs, maxT);
                    }
                }
            }
            barrier_->arrive_and_wait();
            // Attention projection onto the residual stream, by output column.
            const Range r = column_share(static_cast<std::size_t>(C), worker, W);
            const auto b = static_cast<long>(r.begin);
            const int n = static_cast<int>(r.end - r.begin);
            rows_at(p.attprojw + b * C, n)
                .matvec_into(x_ + b, atty_, n, C, at(p.attprojb, b), true);
            barrier_->arrive_and_wait();
            // MLP up-projection and its activation, by hidden column (SwiGLU: the gate's and the
            // up-projection's columns, the activation into the gate's).
            const float* ln2 = norm(x_, p.ln2w, p.ln2b);
            const Range rh = column_share(static_cast<std::size_t>(H), worker, W);
            const auto bh = static_cast<long>(rh.begin);
            const int nh = static_cast<int>(rh.end - rh.begin);
            rows_at(p.fcw + bh * C, nh).matvec_into(fch_ + bh, ln2, nh, C, at(p.fcb, bh), false);
            if (c.arch.mlp == MlpKind::SwiGlu) {
                rows_at(p.fcw + (H + bh) * C, nh)
                    .matvec_into(fch_ + H + bh, ln2, nh, C, at(p.fcb, H + bh), false);
            }
            activation_columns(c, fch_ + bh, nh);
            barrier_->arrive_and_wait();
            // MLP down-projection onto the residual stream, by output column.
            rows_at(p.fcprojw + b * H, n).matvec_into(x_ + b, fch_, n, H, at(p.fcprojb, b), true);
            barrier_->arrive_and_wait();
        }
        head_logits(worker, x_);
    });
    context_.push_back(token);
}

}  // namespace gpt2
