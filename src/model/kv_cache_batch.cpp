// Several sessions' decode steps in one pass: each session's token at its own next position, with
// its own cache and buffers, but every weight row read (and converted) once for all of them
// (matvec_many: each row's pieces multiply every session's vector while in registers). A decode
// step is bound by how fast the weights stream in, so N sequences cost far less than N steps. Each
// session computes exactly what its own step() computes (matvec_many's rows are matvec's, split
// over the workers the same way), so results do not depend on which sequences share a round. The
// block's variants (the norm, rotary positions, QK-norm, grouped-query heads, the MLP's activation,
// biases or none) are the training block's (model/block_parts.hpp), as in the token pass.
#include <stdexcept>

#include "model/block_parts.hpp"
#include "model/kv_cache.hpp"
#include "model/kv_cache_passes.hpp"
#include "ops/decode_attention.hpp"
#include "ops/kernels.hpp"

namespace gpt2 {

using namespace kv_cache_detail;

void KvCacheSession::step_together(std::span<KvCacheSession* const> sessions,
                                   std::span<const std::int32_t> tokens) {
    if (sessions.size() != tokens.size()) {
        throw std::invalid_argument("step_together: one token per session");
    }
    if (sessions.empty()) return;
    KvCacheSession& lead = *sessions.front();
    for (KvCacheSession* s : sessions) {
        if (&s->model_ != &lead.model_ || s->compact_ != lead.compact_ ||
            &s->pool_ != &lead.pool_) {
            throw std::invalid_argument("step_together: sessions of one model, format and pool");
        }
    }
    // A full cache slides, which re-encodes a window: that session steps alone.
    std::vector<KvCacheSession*> batch;
    std::vector<std::int32_t> batch_tokens;
    for (std::size_t i = 0; i < sessions.size(); ++i) {
        KvCacheSession& s = *sessions[i];
        s.check_token(tokens[i]);
        if (s.length() >= s.config().max_seq_len) {
            (void)s.step(tokens[i]);
            continue;
        }
        s.embed({&tokens[i], 1}, s.length(), s.x_);
        batch.push_back(&s);
        batch_tokens.push_back(tokens[i]);
    }
    if (batch.empty()) return;

    const ModelConfig& c = lead.model_.config;
    const int C = c.channels, hs = c.head_size(), maxT = c.max_seq_len;
    const int KVH = c.kv_heads(), group = c.num_heads / KVH, KV = KVH * hs;
    const int H = c.mlp_hidden();
    const bool rotary = c.arch.positions == PositionKind::Rotary;
    const int W = lead.workers_;
    const bool bf16_cache = lead.kv_bf16_.size() > 0;
    const auto rows_at = [&](const float* weight, long count) {
        return weight_rows(lead.compact_, weight, count);
    };
    // Each session's output and input vectors for a product (offsets applied by the caller).
    std::vector<float*> per_worker_outputs(static_cast<std::size_t>(W) * batch.size());
    std::vector<const float*> per_worker_inputs(per_worker_outputs.size());
    // `count` rows starting at row `first` of `weight` times each session's input, into each
    // session's output(session) (which points at row `first`'s result).
    const auto products = [&](const float* weight, long first, int count, int K, const float* bias,
                              bool accumulate, auto&& output, auto&& input, int worker) {
        const std::size_t base = static_cast<std::size_t>(worker) * batch.size();
        std::span<float*> ys(per_worker_outputs.data() + base, batch.size());
        std::span<const float*> xs(per_worker_inputs.data() + base, batch.size());
        for (std::size_t i = 0; i < batch.size(); ++i) {
            ys[i] = output(*batch[i]);
            xs[i] = input(*batch[i]);
        }
        rows_at(weight + first * K, count)
            .matvec_many_into(ys, xs, count, K, bias != nullptr ? bias + first : nullptr,
                              accumulate);
    };
    const std::span<const float> w = lead.model_.weights();
    lead.run_workers([&](int worker) {
        // Each session's norm of its row lands in that session's scratch of this worker.
        const auto norm = [&](KvCacheSession& s, const float* weight, const float* bias) {
            WorkerScratch& ws = s.worker_scratch_[static_cast<std::size_t>(worker)];
            norm_forward(c, ws.ln, ws.ln_stats, ws.ln_stats + 1, s.x_, weight, bias, 1);
        };
        const auto ln_of = [&](KvCacheSession& s) {
            return s.worker_scratch_[static_cast<std::size_t>(worker)].ln;
        };
        // QK-norm (where the architecture has it) and rotary positions on one head of q or k at
        // the session's position.
        const auto position_head = [&](float* head, int pos) {
            float rstd = 0.0f;
            if (c.arch.qk_norm)
                rmsnorm_forward(head, &rstd, head, nullptr, 1, hs, c.arch.norm_eps, hs);
            if (rotary) rotary_forward(head, lead.gen_.rotary_, 1, 1, pos, 1, hs, hs);
        };
        for (int l = 0; l < c.num_layers; ++l) {
            const LayerView<const float> p = layer_view(lead.model_.layout, w, l);
            for (KvCacheSession* s : batch)
                norm(*s, p.ln1w, p.ln1b);
            const Range kv_heads = split_range(static_cast<std::size_t>(KVH), worker, W);
            for (auto g = static_cast<int>(kv_heads.begin); g < static_cast<int>(kv_heads.end);
                 ++g) {
                const long kcol = static_cast<long>(g) * hs;
                const long head = (static_cast<long>(l) * 2 * KVH + g) * maxT * hs;
                const long values = static_cast<long>(KVH) * maxT * hs;
                // The key/value head's k and v for every session (into the session's scratch of
                // this worker) and into each session's cache, then its group's queries (one for
                // GPT-2) and each session's attention.
                const auto key_row = [&](KvCacheSession& s) {
                    return s.worker_scratch_[static_cast<std::size_t>(worker)].scores + maxT;
                };
                const auto value_row = [&](KvCacheSession& s) {
                    return s.worker_scratch_[static_cast<std::size_t>(worker)].scores + 2 * maxT;
                };
                products(p.qkvw, C + kcol, hs, C, p.qkvb, false, key_row, ln_of, worker);
                products(p.qkvw, C + KV + kcol, hs, C, p.qkvb, false, value_row, ln_of, worker);
                for (KvCacheSession* sp : batch) {
                    KvCacheSession& s = *sp;
                    WorkerScratch& ws = s.worker_scratch_[static_cast<std::size_t>(worker)];
                    const int pos = s.length();
                    float* key = ws.scores + maxT;
                    const float* value = ws.scores + 2 * maxT;
                    position_head(key, pos);
                    if (bf16_cache) {
                        const HeadCache<Bf16> store{s.kv_bf16_.data() + head,
                                                    s.kv_bf16_.data() + head + values};
                        for (int d = 0; d < hs; ++d)
                            store.keys_t[static_cast<long>(d) * maxT + pos] = to_bf16(key[d]);
                        convert_to_bf16(store.values + static_cast<long>(pos) * hs, value,
                                        static_cast<std::size_t>(hs));
                    } else {
                        const HeadCache<float> cache{s.kv_.data() + head,
                                                     s.kv_.data() + head + values};
                        for (int d = 0; d < hs; ++d)
                            cache.keys_t[static_cast<long>(d) * maxT + pos] = key[d];
                        std::copy(value, value + hs, cache.values + static_cast<long>(pos) * hs);
                    }
                }
                for (int h = g * group; h < (g + 1) * group; ++h) {
                    const long col = static_cast<long>(h) * hs;
                    products(
                        p.qkvw, col, hs, C, p.qkvb, false,
                        [&](KvCacheSession& s) { return s.qkv_ + col; }, ln_of, worker);
                    for (KvCacheSession* sp : batch) {
                        KvCacheSession& s = *sp;
                        WorkerScratch& ws = s.worker_scratch_[static_cast<std::size_t>(worker)];
                        const int pos = s.length();
                        float* q = s.qkv_ + col;
                        position_head(q, pos);
                        if (bf16_cache) {
                            attend_one_query(s.atty_ + col, q, s.kv_bf16_.data() + head,
                                             s.kv_bf16_.data() + head + values, ws.scores, pos, hs,
                                             maxT);
                        } else {
                            attend_one_query(s.atty_ + col, q, s.kv_.data() + head,
                                             s.kv_.data() + head + values, ws.scores, pos, hs,
                                             maxT);
                        }
                    }
                }
            }
            lead.barrier_->arrive_and_wait();
            const Range r = column_share(static_cast<std::size_t>(C), worker, W);
            const auto b = static_cast<long>(r.begin);
            const int n = static_cast<int>(r.end - r.begin);
            products(
                p.attprojw, b, n, C, p.attprojb, true, [&](KvCacheSession& s) { return s.x_ + b; },
                [](KvCacheSession& s) { return s.atty_; }, worker);
            lead.barrier_->arrive_and_wait();
            // The MLP's first product and its activation by hidden column (SwiGLU: the gate's
            // and the up-projection's columns, the activation into the gate's).
            for (KvCacheSession* s : batch)
                norm(*s, p.ln2w, p.ln2b);
            const Range rh = column_share(static_cast<std::size_t>(H), worker, W);
            const auto bh = static_cast<long>(rh.begin);
            const int nh = static_cast<int>(rh.end - rh.begin);
            products(
                p.fcw, bh, nh, C, p.fcb, false, [&](KvCacheSession& s) { return s.fch_ + bh; },
                ln_of, worker);
            if (c.arch.mlp == MlpKind::SwiGlu) {
                products(
                    p.fcw, H + bh, nh, C, p.fcb, false,
                    [&](KvCacheSession& s) { return s.fch_ + H + bh; }, ln_of, worker);
            }
            for (KvCacheSession* s : batch)
                activation_columns(c, s->fch_ + bh, nh);
            lead.barrier_->arrive_and_wait();
            products(
                p.fcprojw, b, n, H, p.fcprojb, true, [&](KvCacheSession& s) { return s.x_ + b; },
                [](KvCacheSession& s) { return s.fch_; }, worker);
            lead.barrier_->arrive_and_wait();
        }
        // The head: each session's final norm, then the vocabulary rows once for all.
        const float* head = lead.model_.layout.tensor(w, head_tensor(lead.model_.layout)).data();
        for (KvCacheSession* s : batch) {
            WorkerScratch& ws = s->worker_scratch_[static_cast<std::size_t>(worker)];
            norm_forward(c, ws.ln, ws.ln_stats, ws.ln_stats + 1, s->x_,
                         tensor_or_null(lead.model_.layout, w, ParamTensor::lnfw),
                         tensor_or_null(lead.model_.layout, w, ParamTensor::lnfb), 1);
        }
        const Range rv = column_share(static_cast<std::size_t>(c.vocab_size), worker, W);
        products(
            head, static_cast<long>(rv.begin), static_cast<int>(rv.end - rv.begin), C, nullptr,
            false, [&](KvCacheSession& s) { return s.logits_ + rv.begin; }, ln_of, worker);
    });
    for (std::size_t i = 0; i < batch.size(); ++i)
        batch[i]->context_.push_back(batch_tokens[i]);
}

}  // namespace gpt2
