// Several sessions' decode steps in one pass: each session's token at its own next position, with
// its own cache and buffers, but every weight row read (and converted) once for all of them
// (matvec_many: each row's pieces multiply every session's vector while in registers). A decode
// step is bound by how fast the weights stream in, so N sequences cost far less than N steps. Each
// session computes exactly what its own step() computes (matvec_many's rows are matvec's, split
// over the workers the same way), so results do not depend on which sequences share a round.
#include <stdexcept>

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
    if (!lead.config().is_gpt2()) {
        // The Llama family's batched pass is GPT-2's only so far: each session steps alone.
        for (std::size_t i = 0; i < sessions.size(); ++i)
            (void)sessions[i]->step(tokens[i]);
        return;
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
    const int C = c.channels, NH = c.num_heads, hs = c.head_size(), maxT = c.max_seq_len;
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
    lead.run_workers([&](int worker) {
        // Each session's LayerNorm of its row lands in that session's scratch of this worker.
        const auto layernorm = [&](KvCacheSession& s, const float* weight, const float* bias) {
            WorkerScratch& ws = s.worker_scratch_[static_cast<std::size_t>(worker)];
            layernorm_forward(ws.ln, ws.ln_stats, ws.ln_stats + 1, s.x_, weight, bias, 1, C);
        };
        const auto ln_of = [&](KvCacheSession& s) {
            return s.worker_scratch_[static_cast<std::size_t>(worker)].ln;
        };
        for (int l = 0; l < c.num_layers; ++l) {
            const LayerView<const float> p =
                layer_view(lead.model_.layout, lead.model_.weights(), l);
            for (KvCacheSession* s : batch)
                layernorm(*s, p.ln1w, p.ln1b);
            const Range heads = split_range(static_cast<std::size_t>(NH), worker, W);
            for (auto h = static_cast<int>(heads.begin); h < static_cast<int>(heads.end); ++h) {
                const long col = static_cast<long>(h) * hs;
                const long head = (static_cast<long>(l) * 2 * NH + h) * maxT * hs;
                const long values = static_cast<long>(NH) * maxT * hs;
                // The head's q, k and v for every session (k and v into the session's scratch of
                // this worker), then each session's cache and attention.
                products(
                    p.qkvw, col, hs, C, p.qkvb, false,
                    [&](KvCacheSession& s) { return s.qkv_ + col; }, ln_of, worker);
                const auto key_row = [&](KvCacheSession& s) {
                    return s.worker_scratch_[static_cast<std::size_t>(worker)].scores + maxT;
                };
                const auto value_row = [&](KvCacheSession& s) {
                    return s.worker_scratch_[static_cast<std::size_t>(worker)].scores + 2 * maxT;
                };
                products(p.qkvw, C + col, hs, C, p.qkvb, false, key_row, ln_of, worker);
                products(p.qkvw, 2 * C + col, hs, C, p.qkvb, false, value_row, ln_of, worker);
                for (KvCacheSession* sp : batch) {
                    KvCacheSession& s = *sp;
                    WorkerScratch& ws = s.worker_scratch_[static_cast<std::size_t>(worker)];
                    const int pos = s.length();
                    const float* q = s.qkv_ + col;
                    const float* key = ws.scores + maxT;
                    const float* value = ws.scores + 2 * maxT;
                    if (bf16_cache) {
                        const HeadCache<Bf16> store{s.kv_bf16_.data() + head,
                                                    s.kv_bf16_.data() + head + values};
                        for (int d = 0; d < hs; ++d)
                            store.keys_t[static_cast<long>(d) * maxT + pos] = to_bf16(key[d]);
                        convert_to_bf16(store.values + static_cast<long>(pos) * hs, value,
                                        static_cast<std::size_t>(hs));
                        attend_one_query(s.atty_ + col, q, store.keys_t, store.values, ws.scores,
                                         pos, hs, maxT);
                    } else {
                        const HeadCache<float> cache{s.kv_.data() + head,
                                                     s.kv_.data() + head + values};
                        for (int d = 0; d < hs; ++d)
                            cache.keys_t[static_cast<long>(d) * maxT + pos] = key[d];
                        std::copy(value, value + hs, cache.values + static_cast<long>(pos) * hs);
                        attend_one_query(s.atty_ + col, q, cache.keys_t, cache.values, ws.scores,
                                         pos, hs, maxT);
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
            for (KvCacheSession* s : batch)
                layernorm(*s, p.ln2w, p.ln2b);
            const Range r4 = column_share(4 * static_cast<std::size_t>(C), worker, W);
            const auto b4 = static_cast<long>(r4.begin);
            const int n4 = static_cast<int>(r4.end - r4.begin);
            products(
                p.fcw, b4, n4, C, p.fcb, false, [&](KvCacheSession& s) { return s.fch_ + b4; },
                ln_of, worker);
            for (KvCacheSession* s : batch)
                gelu_forward(s->fch_ + b4, s->fch_ + b4, n4);
            lead.barrier_->arrive_and_wait();
            products(
                p.fcprojw, b, n, 4 * C, p.fcprojb, true,
                [&](KvCacheSession& s) { return s.x_ + b; },
                [](KvCacheSession& s) { return s.fch_; }, worker);
            lead.barrier_->arrive_and_wait();
        }
        // The head: each session's final LayerNorm, then the vocabulary rows once for all.
        const std::span<const float> w = lead.model_.weights();
        const float* wte = lead.model_.layout.tensor(w, ParamTensor::wte).data();
        for (KvCacheSession* s : batch) {
            WorkerScratch& ws = s->worker_scratch_[static_cast<std::size_t>(worker)];
            layernorm_forward(ws.ln, ws.ln_stats, ws.ln_stats + 1, s->x_,
                              lead.model_.layout.tensor(w, ParamTensor::lnfw).data(),
                              lead.model_.layout.tensor(w, ParamTensor::lnfb).data(), 1, C);
        }
        const Range rv = column_share(static_cast<std::size_t>(c.vocab_size), worker, W);
        products(
            wte, static_cast<long>(rv.begin), static_cast<int>(rv.end - rv.begin), C, nullptr,
            false, [&](KvCacheSession& s) { return s.logits_ + rv.begin; }, ln_of, worker);
    });
    for (std::size_t i = 0; i < batch.size(); ++i)
        batch[i]->context_.push_back(batch_tokens[i]);
}

}  // namespace gpt2
