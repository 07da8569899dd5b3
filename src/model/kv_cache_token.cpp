// The decode step of a KvCacheSession: one token's forward at the next position, its matrix-vector
// products split across the workers, its key and value appended to the cache.
#include "model/kv_cache.hpp"
#include "model/kv_cache_passes.hpp"
#include "ops/decode_attention.hpp"
#include "ops/kernels.hpp"

namespace gpt2 {

using namespace kv_cache_detail;

// Longer than the usual screen, on purpose: it is one thread-pool task whose phases (per layer:
// LayerNorm, QKV and attention, projections, MLP; then the head) are separated by barriers and
// share a dozen locals; cut into functions, each would need all of them passed in.
void KvCacheSession::forward_token(std::int32_t token) {
    const ModelConfig& c = model_.config;
    const int pos = length();
    const int C = c.channels, NH = c.num_heads, hs = c.head_size(), maxT = c.max_seq_len;
    const int W = workers_;
    const bool bf16_cache = kv_bf16_.size() > 0;
    embed({&token, 1}, pos, x_);
    const auto rows_at = [&](const float* weight, long count) {
        return weight_rows(compact_, weight, count);
    };
    // One pool.run per token; the phases inside are separated by barriers (4 per layer). Each
    // phase writes only its worker's share, and the next reads what all shares wrote.
    run_workers([&](int worker) {
        WorkerScratch& ws = worker_scratch_[static_cast<std::size_t>(worker)];
        // The worker's LayerNorm of the residual row (recomputed by all: cheaper than a barrier).
        const auto layernorm = [&](const float* inp, const float* weight, const float* bias) {
            layernorm_forward(ws.ln, ws.ln_stats, ws.ln_stats + 1, inp, weight, bias, 1, C);
            return ws.ln;
        };
        float* row = ws.scores + maxT;  // hs floats: a new key or value
        for (int l = 0; l < c.num_layers; ++l) {
            const LayerView<const float> p = layer_view(model_.layout, model_.weights(), l);
            // qkv and attention, by head: a head's attention needs only its own q, k and v.
            const float* ln = layernorm(x_, p.ln1w, p.ln1b);
            const Range heads = split_range(static_cast<std::size_t>(NH), worker, W);
            for (auto h = static_cast<int>(heads.begin); h < static_cast<int>(heads.end); ++h) {
                const long col = static_cast<long>(h) * hs;
                float* q = qkv_ + col;
                rows_at(p.qkvw + col * C, hs).matvec_into(q, ln, hs, C, p.qkvb + col, false);
                const WeightRows wk = rows_at(p.qkvw + (C + col) * C, hs);
                const WeightRows wv = rows_at(p.qkvw + (2L * C + col) * C, hs);
                const long head = (static_cast<long>(l) * 2 * NH + h) * maxT * hs;
                const long values = static_cast<long>(NH) * maxT * hs;
                // Its key and value into the cache (rounded to bf16 with compact weights), which
                // the query then reads.
                wk.matvec_into(row, ln, hs, C, p.qkvb + C + col, false);
                if (bf16_cache) {
                    const HeadCache<Bf16> store{kv_bf16_.data() + head,
                                                kv_bf16_.data() + head + values};
                    for (int d = 0; d < hs; ++d)
                        store.keys_t[static_cast<long>(d) * maxT + pos] = to_bf16(row[d]);
                    wv.matvec_into(row, ln, hs, C, p.qkvb + 2 * C + col, false);
                    convert_to_bf16(store.values + static_cast<long>(pos) * hs, row,
                                    static_cast<std::size_t>(hs));
                    attend_one_query(atty_ + col, q, store.keys_t, store.values, ws.scores, pos, hs,
                                     maxT);
                } else {
                    const HeadCache<float> cache{kv_.data() + head, kv_.data() + head + values};
                    for (int d = 0; d < hs; ++d)
                        cache.keys_t[static_cast<long>(d) * maxT + pos] = row[d];
                    wv.matvec_into(cache.values + static_cast<long>(pos) * hs, ln, hs, C,
                                   p.qkvb + 2 * C + col, false);
                    attend_one_query(atty_ + col, q, cache.keys_t, cache.values, ws.scores, pos, hs,
                                     maxT);
                }
            }
            barrier_->arrive_and_wait();
            // Attention projection onto the residual stream, by output column.
            const Range r = column_share(static_cast<std::size_t>(C), worker, W);
            const auto b = static_cast<long>(r.begin);
            const int n = static_cast<int>(r.end - r.begin);
            rows_at(p.attprojw + b * C, n).matvec_into(x_ + b, atty_, n, C, p.attprojb + b, true);
            barrier_->arrive_and_wait();
            // MLP up-projection and GELU, by hidden column.
            const float* ln2 = layernorm(x_, p.ln2w, p.ln2b);
            const Range r4 = column_share(4 * static_cast<std::size_t>(C), worker, W);
            const auto b4 = static_cast<long>(r4.begin);
            const int n4 = static_cast<int>(r4.end - r4.begin);
            rows_at(p.fcw + b4 * C, n4).matvec_into(fch_ + b4, ln2, n4, C, p.fcb + b4, false);
            gelu_forward(fch_ + b4, fch_ + b4, n4);
            barrier_->arrive_and_wait();
            // MLP down-projection onto the residual stream, by output column.
            rows_at(p.fcprojw + b * 4 * C, n)
                .matvec_into(x_ + b, fch_, n, 4 * C, p.fcprojb + b, true);
            barrier_->arrive_and_wait();
        }
        head_logits(worker, x_);
    });
    context_.push_back(token);
}

}  // namespace gpt2
