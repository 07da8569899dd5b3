#include "model/kv_cache.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "core/clock.hpp"
#include "core/error.hpp"
#include "ops/decode_attention.hpp"
#include "ops/decode_matvec.hpp"
#include "ops/gemm.hpp"
#include "ops/kernels.hpp"
#include "ops/prompt_products.hpp"

namespace gpt2 {

namespace {
// Prompt positions encoded per forward: bounds the scratch (it does not grow with maxT) while
// keeping the products large enough to run near peak.
constexpr int kChunkRows = 256;
// Column shares are multiples of a cache line so workers never write the same line.
constexpr std::size_t kLineFloats = 16;
// Compact weight rows converted to fp32 per GEMM call (bounds the scratch they are copied into).
// 32 rather than 64: how the GEMM sums decides which way a key or value that falls on a bf16
// rounding edge goes in the cache; over 200 20-token prompts of the prompt-vs-token test's model,
// 32 left the logits more than 1e-5 from the token path's twice in each format, 64 five and six
// times (a rounding edge is a step of 2^-8 in one cached value: no order avoids them all).
constexpr int kFp32RowsPerGemm = 32;
// Output columns per pieces product: its partial results (3 x 256 rows x 256 columns) stay in L2
// for the sum that follows; 512 took some 15% longer, 128 no less.
constexpr int kPiecesColumns = 256;
// Pieces products run on rows padded to a multiple of this, so that prompts of different lengths
// share oneDNN's primitives (created once per shape and worker) instead of each creating its own.
constexpr int kPiecesRowMultiple = 16;
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

// The input of a prompt's products: M rows of K activations, and, for products with pieces, the
// same split into them (rows padded to Mp).
struct PromptInput {
    const float* x = nullptr;  // (M, K), rows K apart
    int M = 0, K = 0, Mp = 0;
    const Bf16* bf16 = nullptr;         // (kBf16Pieces * Mp, K)
    const std::int8_t* int8 = nullptr;  // (kInt8Pieces * Mp, K)
    const float* scales = nullptr;      // (kInt8Pieces * Mp)
};

// Where a pieces product's partial results go, and the widened rows' scratch.
struct ProductScratch {
    float* weight_rows;  // kFp32RowsPerGemm * K floats
    float* f32;          // kBf16Pieces * Mp * kPiecesColumns floats
    std::int32_t* s32;   // kInt8Pieces * Mp * kPiecesColumns
};

// out[i, 0:n] (row stride ldo) = (accumulate ? out : 0) + bias[0:n] + in[i, 0:K] @ weight(n, K)^T
// for i < M: a slice of a linear layer. fp32 weights: the bias first, then the product added onto
// it by the fp32 GEMM (the order of matmul_forward and matmul_residual_forward). Compact weights:
// the pieces products when `in` carries pieces, else the rows widened to fp32 for the same GEMM.
void linear_rows(float* out, int ldo, const PromptInput& in, const WeightRows& weight,
                 const float* bias, int n, bool accumulate, const ProductScratch& scratch) {
    if (n <= 0) return;
    const int M = in.M, K = in.K;
    if (weight.compact.bf16 != nullptr && in.bf16 != nullptr) {
        for (int j0 = 0; j0 < n; j0 += kPiecesColumns) {
            const int cols = std::min(kPiecesColumns, n - j0);
            pieces_product(out + j0, ldo, in.bf16, M, in.Mp, K,
                           weight.compact.bf16 + static_cast<long>(j0) * K, cols, bias + j0,
                           accumulate, scratch.f32);
        }
        return;
    }
    if (weight.compact.int8 != nullptr && in.int8 != nullptr) {
        for (int j0 = 0; j0 < n; j0 += kPiecesColumns) {
            const int cols = std::min(kPiecesColumns, n - j0);
            pieces_product(out + j0, ldo, in.int8, in.scales, M, in.Mp, K,
                           weight.compact.int8 + static_cast<long>(j0) * K,
                           weight.compact.scales + j0, cols, bias + j0, accumulate, scratch.s32);
        }
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
    const bool widened = weight.compact.bf16 != nullptr || weight.compact.int8 != nullptr;
    const int block = widened ? kFp32RowsPerGemm : n;
    for (int j0 = 0; j0 < n; j0 += block) {
        const int rows = std::min(block, n - j0);
        gemm_nt(M, rows, K, 1.0f, in.x, K, weight.as_fp32(j0, rows, K, scratch.weight_rows), K,
                1.0f, out + j0, ldo);
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

// Copies positions [0, count) of a head's bf16 cache into its fp32 staging copy (exact).
void stage_positions(const HeadCache<Bf16>& store, const HeadCache<float>& stage, int count, int hs,
                     int maxT) {
    if (count <= 0) return;
    for (int d = 0; d < hs; ++d) {
        const long at = static_cast<long>(d) * maxT;
        convert_to_float(stage.keys_t + at, store.keys_t + at, static_cast<std::size_t>(count));
    }
    convert_to_float(stage.values, store.values,
                     static_cast<std::size_t>(count) * static_cast<std::size_t>(hs));
}

// Writes M positions' keys and values (rows `ld` apart, hs each) into a head's cache at pos0..;
// a bf16 cache also gets them, rounded, in its fp32 staging copy (what attention then reads, as a
// token's attention reads the rounded cache).
void write_positions(const HeadCache<float>& cache, const float* k, const float* v, int ld, int M,
                     int pos0, int hs, int maxT) {
    for (int i = 0; i < M; ++i) {
        const float* ki = k + static_cast<long>(i) * ld;
        for (int d = 0; d < hs; ++d)
            cache.keys_t[static_cast<long>(d) * maxT + pos0 + i] = ki[d];
        std::memcpy(cache.values + static_cast<long>(pos0 + i) * hs, v + static_cast<long>(i) * ld,
                    sizeof(float) * static_cast<std::size_t>(hs));
    }
}
// With `stage` null, the bf16 cache alone.
void write_positions(const HeadCache<Bf16>& store, const HeadCache<float>* stage, const float* k,
                     const float* v, int ld, int M, int pos0, int hs, int maxT) {
    for (int i = 0; i < M; ++i) {
        const float* ki = k + static_cast<long>(i) * ld;
        const float* vi = v + static_cast<long>(i) * ld;
        const long row = static_cast<long>(pos0 + i) * hs;
        for (int d = 0; d < hs; ++d) {
            const long at = static_cast<long>(d) * maxT + pos0 + i;
            const Bf16 key = to_bf16(ki[d]), value = to_bf16(vi[d]);
            store.keys_t[at] = key;
            store.values[row + d] = value;
            if (stage != nullptr) {
                stage->keys_t[at] = to_float(key);
                stage->values[row + d] = to_float(value);
            }
        }
    }
}

}  // namespace

KvCacheSession::KvCacheSession(const Model& model, ThreadPool& pool, int slide_keep,
                               const DecodeWeights* compact, PromptProducts prompt)
    : model_(model),
      compact_(compact),
      pool_(pool),
      slide_keep_(checked_keep(model.config, slide_keep)),
      chunk_rows_(std::min(kChunkRows, model.config.max_seq_len)),
      workers_(pool.size()),
      prompt_products_(resolved(prompt, compact)),
      bf16_attention_(compact != nullptr && prompt_products_ == PromptProducts::Pieces &&
                      (bf16_backend() == Bf16Backend::Amx || prompt == PromptProducts::Pieces)),
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

    const std::size_t x = round_to_line(rows * C), qkv = round_to_line(rows * 3 * C), atty = x;
    const std::size_t fch = round_to_line(rows * 4 * C);
    const std::size_t logits = round_to_line(static_cast<std::size_t>(c.vocab_size));
    const std::size_t ln = x, ln_stats = round_to_line(2 * rows);
    // Each worker's LayerNorm of one row (a token's, a prompt's last) and its statistics.
    const std::size_t worker_ln = round_to_line(C), worker_stats = kLineFloats;
    // Attention scores: a prompt block's (kPromptScoreRows, maxT), or a token's in the first row
    // and its new key and value in the second.
    const std::size_t scores = round_to_line(kPromptScoreRows * maxT);
    const bool widened = compact != nullptr && prompt_products_ == PromptProducts::Widened;
    const bool pieces = compact != nullptr && prompt_products_ == PromptProducts::Pieces;
    const bool int8 = compact != nullptr && compact->format() == WeightFormat::Int8;
    // Compact weights: rows copied to fp32 for the prompts' GEMMs.
    const std::size_t weight_rows = widened ? round_to_line(kFp32RowsPerGemm * 4 * C) : 0;
    // bf16 cache: an fp32 staging copy of one head's cache for prompts (keys and values), or the
    // bf16 attention's scratch.
    const int hs = c.head_size();
    const std::size_t stage =
        compact != nullptr && !bf16_attention_ ? round_to_line(2 * maxT * C / c.num_heads) : 0;
    const std::size_t attention_floats =
        bf16_attention_ ? round_to_line(prompt_attention_scratch_floats(hs, c.max_seq_len)) : 0;
    const std::size_t attention_pieces =
        bf16_attention_ ? round_to_line(prompt_attention_scratch_pieces(hs, c.max_seq_len)) : 0;
    // Pieces: the activations' pieces (inputs at most 4C long) and their scales, shared; each
    // worker's partial products.
    const std::size_t piece_count = int8 ? kInt8Pieces : kBf16Pieces;
    const std::size_t piece_scales = pieces && int8 ? round_to_line(piece_count * rows) : 0;
    const std::size_t products = pieces ? round_to_line(piece_count * rows * kPiecesColumns) : 0;
    const std::size_t products_f32 = int8 ? 0 : products;
    scratch_ = AlignedBuffer<float>(x + qkv + atty + fch + logits + ln + ln_stats + piece_scales +
                                    W * (worker_ln + worker_stats + scores + weight_rows + stage +
                                         attention_floats + products_f32));
    // The activations' bf16 pieces, then each worker's attention pieces.
    const std::size_t bf16_pieces = pieces && !int8 ? piece_count * rows * 4 * C : 0;
    if (pieces && int8) {
        pieces_int8_ = AlignedBuffer<std::int8_t>(piece_count * rows * 4 * C);
        products_s32_ = AlignedBuffer<std::int32_t>(W * products);
    }
    if (bf16_pieces + W * attention_pieces > 0)
        pieces_bf16_ = AlignedBuffer<Bf16>(bf16_pieces + W * attention_pieces);
    float* p = scratch_.data();
    const auto carve = [&p](std::size_t count) {
        float* start = count > 0 ? p : nullptr;
        p += count;
        return start;
    };
    x_ = carve(x);
    qkv_ = carve(qkv);
    atty_ = carve(atty);
    fch_ = carve(fch);
    logits_ = carve(logits);
    ln_ = carve(ln);
    ln_stats_ = carve(ln_stats);
    piece_scales_ = carve(piece_scales);
    worker_scratch_.resize(W);
    for (std::size_t w = 0; w < W; ++w) {
        WorkerScratch& s = worker_scratch_[w];
        s.ln = carve(worker_ln);
        s.ln_stats = carve(worker_stats);
        s.scores = carve(scores);
        s.weight_rows = carve(weight_rows);
        s.stage = carve(stage);
        s.attention_floats = carve(attention_floats);
        if (attention_pieces > 0)
            s.attention_pieces = pieces_bf16_.data() + bf16_pieces + w * attention_pieces;
        s.products_f32 = carve(products_f32);
        if (products_s32_.size() > 0) s.products_s32 = products_s32_.data() + w * products;
    }
    // The memory is mapped lazily: touched here, the pages are the session's set-up rather than
    // the first prompt's (whose keys and values reach every 2 MiB page of the cache: zeroing it
    // then made the first prefill take several times as long as the next ones).
    kv_.fill_zero();
    kv_bf16_.fill_zero();
    scratch_.fill_zero();
    pieces_bf16_.fill_zero();
    pieces_int8_.fill_zero();
    products_s32_.fill_zero();
}

KvCacheSession::~KvCacheSession() = default;

std::string KvCacheSession::prompt_products_name() const {
    const std::string fp32 = std::string("fp32 GEMM (OpenBLAS ") + gemm_kernel_name() + ")";
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
    const auto chunk = static_cast<std::size_t>(chunk_rows_);
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

template <typename Forward>
void KvCacheSession::run_workers(Forward&& forward) {
    // A worker that fails releases the others from the barrier (they leave with BarrierAborted)
    // instead of leaving them waiting for it forever; the pool rethrows its error.
    barrier_->reset();
    pool_.run([&](int worker) {
        try {
            forward(worker);
        } catch (const BarrierAborted&) {
            return;
        } catch (...) {
            barrier_->abort();
            throw;
        }
    });
}

// Longer than the usual screen, on purpose: it is one thread-pool task whose phases (per layer:
// LayerNorm, QKV and attention, projections, MLP; then the head) are separated by barriers and
// share a dozen locals; cut into functions, each would need all of them passed in.
void KvCacheSession::forward_token(std::int32_t token) {
    const ModelConfig& c = model_.config;
    const int pos = length();
    const int C = c.channels, NH = c.num_heads, hs = c.head_size(), maxT = c.max_seq_len;
    const int W = workers_;
    const std::span<const float> w = model_.weights();
    const float* wte = model_.layout.tensor(w, ParamTensor::wte).data();
    const float* wpe = model_.layout.tensor(w, ParamTensor::wpe).data();
    const bool bf16_cache = kv_bf16_.size() > 0;
    {
        const float* te = wte + static_cast<long>(token) * C;
        const float* pe = wpe + static_cast<long>(pos) * C;
        for (int j = 0; j < C; ++j)
            x_[j] = te[j] + pe[j];
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
        // Final LayerNorm and the LM head (tied to wte), by vocabulary row; the padded rows >= V
        // are never predicted, so they are not computed.
        const float* lnf = layernorm(x_, lnfw, lnfb);
        const Range r = column_share(static_cast<std::size_t>(c.vocab_size), worker, W);
        const auto rows = static_cast<int>(r.end - r.begin);
        rows_at(wte + static_cast<long>(r.begin) * C, rows)
            .matvec_into(logits_ + r.begin, lnf, rows, C, nullptr, false);
    });
    context_.push_back(token);
}

// Longer than the usual screen, on purpose, as forward_token.
void KvCacheSession::forward_prompt(std::span<const std::int32_t> tokens, bool logits) {
    const ModelConfig& c = model_.config;
    const int M = static_cast<int>(tokens.size());
    const int pos0 = length();
    const int C = c.channels, NH = c.num_heads, hs = c.head_size(), maxT = c.max_seq_len;
    const int W = workers_;
    const std::span<const float> w = model_.weights();
    const float* wte = model_.layout.tensor(w, ParamTensor::wte).data();
    const float* wpe = model_.layout.tensor(w, ParamTensor::wpe).data();
    const bool bf16_cache = kv_bf16_.size() > 0;
    const bool pieces = compact_ != nullptr && prompt_products_ == PromptProducts::Pieces;
    const bool int8_pieces = pieces && compact_->format() == WeightFormat::Int8;
    const int Mp =
        pieces ? (M + kPiecesRowMultiple - 1) / kPiecesRowMultiple * kPiecesRowMultiple : M;
    for (int i = 0; i < M; ++i) {
        const float* te = wte + static_cast<long>(tokens[static_cast<std::size_t>(i)]) * C;
        const float* pe = wpe + static_cast<long>(pos0 + i) * C;
        float* o = x_ + static_cast<long>(i) * C;
        for (int j = 0; j < C; ++j)
            o[j] = te[j] + pe[j];
    }
    const float* lnfw = model_.layout.tensor(w, ParamTensor::lnfw).data();
    const float* lnfb = model_.layout.tensor(w, ParamTensor::lnfb).data();
    const auto rows_at = [&](const float* weight, long count) {
        return compact_ != nullptr && count > 0 ? WeightRows{nullptr, compact_->rows(weight)}
                                                : WeightRows{weight, {}};
    };
    // One pool.run per chunk; the phases inside are separated by barriers (7 per layer, 9 with
    // pieces). Each phase writes only its worker's share (of rows, columns or heads), and the next
    // reads what all shares wrote.
    run_workers([&](int worker) {
        WorkerScratch& ws = worker_scratch_[static_cast<std::size_t>(worker)];
        const ProductScratch products{ws.weight_rows, ws.products_f32, ws.products_s32};
        // The worker's rows of an input for the products: split into the shared pieces (the
        // padding rows too), where the products take pieces.
        const Range rows = split_range(static_cast<std::size_t>(Mp), worker, W);
        const auto i0 = static_cast<int>(rows.begin), i1 = static_cast<int>(rows.end);
        const auto split_rows = [&](const float* x, int K) {
            if (int8_pieces) {
                split_into_int8_pieces(pieces_int8_.data(), piece_scales_, x, K, M, Mp, K, i0, i1);
            } else if (pieces) {
                split_into_bf16_pieces(pieces_bf16_.data(), x, K, M, Mp, K, i0, i1);
            }
        };
        const auto input = [&](const float* x, int K) {
            PromptInput in{x, M, K, Mp};
            if (int8_pieces) {
                in.int8 = pieces_int8_.data();
                in.scales = piece_scales_;
            } else if (pieces) {
                in.bf16 = pieces_bf16_.data();
            }
            return in;
        };
        // The worker's rows of a LayerNorm of the residual stream into ln_, and their pieces.
        const auto layernorm_rows = [&](const float* weight, const float* bias) {
            const int real_end = std::min(i1, M);
            if (real_end > i0) {
                layernorm_forward(ln_ + static_cast<long>(i0) * C, ln_stats_ + i0,
                                  ln_stats_ + chunk_rows_ + i0, x_ + static_cast<long>(i0) * C,
                                  weight, bias, real_end - i0, C);
            }
            split_rows(ln_, C);
        };
        const Range r3 = column_share(3 * static_cast<std::size_t>(C), worker, W);
        const Range r = column_share(static_cast<std::size_t>(C), worker, W);
        const Range r4 = column_share(4 * static_cast<std::size_t>(C), worker, W);
        const auto b3 = static_cast<long>(r3.begin), b = static_cast<long>(r.begin),
                   b4 = static_cast<long>(r4.begin);
        const auto n3 = static_cast<int>(r3.end - r3.begin), n = static_cast<int>(r.end - r.begin),
                   n4 = static_cast<int>(r4.end - r4.begin);
        for (int l = 0; l < c.num_layers; ++l) {
            const LayerView<const float> p = layer_view(model_.layout, model_.weights(), l);
            // Queries, keys and values, by column.
            layernorm_rows(p.ln1w, p.ln1b);
            barrier_->arrive_and_wait();
            linear_rows(qkv_ + b3, 3 * C, input(ln_, C), rows_at(p.qkvw + b3 * C, n3), p.qkvb + b3,
                        n3, false, products);
            barrier_->arrive_and_wait();
            // The keys and values into the cache and attention, by head.
            const Range heads = split_range(static_cast<std::size_t>(NH), worker, W);
            for (auto h = static_cast<int>(heads.begin); h < static_cast<int>(heads.end); ++h) {
                const long col = static_cast<long>(h) * hs;
                const float* q = qkv_ + col;
                const float* k = q + C;
                const float* v = q + 2L * C;
                const long head = (static_cast<long>(l) * 2 * NH + h) * maxT * hs;
                const long values = static_cast<long>(NH) * maxT * hs;
                HeadCache<float> cache{};
                if (bf16_attention_) {
                    // The bf16 products read the cache as stored, the new positions rounded.
                    const HeadCache<Bf16> store{kv_bf16_.data() + head,
                                                kv_bf16_.data() + head + values};
                    write_positions(store, nullptr, k, v, 3 * C, M, pos0, hs, maxT);
                    attend_prompt_rows_bf16(atty_ + col, C, q, 3 * C, store.keys_t, store.values,
                                            {ws.attention_pieces, ws.attention_floats}, M, pos0, hs,
                                            maxT);
                    continue;
                }
                if (bf16_cache) {
                    // Attention reads an fp32 copy of the head's cache: its earlier positions
                    // as stored, the new ones rounded as a token's attention would see them.
                    const HeadCache<Bf16> store{kv_bf16_.data() + head,
                                                kv_bf16_.data() + head + values};
                    cache = HeadCache<float>{ws.stage, ws.stage + static_cast<long>(maxT) * hs};
                    stage_positions(store, cache, pos0, hs, maxT);
                    write_positions(store, &cache, k, v, 3 * C, M, pos0, hs, maxT);
                } else {
                    cache = HeadCache<float>{kv_.data() + head, kv_.data() + head + values};
                    write_positions(cache, k, v, 3 * C, M, pos0, hs, maxT);
                }
                attend_prompt_rows(atty_ + col, C, q, 3 * C, cache.keys_t, cache.values, ws.scores,
                                   M, pos0, hs, maxT);
            }
            barrier_->arrive_and_wait();
            // Attention projection onto the residual stream, by output column.
            if (pieces) {
                split_rows(atty_, C);
                barrier_->arrive_and_wait();
            }
            linear_rows(x_ + b, C, input(atty_, C), rows_at(p.attprojw + b * C, n), p.attprojb + b,
                        n, true, products);
            barrier_->arrive_and_wait();
            // MLP up-projection and GELU, by hidden column.
            layernorm_rows(p.ln2w, p.ln2b);
            barrier_->arrive_and_wait();
            linear_rows(fch_ + b4, 4 * C, input(ln_, C), rows_at(p.fcw + b4 * C, n4), p.fcb + b4,
                        n4, false, products);
            for (int i = 0; i < M; ++i) {
                float* hidden = fch_ + static_cast<long>(i) * 4 * C + b4;
                gelu_forward(hidden, hidden, n4);
            }
            barrier_->arrive_and_wait();
            // MLP down-projection onto the residual stream, by output column.
            if (pieces) {
                split_rows(fch_, 4 * C);
                barrier_->arrive_and_wait();
            }
            linear_rows(x_ + b, C, input(fch_, 4 * C), rows_at(p.fcprojw + b * 4 * C, n),
                        p.fcprojb + b, n, true, products);
            barrier_->arrive_and_wait();
        }
        if (!logits) return;
        // Final LayerNorm of the last row and the LM head (tied to wte), by vocabulary row; the
        // padded rows >= V are never predicted, so they are not computed.
        layernorm_forward(ws.ln, ws.ln_stats, ws.ln_stats + 1, x_ + static_cast<long>(M - 1) * C,
                          lnfw, lnfb, 1, C);
        const Range rv = column_share(static_cast<std::size_t>(c.vocab_size), worker, W);
        const auto vocab_rows = static_cast<int>(rv.end - rv.begin);
        rows_at(wte + static_cast<long>(rv.begin) * C, vocab_rows)
            .matvec_into(logits_ + rv.begin, ws.ln, vocab_rows, C, nullptr, false);
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
    for (int n = 0; n < count; ++n) {
        const int next = sample_token(logits.first(limit), params, rng, scratch);
        tokens.push_back(next);
        ++stats.generated_tokens;
        if (on_token) on_token(next);
        if (n + 1 < count) logits = session.step(next);
    }
    stats.generate_seconds = stopwatch.lap();
    stats.slides = session.slides() - slides_before;
    return stats;
}

}  // namespace gpt2
