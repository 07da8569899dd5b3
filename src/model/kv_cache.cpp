// A KvCacheSession's memory and its life: the cache and scratch laid out once, prefill, step and
// the sliding window, generate_kv. The passes themselves: kv_cache_prompt.cpp, kv_cache_token.cpp.
#include "model/kv_cache.hpp"

#include "model/block_parts.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/clock.hpp"
#include "core/error.hpp"
#include "model/kv_cache_passes.hpp"
#include "ops/decode_attention.hpp"
#include "ops/decode_matvec.hpp"
#include "ops/gemm.hpp"
#include "ops/kernels.hpp"
#include "ops/prompt_products.hpp"

namespace gpt2 {

using namespace kv_cache_detail;

namespace {
// Prompt positions encoded per forward: bounds the scratch (it does not grow with maxT) while
// keeping the products large enough to run near peak.
constexpr int kChunkRows = 256;
// Decode phases take tens to hundreds of microseconds and the workers arrive close together: a
// short spin (some 10-30 microseconds) usually avoids the sleep and wake-up.
constexpr int kDecodeBarrierSpins = 1000;

[[nodiscard]] std::size_t round_to_line(std::size_t count) {
    return (count + kLineFloats - 1) / kLineFloats * kLineFloats;
}

// The next `count` floats of a buffer being laid out (null for none), moving `next` past them.
[[nodiscard]] float* carve(float*& next, std::size_t count) {
    float* start = count > 0 ? next : nullptr;
    next += count;
    return start;
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

// Auto resolved: pieces where oneDNN runs them with the instructions made for them, bf16 on AMX and
// int8 on AVX512-VNNI or AMX; elsewhere pieces measured no faster than the fp32 GEMM on widened
// rows (bf16 without AMX, int8 on AVX-512 alone) or have no oneDNN kernel (AVX2).
[[nodiscard]] PromptProducts resolved(PromptProducts wanted, const DecodeWeights* compact) {
    if (compact == nullptr) return PromptProducts::Widened;
    if (wanted != PromptProducts::Auto) return wanted;
    const bool native = compact->format() == WeightFormat::Int8
                            ? int8_products_native()
                            : bf16_backend() == Bf16Backend::Amx;
    return native ? PromptProducts::Pieces : PromptProducts::Widened;
}

}  // namespace

Generator::Generator(const Model& model, ThreadPool& pool, const DecodeWeights* compact,
                     PromptProducts prompt)
    : model_(model),
      compact_(compact),
      pool_(pool),
      chunk_rows_(std::min(kChunkRows, model.config.max_seq_len)),
      prompt_products_(resolved(prompt, compact)),
      bf16_attention_(compact != nullptr && prompt_products_ == PromptProducts::Pieces &&
                      (bf16_backend() == Bf16Backend::Amx || prompt == PromptProducts::Pieces)),
      barrier_(std::make_unique<WorkerBarrier>(pool.size(), kDecodeBarrierSpins)) {
    const ModelConfig& c = model.config;
    validate_config(c, "Generator");
    if (c.arch.positions == PositionKind::Rotary) {
        rotary_ = rotary_table(c.max_seq_len, c.head_size(), c.arch.rope_theta);
    }
    // Every thread of the pool may run prompt products at once (more than OpenBLAS takes: oneDNN).
    choose_gemm_library(pool.size());
    const auto C = static_cast<std::size_t>(c.channels);
    const auto maxT = static_cast<std::size_t>(c.max_seq_len);
    const auto rows = static_cast<std::size_t>(chunk_rows_);
    const auto W = static_cast<std::size_t>(pool.size());

    const std::size_t x = round_to_line(rows * C), qkv = round_to_line(rows * 3 * C), atty = x;
    // The MLP's first product: GPT-2's 4C, a gated MLP's gate and up (which may be wider).
    const std::size_t fch =
        round_to_line(rows * std::max(4 * C, static_cast<std::size_t>(c.fc_width())));
    const std::size_t ln = x, ln_stats = round_to_line(2 * rows);
    // Attention scores of a prompt block: (kPromptScoreRows, maxT).
    const std::size_t scores = round_to_line(kPromptScoreRows * maxT);
    const bool widened = compact != nullptr && prompt_products_ == PromptProducts::Widened;
    const bool pieces = compact != nullptr && prompt_products_ == PromptProducts::Pieces;
    const bool int8 = compact != nullptr && compact->format() == WeightFormat::Int8;
    // Compact weights: rows copied to fp32 for the prompts' GEMMs.
    // The longest input a product reads: GPT-2's 4C, or the MLP's hidden width.
    const std::size_t longest = std::max(4 * C, static_cast<std::size_t>(c.mlp_hidden()));
    const std::size_t weight_rows = widened ? round_to_line(kFp32RowsPerGemm * longest) : 0;
    // bf16 cache: an fp32 staging copy of one head's cache for prompts (keys and values), or the
    // bf16 attention's scratch.
    const int hs = c.head_size();
    const std::size_t stage =
        compact != nullptr && !bf16_attention_ ? round_to_line(2 * maxT * C / c.num_heads) : 0;
    const std::size_t attention_floats =
        bf16_attention_ ? round_to_line(prompt_attention_scratch_floats(hs, c.max_seq_len)) : 0;
    const std::size_t attention_pieces =
        bf16_attention_ ? round_to_line(prompt_attention_scratch_pieces(hs, c.max_seq_len)) : 0;
    // Pieces: the activations' pieces (inputs at most `longest`) and their scales, shared; each
    // worker's partial products.
    const std::size_t piece_count = int8 ? kInt8Pieces : kBf16Pieces;
    const std::size_t piece_rows = (rows + kPiecesRowMultiple - 1) / kPiecesRowMultiple *
                                   kPiecesRowMultiple;  // the padded rows the products run on
    const std::size_t piece_scales = pieces && int8 ? round_to_line(piece_count * piece_rows) : 0;
    const std::size_t products =
        pieces ? round_to_line(piece_count * piece_rows * kPiecesColumns) : 0;
    const std::size_t products_f32 = int8 ? 0 : products;
    scratch_ =
        AlignedBuffer<float>(x + qkv + atty + fch + ln + ln_stats + piece_scales +
                             W * (scores + weight_rows + stage + attention_floats + products_f32));
    // The activations' bf16 pieces, then each worker's attention pieces.
    const std::size_t bf16_pieces = pieces && !int8 ? piece_count * piece_rows * longest : 0;
    if (pieces && int8) {
        pieces_int8_ = AlignedBuffer<std::int8_t>(piece_count * piece_rows * longest);
        products_s32_ = AlignedBuffer<std::int32_t>(W * products);
    }
    if (bf16_pieces + W * attention_pieces > 0)
        pieces_bf16_ = AlignedBuffer<Bf16>(bf16_pieces + W * attention_pieces);
    float* p = scratch_.data();
    x_ = carve(p, x);
    qkv_ = carve(p, qkv);
    atty_ = carve(p, atty);
    fch_ = carve(p, fch);
    ln_ = carve(p, ln);
    ln_stats_ = carve(p, ln_stats);
    piece_scales_ = carve(p, piece_scales);
    worker_scratch_.resize(W);
    for (std::size_t w = 0; w < W; ++w) {
        WorkerScratch& s = worker_scratch_[w];
        s.scores = carve(p, scores);
        s.weight_rows = carve(p, weight_rows);
        s.stage = carve(p, stage);
        s.attention_floats = carve(p, attention_floats);
        if (attention_pieces > 0)
            s.attention_pieces = pieces_bf16_.data() + bf16_pieces + w * attention_pieces;
        s.products_f32 = carve(p, products_f32);
        if (products_s32_.size() > 0) s.products_s32 = products_s32_.data() + w * products;
    }
    // Touched here: the pages are the generator's set-up rather than the first prompt's.
    scratch_.fill_zero();
    pieces_bf16_.fill_zero();
    pieces_int8_.fill_zero();
    products_s32_.fill_zero();
}

Generator::~Generator() = default;

std::string Generator::prompt_products_name() const {
    const std::string fp32 = "fp32 GEMM (" + gemm_library_name() + ")";
    if (compact_ == nullptr) return fp32;
    const std::string format(weight_format_name(compact_->format()));
    if (prompt_products_ == PromptProducts::Widened) return format + " rows widened to " + fp32;
    const bool int8 = compact_->format() == WeightFormat::Int8;
    std::string kernels;
    switch (bf16_backend()) {
        case Bf16Backend::Amx:
            kernels = int8 ? "oneDNN, AMX-INT8" : "oneDNN, AMX-BF16";
            break;
        case Bf16Backend::Fp32Emulated:
            kernels = int8 ? "a plain loop" : "the fp32 GEMM on bf16 operands";
            break;
        default:
            kernels = int8 ? (int8_products_native() ? "oneDNN, AVX512-VNNI" : "oneDNN")
                           : bf16_backend_name(bf16_backend());
            break;
    }
    return "activations in " + std::to_string(int8 ? kInt8Pieces : kBf16Pieces) + " " + format +
           " pieces against the " + format + " rows (" + kernels + ")";
}

KvCacheSession::KvCacheSession(Generator& generator, int slide_keep)
    : KvCacheSession(nullptr, &generator, slide_keep) {}

KvCacheSession::KvCacheSession(const Model& model, ThreadPool& pool, int slide_keep,
                               const DecodeWeights* compact, PromptProducts prompt)
    : KvCacheSession(std::make_unique<Generator>(model, pool, compact, prompt), nullptr,
                     slide_keep) {}

KvCacheSession::KvCacheSession(std::unique_ptr<Generator> own, Generator* shared, int slide_keep)
    : own_generator_(std::move(own)),
      gen_(own_generator_ != nullptr ? *own_generator_ : *shared),
      model_(gen_.model_),
      compact_(gen_.compact_),
      pool_(gen_.pool_),
      workers_(gen_.pool_.size()),
      barrier_(gen_.barrier_.get()),
      slide_keep_(checked_keep(gen_.model_.config, slide_keep)) {
    const ModelConfig& c = model_.config;
    const auto L = static_cast<std::size_t>(c.num_layers);
    const auto C = static_cast<std::size_t>(c.channels);
    const auto maxT = static_cast<std::size_t>(c.max_seq_len);
    const auto W = static_cast<std::size_t>(workers_);
    context_.reserve(maxT);
    window_.reserve(maxT);
    const auto KV = static_cast<std::size_t>(c.kv_heads() * c.head_size());  // C for GPT-2
    if (compact_ != nullptr) {
        kv_bf16_ = AlignedBuffer<Bf16>(L * 2 * maxT * KV);
    } else {
        kv_ = AlignedBuffer<float>(L * 2 * maxT * KV);
    }
    const std::size_t x = round_to_line(C), atty = x;
    const std::size_t qkv = round_to_line(static_cast<std::size_t>(c.qkv_width()));
    const std::size_t fch = round_to_line(static_cast<std::size_t>(c.fc_width()));
    const std::size_t logits = round_to_line(static_cast<std::size_t>(c.vocab_size));
    // Each worker's LayerNorm of one row (a token's, a prompt's last) and its statistics, and a
    // token's scores, new key and new value.
    const std::size_t worker_ln = round_to_line(C), worker_stats = kLineFloats;
    const std::size_t scores = round_to_line(3 * maxT);
    scratch_ = AlignedBuffer<float>(x + qkv + atty + fch + logits +
                                    W * (worker_ln + worker_stats + scores));
    float* p = scratch_.data();
    x_ = carve(p, x);
    qkv_ = carve(p, qkv);
    atty_ = carve(p, atty);
    fch_ = carve(p, fch);
    logits_ = carve(p, logits);
    worker_scratch_.resize(W);
    for (WorkerScratch& s : worker_scratch_) {
        s.ln = carve(p, worker_ln);
        s.ln_stats = carve(p, worker_stats);
        s.scores = carve(p, scores);
    }
    // The memory is mapped lazily: touched here, the pages are the session's set-up rather than
    // the first prompt's (whose keys and values reach every 2 MiB page of the cache: zeroing it
    // then made the first prefill take several times as long as the next ones).
    kv_.fill_zero();
    kv_bf16_.fill_zero();
    scratch_.fill_zero();
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
        forward_token(token);
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
    const auto chunk = static_cast<std::size_t>(gen_.chunk_rows_);
    for (std::size_t start = 0; start < all.size(); start += chunk) {
        const std::size_t rows = std::min(chunk, all.size() - start);
        const bool last = start + rows == all.size();
        if (rows == 1) {
            // One position is a token's forward (the same function, matrix-vector products);
            // only the last chunk can be this short, so its logits are wanted.
            forward_token(all[start]);
        } else {
            forward_prompt(all.subspan(start, rows), last);
        }
    }
}

void KvCacheSession::embed(std::span<const std::int32_t> tokens, int pos0, float* out) const {
    const int C = model_.config.channels;
    const std::span<const float> w = model_.weights();
    const float* wte = model_.layout.tensor(w, ParamTensor::wte).data();
    const float* wpe = tensor_or_null(model_.layout, w, ParamTensor::wpe);  // null: rotary
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        const float* te = wte + static_cast<long>(tokens[i]) * C;
        float* o = out + static_cast<long>(i) * C;
        if (wpe == nullptr) {
            std::copy(te, te + C, o);
        } else {
            const float* pe = wpe + static_cast<long>(pos0 + static_cast<int>(i)) * C;
            for (int j = 0; j < C; ++j)
                o[j] = te[j] + pe[j];
        }
        float rstd = 0.0f;
        embedding_norm_forward(model_.config, o, &rstd, 1);  // where the architecture norms them
    }
}

void KvCacheSession::head_logits(int worker, const float* row) {
    const ModelConfig& c = model_.config;
    const int C = c.channels;
    const std::span<const float> w = model_.weights();
    const float* wte = model_.layout.tensor(w, head_tensor(model_.layout)).data();
    WorkerScratch& ws = worker_scratch_[static_cast<std::size_t>(worker)];
    norm_forward(c, ws.ln, ws.ln_stats, ws.ln_stats + 1, row,
                 tensor_or_null(model_.layout, w, ParamTensor::lnfw),
                 tensor_or_null(model_.layout, w, ParamTensor::lnfb), 1);
    // The LM head (wte, or its own where untied); the padded rows >= V are never predicted, so
    // they are not computed.
    const Range r = column_share(static_cast<std::size_t>(c.vocab_size), worker, workers_);
    const auto rows = static_cast<int>(r.end - r.begin);
    weight_rows(compact_, wte + static_cast<long>(r.begin) * C, rows)
        .matvec_into(logits_ + r.begin, ws.ln, rows, C, nullptr, false);
}

GenerationStats generate_kv(KvCacheSession& session, std::vector<std::int32_t>& tokens, int count,
                            const SamplingParams& params, Rng& rng, const TokenCallback& on_token,
                            int vocab_limit) {
    if (tokens.empty()) throw std::invalid_argument("generate_kv: empty prompt");
    GenerationStats stats;
    if (count <= 0) {
        stats.prompt_tokens =
            std::min<int>(static_cast<int>(tokens.size()), session.config().max_seq_len);
        return stats;
    }
    const int V = session.config().vocab_size;
    const auto limit = static_cast<std::size_t>(vocab_limit > 0 ? std::min(vocab_limit, V) : V);
    const int slides_before = session.slides();
    tokens.reserve(tokens.size() + static_cast<std::size_t>(count));
    std::vector<std::pair<float, int>> scratch;
    scratch.reserve(limit);

    Stopwatch stopwatch;
    std::span<const float> logits = session.prefill(tokens);
    stats.prefill_seconds = stopwatch.lap();
    stats.prompt_tokens = session.length();
    std::vector<float> penalized;  // the logits with the repetition penalty, when there is one
    for (int n = 0; n < count; ++n) {
        std::span<const float> choose_from = logits.first(limit);
        if (params.repetition_penalty != 1.0f) {
            penalized.assign(choose_from.begin(), choose_from.end());
            apply_repetition_penalty(penalized, tokens, params.repetition_penalty);
            choose_from = penalized;
        }
        const int next = sample_token(choose_from, params, rng, scratch);
        tokens.push_back(next);
        ++stats.generated_tokens;
        if (on_token && on_token(next) == TokenVerdict::Stop) break;
        if (n + 1 < count) logits = session.step(next);
    }
    stats.generate_seconds = stopwatch.lap();
    stats.slides = session.slides() - slides_before;
    return stats;
}

}  // namespace gpt2
