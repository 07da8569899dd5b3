#include "model/kv_cache.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/error.hpp"
#include "ops/decode_attention.hpp"
#include "ops/decode_matvec.hpp"
#include "ops/gemm.hpp"
#include "ops/kernels.hpp"

namespace gpt2 {

namespace {
// Prompt positions encoded per forward: bounds the scratch (it does not grow with maxT) while
// keeping the GEMMs large enough to run near peak.
constexpr int kChunkRows = 128;
// Column shares are multiples of a cache line so workers never write the same line.
constexpr std::size_t kLineFloats = 16;
// Compact weight rows converted to fp32 per GEMM call (bounds the scratch they are copied into).
constexpr int kFp32RowsPerGemm = 64;
// Decode phases take tens to hundreds of microseconds and the workers arrive close together: a
// short spin (some 10-30 microseconds) usually avoids the sleep and wake-up.
constexpr int kDecodeBarrierSpins = 1000;

[[nodiscard]] std::size_t round_to_line(std::size_t count) {
    return (count + kLineFloats - 1) / kLineFloats * kLineFloats;
}

// Worker w's share of n columns, cut at cache-line multiples.
[[nodiscard]] Range column_share(std::size_t n, int w, int W) {
    const Range units = split_range((n + kLineFloats - 1) / kLineFloats, w, W);
    return Range{std::min(n, units.begin * kLineFloats), std::min(n, units.end * kLineFloats)};
}

[[nodiscard]] int checked_keep(const ModelConfig& c, int slide_keep) {
    const int maxT = c.max_seq_len;
    const int keep = slide_keep == 0 ? std::max(1, maxT / 2) : slide_keep;
    if (keep < 1 || keep > maxT) {
        throw std::invalid_argument("KvCacheSession: slide_keep " + std::to_string(slide_keep) +
                                    " is outside [1, " + std::to_string(maxT) + "]");
    }
    return keep;
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

// out[i, 0:n] (row stride ldo) = (accumulate ? out : 0) + bias[0:n] + inp[i, 0:K] @ weight(n, K)^T
// for i < M: a slice of a linear layer, in the same order of operations as matmul_forward and
// matmul_residual_forward (bias first, then the product added onto it). fp32_rows:
// kFp32RowsPerGemm * K floats of scratch for compact weights.
void linear_slice(float* out, int ldo, const float* inp, int M, int K, const WeightRows& weight,
                  const float* bias, int n, bool accumulate, float* fp32_rows) {
    if (n <= 0) return;
    if (M == 1) {
        weight.matvec_into(out, inp, n, K, bias, accumulate);
        return;
    }
    for (int i = 0; i < M; ++i) {
        float* o = out + static_cast<long>(i) * ldo;
        if (accumulate) {
            for (int j = 0; j < n; ++j)
                o[j] += bias[j];
        } else {
            std::memcpy(o, bias, sizeof(float) * static_cast<std::size_t>(n));
        }
    }
    for (int j0 = 0; j0 < n; j0 += kFp32RowsPerGemm) {
        const int rows = std::min(kFp32RowsPerGemm, n - j0);
        gemm_nt(M, rows, K, 1.0f, inp, K, weight.as_fp32(j0, rows, K, fp32_rows), K, 1.0f, out + j0,
                ldo);
    }
}

// Appends M rows of keys, ln(M, C) @ wk(hs, C)^T + bias, to a head's transposed key cache at
// positions pos0.. (column pos0 + i of keys_t). `row` is hs floats of scratch for M = 1.
void append_keys(float* keys_t, int maxT, const float* ln, int M, int C, const WeightRows& wk,
                 const float* bias, int hs, int pos0, float* row, float* fp32_rows) {
    if (M == 1) {
        wk.matvec_into(row, ln, hs, C, bias, false);
        for (int d = 0; d < hs; ++d)
            keys_t[static_cast<long>(d) * maxT + pos0] = row[d];
        return;
    }
    for (int d = 0; d < hs; ++d)
        std::fill_n(keys_t + static_cast<long>(d) * maxT + pos0, M, bias[d]);
    // keys_t(hs, M) += wk(hs, C) @ ln(M, C)^T
    for (int d0 = 0; d0 < hs; d0 += kFp32RowsPerGemm) {
        const int rows = std::min(kFp32RowsPerGemm, hs - d0);
        gemm_nt(rows, M, C, 1.0f, wk.as_fp32(d0, rows, C, fp32_rows), C, ln, C, 1.0f,
                keys_t + static_cast<long>(d0) * maxT + pos0, maxT);
    }
}

// One head's cache, laid out as ops/decode_attention.hpp says: keys transposed (hs, maxT), values
// (maxT, hs), each maxT * hs elements. T is float, or Bf16 for sessions with compact weights
// (half the bytes a token's attention reads).
template <typename T>
struct HeadCache {
    T* keys_t;  // [d * maxT + position]
    T* values;  // [position * hs + d]
};

// Which way copy_positions copies: from the bf16 cache into its fp32 staging copy (exact), or
// from the staging copy back into the cache (rounded to bf16).
enum class CacheCopy { ToStage, ToStore };

// Copies positions [first, last) of a head's cache between the bf16 store and an fp32 staging
// copy of the same layout.
void copy_positions(const HeadCache<Bf16>& store, const HeadCache<float>& stage, int first,
                    int last, int hs, int maxT, CacheCopy direction) {
    if (last <= first) return;
    const auto count = static_cast<std::size_t>(last - first);
    const bool to_stage = direction == CacheCopy::ToStage;
    for (int d = 0; d < hs; ++d) {
        const long at = static_cast<long>(d) * maxT + first;
        if (to_stage) {
            convert_to_float(stage.keys_t + at, store.keys_t + at, count);
        } else {
            convert_to_bf16(store.keys_t + at, stage.keys_t + at, count);
        }
    }
    const long at = static_cast<long>(first) * hs;
    if (to_stage) {
        convert_to_float(stage.values + at, store.values + at, count * hs);
    } else {
        convert_to_bf16(store.values + at, stage.values + at, count * hs);
    }
}

}  // namespace

KvCacheSession::KvCacheSession(const Model& model, ThreadPool& pool, int slide_keep,
                               const DecodeWeights* compact)
    : model_(model),
      compact_(compact),
      pool_(pool),
      slide_keep_(checked_keep(model.config, slide_keep)),
      chunk_rows_(std::min(kChunkRows, model.config.max_seq_len)),
      workers_(pool.size()),
      barrier_(std::make_unique<WorkerBarrier>(pool.size(), kDecodeBarrierSpins)) {
    const ModelConfig& c = model.config;
    validate_config(c, "KvCacheSession");
    const auto L = static_cast<std::size_t>(c.num_layers);
    const auto C = static_cast<std::size_t>(c.channels);
    const auto maxT = static_cast<std::size_t>(c.max_seq_len);
    const auto rows = static_cast<std::size_t>(chunk_rows_);
    const auto W = static_cast<std::size_t>(workers_);
    context_.reserve(maxT);
    window_.reserve(maxT);
    if (compact != nullptr) {
        kv_bf16_ = AlignedBuffer<Bf16>(L * 2 * maxT * C);
    } else {
        kv_ = AlignedBuffer<float>(L * 2 * maxT * C);
    }

    const std::size_t x = round_to_line(rows * C), q = x, atty = x;
    const std::size_t fch = round_to_line(rows * 4 * C);
    const std::size_t logits = round_to_line(static_cast<std::size_t>(c.vocab_size));
    const std::size_t ln = round_to_line(rows * C), stats = round_to_line(2 * rows);
    // Attention scores: a prompt block's (kPromptScoreRows, maxT), or a token's in the first row
    // and its new key and value in the second.
    const std::size_t scores = round_to_line(kPromptScoreRows * maxT);
    // Compact weights: rows copied to fp32 for the prompts' GEMMs.
    const std::size_t fp32_rows = compact != nullptr ? round_to_line(kFp32RowsPerGemm * 4 * C) : 0;
    // bf16 cache: an fp32 staging copy of one head's cache for prompts (keys and values).
    const std::size_t stage = compact != nullptr ? round_to_line(2 * maxT * C / c.num_heads) : 0;
    scratch_ = AlignedBuffer<float>(x + q + atty + fch + logits +
                                    W * (ln + stats + scores + fp32_rows + stage));
    float* p = scratch_.data();
    const auto carve = [&p](std::size_t count) {
        float* start = p;
        p += count;
        return start;
    };
    x_ = carve(x);
    q_ = carve(q);
    atty_ = carve(atty);
    fch_ = carve(fch);
    logits_ = carve(logits);
    ln_ = carve(W * ln);
    ln_stats_ = carve(W * stats);
    scores_ = carve(W * scores);
    weight_rows_fp32_ = carve(W * fp32_rows);
    weight_rows_fp32_stride_ = fp32_rows;
    stage_ = carve(W * stage);
    stage_stride_ = stage;
}

KvCacheSession::~KvCacheSession() = default;

void KvCacheSession::check_token(std::int32_t token) const {
    if (token < 0 || token >= model_.config.vocab_size) {
        throw InputError("token id " + std::to_string(token) +
                         " is outside the model's vocabulary [0, " +
                         std::to_string(model_.config.vocab_size) + ")");
    }
}

std::span<const float> KvCacheSession::prefill(std::span<const std::int32_t> tokens) {
    if (tokens.empty()) throw std::invalid_argument("KvCacheSession::prefill: no tokens");
    for (const std::int32_t t : tokens)
        check_token(t);
    const std::size_t n = std::min(tokens.size(), static_cast<std::size_t>(config().max_seq_len));
    // Staged through window_ so that a caller may pass context() itself.
    window_.assign(tokens.end() - static_cast<std::ptrdiff_t>(n), tokens.end());
    encode_window();
    return {logits_, static_cast<std::size_t>(config().vocab_size)};
}

std::span<const float> KvCacheSession::step(std::int32_t token) {
    check_token(token);
    if (length() < config().max_seq_len) {
        forward_rows(std::span<const std::int32_t>(&token, 1), true);
        return {logits_, static_cast<std::size_t>(config().vocab_size)};
    }
    // Full: re-encode the last slide_keep tokens (the new one included) from position 0.
    window_.assign(context_.end() - (slide_keep_ - 1), context_.end());
    window_.push_back(token);
    ++slides_;
    encode_window();
    return {logits_, static_cast<std::size_t>(config().vocab_size)};
}

void KvCacheSession::encode_window() {
    context_.clear();
    const std::span<const std::int32_t> all(window_);
    const auto chunk = static_cast<std::size_t>(chunk_rows_);
    for (std::size_t start = 0; start < all.size(); start += chunk) {
        const std::size_t rows = std::min(chunk, all.size() - start);
        forward_rows(all.subspan(start, rows), start + rows == all.size());
    }
}

// Longer than the usual screen, on purpose: it is one thread-pool task whose phases (embed,
// per layer: LayerNorm, QKV, attention, projections, MLP; then the head) are separated by
// barriers and share a dozen locals; cut into functions, each would need all of them passed in.
void KvCacheSession::forward_rows(std::span<const std::int32_t> tokens, bool logits) {
    const ModelConfig& c = model_.config;
    const int M = static_cast<int>(tokens.size());
    const int pos0 = length();
    const int C = c.channels, NH = c.num_heads, hs = c.head_size(), maxT = c.max_seq_len;
    const int W = workers_;
    const std::span<const float> w = model_.weights();
    const float* wte = model_.layout.tensor(w, ParamTensor::wte).data();
    const float* wpe = model_.layout.tensor(w, ParamTensor::wpe).data();
    const std::size_t ln_stride = round_to_line(static_cast<std::size_t>(chunk_rows_) * C);
    const std::size_t stats_stride = round_to_line(2 * static_cast<std::size_t>(chunk_rows_));
    const std::size_t scores_stride =
        round_to_line(static_cast<std::size_t>(kPromptScoreRows) * maxT);
    const auto head_cache = [&](int l, int h) {
        float* keys = kv_.data() + (static_cast<long>(l) * 2 * NH + h) * maxT * hs;
        return HeadCache<float>{keys, keys + static_cast<long>(NH) * maxT * hs};
    };
    const auto head_cache_bf16 = [&](int l, int h) {
        Bf16* keys = kv_bf16_.data() + (static_cast<long>(l) * 2 * NH + h) * maxT * hs;
        return HeadCache<Bf16>{keys, keys + static_cast<long>(NH) * maxT * hs};
    };
    const bool bf16_cache = kv_bf16_.size() > 0;
    // Each worker's private LayerNorm output (recomputed by all: cheaper than a barrier).
    const auto worker_ln = [&](int worker, const float* inp, const float* weight, const float* bias,
                               int rows) {
        float* out = ln_ + ln_stride * static_cast<std::size_t>(worker);
        float* mean = ln_stats_ + stats_stride * static_cast<std::size_t>(worker);
        layernorm_forward(out, mean, mean + chunk_rows_, inp, weight, bias, rows, C);
        return out;
    };

    for (int i = 0; i < M; ++i) {
        const float* te = wte + static_cast<long>(tokens[static_cast<std::size_t>(i)]) * C;
        const float* pe = wpe + static_cast<long>(pos0 + i) * C;
        float* o = x_ + static_cast<long>(i) * C;
        for (int j = 0; j < C; ++j)
            o[j] = te[j] + pe[j];
    }

    const float* lnfw = model_.layout.tensor(w, ParamTensor::lnfw).data();
    const float* lnfb = model_.layout.tensor(w, ParamTensor::lnfb).data();
    // The `count` rows of a matrix starting at `weight` (a pointer into the fp32 parameters), in
    // the format this session decodes with. No rows are looked up for an empty share: with more
    // workers than cache lines of columns, one may start at the matrix's end, which
    // DecodeWeights::rows refuses (and nothing reads them).
    const auto rows_at = [&](const float* weight, long count) {
        return compact_ != nullptr && count > 0 ? WeightRows{nullptr, compact_->rows(weight)}
                                                : WeightRows{weight, {}};
    };
    // One pool.run per forward; the phases inside are separated by barriers (4 per layer). Each
    // phase writes only its worker's share, and the next reads what all shares wrote.
    const auto forward_worker = [&](int worker) {
        float* scores = scores_ + scores_stride * static_cast<std::size_t>(worker);
        float* fp32_rows =
            weight_rows_fp32_ + weight_rows_fp32_stride_ * static_cast<std::size_t>(worker);
        float* stage = stage_ + stage_stride_ * static_cast<std::size_t>(worker);
        for (int l = 0; l < c.num_layers; ++l) {
            const LayerView<const float> p = layer_view(model_.layout, model_.weights(), l);
            // qkv and attention, by head: a head's attention needs only its own q, k and v.
            const float* ln = worker_ln(worker, x_, p.ln1w, p.ln1b, M);
            const Range heads = split_range(static_cast<std::size_t>(NH), worker, W);
            for (auto h = static_cast<int>(heads.begin); h < static_cast<int>(heads.end); ++h) {
                const long col = static_cast<long>(h) * hs;
                linear_slice(q_ + col, C, ln, M, C, rows_at(p.qkvw + col * C, hs), p.qkvb + col, hs,
                             false, fp32_rows);
                const WeightRows wk = rows_at(p.qkvw + (C + col) * C, hs);
                const WeightRows wv = rows_at(p.qkvw + (2L * C + col) * C, hs);
                if (bf16_cache && M == 1) {
                    // One token: its key and value rounded into the bf16 cache, which the query
                    // then reads directly.
                    const HeadCache<Bf16> store = head_cache_bf16(l, h);
                    float* row = scores + maxT;
                    wk.matvec_into(row, ln, hs, C, p.qkvb + C + col, false);
                    for (int d = 0; d < hs; ++d)
                        store.keys_t[static_cast<long>(d) * maxT + pos0] = to_bf16(row[d]);
                    wv.matvec_into(row, ln, hs, C, p.qkvb + 2 * C + col, false);
                    convert_to_bf16(store.values + static_cast<long>(pos0) * hs, row,
                                    static_cast<std::size_t>(hs));
                    attend_one_query(atty_ + col, q_ + col, store.keys_t, store.values, scores,
                                     pos0, hs, maxT);
                    continue;
                }
                // fp32 cache, or a prompt with the bf16 cache: the fp32 path on a staging copy
                // of the head's earlier positions, the new ones rounded back afterwards.
                const HeadCache<float> cache =
                    bf16_cache ? HeadCache<float>{stage, stage + static_cast<long>(maxT) * hs}
                               : head_cache(l, h);
                if (bf16_cache)
                    copy_positions(head_cache_bf16(l, h), cache, 0, pos0, hs, maxT,
                                   CacheCopy::ToStage);
                append_keys(cache.keys_t, maxT, ln, M, C, wk, p.qkvb + C + col, hs, pos0,
                            scores + maxT, fp32_rows);
                linear_slice(cache.values + static_cast<long>(pos0) * hs, hs, ln, M, C, wv,
                             p.qkvb + 2 * C + col, hs, false, fp32_rows);
                if (bf16_cache) {
                    // Round the new positions, and attend with the rounded values as a step
                    // would (the prompt's logits then match token-by-token decoding).
                    copy_positions(head_cache_bf16(l, h), cache, pos0, pos0 + M, hs, maxT,
                                   CacheCopy::ToStore);
                    copy_positions(head_cache_bf16(l, h), cache, pos0, pos0 + M, hs, maxT,
                                   CacheCopy::ToStage);
                }
                if (M == 1) {
                    attend_one_query(atty_ + col, q_ + col, cache.keys_t, cache.values, scores,
                                     pos0, hs, maxT);
                } else {
                    attend_prompt_rows(atty_ + col, q_ + col, cache.keys_t, cache.values, scores, M,
                                       pos0, C, hs, maxT);
                }
            }
            barrier_->arrive_and_wait();
            // Attention projection onto the residual stream, by output column.
            const Range r = column_share(static_cast<std::size_t>(C), worker, W);
            const auto b = static_cast<long>(r.begin);
            const int n = static_cast<int>(r.end - r.begin);
            linear_slice(x_ + b, C, atty_, M, C, rows_at(p.attprojw + b * C, n), p.attprojb + b, n,
                         true, fp32_rows);
            barrier_->arrive_and_wait();
            // MLP up-projection and GELU, by hidden column.
            const float* ln2 = worker_ln(worker, x_, p.ln2w, p.ln2b, M);
            const Range r4 = column_share(4 * static_cast<std::size_t>(C), worker, W);
            const auto b4 = static_cast<long>(r4.begin);
            const int n4 = static_cast<int>(r4.end - r4.begin);
            linear_slice(fch_ + b4, 4 * C, ln2, M, C, rows_at(p.fcw + b4 * C, n4), p.fcb + b4, n4,
                         false, fp32_rows);
            for (int i = 0; i < M; ++i) {
                float* h = fch_ + static_cast<long>(i) * 4 * C + b4;
                gelu_forward(h, h, n4);
            }
            barrier_->arrive_and_wait();
            // MLP down-projection onto the residual stream, by output column.
            linear_slice(x_ + b, C, fch_, M, 4 * C, rows_at(p.fcprojw + b * 4 * C, n),
                         p.fcprojb + b, n, true, fp32_rows);
            barrier_->arrive_and_wait();
        }
        if (!logits) return;
        // Final LayerNorm of the last row and the LM head (tied to wte), by vocabulary row; the
        // padded rows >= V are never predicted, so they are not computed.
        const float* lnf = worker_ln(worker, x_ + static_cast<long>(M - 1) * C, lnfw, lnfb, 1);
        const Range r = column_share(static_cast<std::size_t>(c.vocab_size), worker, W);
        const auto rows = static_cast<int>(r.end - r.begin);
        rows_at(wte + static_cast<long>(r.begin) * C, rows)
            .matvec_into(logits_ + r.begin, lnf, rows, C, nullptr, false);
    };
    // A worker that fails releases the others from the barrier (they leave with BarrierAborted)
    // instead of leaving them waiting for it forever; the pool rethrows its error.
    barrier_->reset();
    pool_.run([&](int worker) {
        try {
            forward_worker(worker);
        } catch (const BarrierAborted&) {
            return;
        } catch (...) {
            barrier_->abort();
            throw;
        }
    });
    context_.insert(context_.end(), tokens.begin(), tokens.end());
}

GenerationStats generate_kv(KvCacheSession& session, std::vector<std::int32_t>& tokens, int count,
                            const SamplingParams& params, Rng& rng,
                            const std::function<void(std::int32_t)>& on_token, int vocab_limit) {
    if (tokens.empty()) throw std::invalid_argument("generate_kv: empty prompt");
    GenerationStats stats;
    if (count <= 0) {
        stats.prompt_tokens =
            std::min<int>(static_cast<int>(tokens.size()), session.config().max_seq_len);
        return stats;
    }
    using Clock = std::chrono::steady_clock;
    const int V = session.config().vocab_size;
    const auto limit = static_cast<std::size_t>(vocab_limit > 0 ? std::min(vocab_limit, V) : V);
    const int slides_before = session.slides();
    tokens.reserve(tokens.size() + static_cast<std::size_t>(count));
    std::vector<std::pair<float, int>> scratch;
    scratch.reserve(limit);

    const auto t0 = Clock::now();
    std::span<const float> logits = session.prefill(tokens);
    const auto t1 = Clock::now();
    stats.prompt_tokens = session.length();
    for (int n = 0; n < count; ++n) {
        const int next = sample_token(logits.first(limit), params, rng, scratch);
        tokens.push_back(next);
        ++stats.generated_tokens;
        if (on_token) on_token(next);
        if (n + 1 < count) logits = session.step(next);
    }
    const auto t2 = Clock::now();
    stats.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
    stats.generate_seconds = std::chrono::duration<double>(t2 - t1).count();
    stats.slides = session.slides() - slides_before;
    return stats;
}

}  // namespace gpt2
