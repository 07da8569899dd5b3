// KV-cache text generation: each new token costs one forward over ONE position, reusing the keys
// and values cached for the earlier ones, with one token's matrix-vector products split across a
// ThreadPool.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/random.hpp"
#include "model/decode_weights.hpp"
#include "model/model.hpp"
#include "model/sampling.hpp"
#include "ops/block_kernels.hpp"
#include "threads/barrier.hpp"
#include "threads/thread_pool.hpp"

namespace gpt2 {

// How a session with compact weights runs a prompt's matrix products: widening the rows to fp32 for
// the fp32 GEMM, or splitting the activations into bf16/int8 pieces multiplied by the rows as
// stored (ops/prompt_products.hpp: oneDNN's AMX kernels, several times the fp32 GEMM's rate). Both
// compute what a token's matrix-vector products compute, so a prompt's logits agree with
// token-by-token decoding either way.
enum class PromptProducts {
    Auto,     // pieces where oneDNN runs bf16/int8 on AMX, widened rows elsewhere
    Widened,  // compact rows widened to fp32, fp32 GEMM (gemm.hpp's library)
    Pieces,   // activations in bf16/int8 pieces against the rows as stored (oneDNN)
};

// What every sequence decoded with one model shares: the model, its weights in the decoding format,
// the worker pool and its barrier, and the scratch of a prompt's chunk (the activations of up to
// 256 positions, the workers' attention scores and product buffers), allocated once. A
// KvCacheSession is one sequence's memory: any number of them decode through one Generator, one
// pass at a time (a pass uses its scratch and its pool), so a server with N sequences holds N
// caches and one prompt scratch. The model, the pool and `compact` must outlive it.
class Generator {
  public:
    // `compact`, when given, holds the matrices in bf16 or int8 and is what the products read
    // (the sessions then keep their K/V caches in bf16: half the bytes each token's attention
    // reads); activations, LayerNorms and biases stay fp32. `prompt` chooses how a prompt's
    // products run with compact weights (ignored without).
    Generator(const Model& model, ThreadPool& pool, const DecodeWeights* compact = nullptr,
              PromptProducts prompt = PromptProducts::Auto);
    ~Generator();
    Generator(const Generator&) = delete;
    Generator& operator=(const Generator&) = delete;

    [[nodiscard]] const Model& model() const { return model_; }
    [[nodiscard]] const ModelConfig& config() const { return model_.config; }
    [[nodiscard]] const DecodeWeights* compact() const { return compact_; }
    [[nodiscard]] ThreadPool& pool() const { return pool_; }
    // How prompts run their products: Widened or Pieces with compact weights (Auto resolved),
    // Widened meaning the fp32 GEMM for fp32 weights.
    [[nodiscard]] PromptProducts prompt_products() const { return prompt_products_; }
    // The same for the log, naming the kernels: "int8 pieces, oneDNN AMX-INT8", ...
    [[nodiscard]] std::string prompt_products_name() const;
    // Bytes of the prompt scratch.
    [[nodiscard]] std::size_t memory_bytes() const {
        return scratch_.size() * sizeof(float) + pieces_bf16_.size() * sizeof(Bf16) +
               pieces_int8_.size() + products_s32_.size() * sizeof(std::int32_t);
    }

  private:
    friend class KvCacheSession;
    // One worker's scratch for a prompt chunk: attention scores, and what its products with
    // compact weights need.
    struct WorkerScratch {
        float* scores = nullptr;               // (kPromptScoreRows, maxT)
        float* weight_rows = nullptr;          // Widened: (kFp32RowsPerGemm, 4C or H) rows in fp32
        float* stage = nullptr;                // bf16 cache: (2, maxT * hs) a head's cache in fp32
        float* attention_floats = nullptr;     // bf16 attention: its scores and outputs
        Bf16* attention_pieces = nullptr;      // bf16 attention: its pieces
        float* products_f32 = nullptr;         // Pieces, bf16: partial products
        std::int32_t* products_s32 = nullptr;  // Pieces, int8: partial products
    };

    const Model& model_;
    const DecodeWeights* compact_;
    ThreadPool& pool_;
    int chunk_rows_;  // rows of scratch: prompts are encoded in chunks of this many positions
    PromptProducts prompt_products_;
    // A prompt's attention with bf16 products on the bf16 cache (AMX; or pieces asked for), not
    // the fp32 GEMM on a staging copy.
    bool bf16_attention_;
    std::unique_ptr<WorkerBarrier> barrier_;
    RotaryTable rotary_;  // rotary positions' angles for maxT positions (else empty), shared
    AlignedBuffer<float> scratch_;              // the arrays below and the workers' float scratch
    AlignedBuffer<Bf16> pieces_bf16_;           // a prompt input's bf16 pieces
    AlignedBuffer<std::int8_t> pieces_int8_;    // a prompt input's int8 pieces
    AlignedBuffer<std::int32_t> products_s32_;  // the workers' int8 products
    float* x_ = nullptr;                        // (rows, C) residual stream
    float* qkv_ = nullptr;                      // (rows, 3C) queries, keys and values
    float* atty_ = nullptr;                     // (rows, C) attention outputs
    float* fch_ = nullptr;       // (rows, F) MLP hidden, its activation applied in place
    float* ln_ = nullptr;        // (rows, C) the block norm's output
    float* ln_stats_ = nullptr;  // (2 * rows) its means and rstds
    // Pieces, int8: the scales of the pieces (kInt8Pieces * rows); the pieces themselves, of an
    // input at most max(4C, H) long, are in pieces_bf16_ or pieces_int8_.
    float* piece_scales_ = nullptr;
    std::vector<WorkerScratch> worker_scratch_;
};

// One sequence's memory: per-layer K and V caches (maxT x C each, stored per head), its tokens, and
// the vectors of one token's forward, allocated in the constructor; prefill() and step() never
// allocate. Its passes run through a Generator (shared, or one of its own).
//
// Sliding window. GPT-2 has learned absolute positions, so a token's cached K/V depend on its
// position and cannot be reused once the window moves. When step() is called with the cache full
// (maxT positions), the session keeps the last `slide_keep` tokens of its context (the new token
// included), re-encodes them at positions 0.. with a prefill, and continues. The default keep is
// maxT/2: one prefill of maxT/2 rows buys maxT/2 cheap steps, so the amortised cost per token
// stays about one full-context forward divided by maxT/2 while the model always sees at least
// maxT/2 tokens of context. slide_keep = maxT re-encodes the full last maxT tokens on every
// token once the window is full, which reproduces generate_recompute exactly (at its cost).
//
// Threading: one pool.run() per forward. A token's forward (one position, matrix-vector products)
// is four phases per layer separated by a barrier (qkv + attention split by head; attention
// projection, MLP up and MLP down split by output column), then the LM head split by vocabulary
// row. A prompt's forward (a chunk of positions, matrix products) is five: qkv split by column,
// the cache writes and attention by head, then the three by column as for a token. LayerNorms are
// recomputed by every worker into its own scratch rather than paying another synchronisation.
class KvCacheSession {
  public:
    // slide_keep: tokens kept when the window slides, in [1, maxT]; 0 means maxT/2 (at least 1).
    // The generator must outlive the session.
    explicit KvCacheSession(Generator& generator, int slide_keep = 0);
    // A session with a Generator of its own (one sequence: inference, tests); the arguments as
    // Generator's.
    KvCacheSession(const Model& model, ThreadPool& pool, int slide_keep = 0,
                   const DecodeWeights* compact = nullptr,
                   PromptProducts prompt = PromptProducts::Auto);
    ~KvCacheSession();
    KvCacheSession(const KvCacheSession&) = delete;
    KvCacheSession& operator=(const KvCacheSession&) = delete;

    // Clears the cache and encodes the last min(maxT, size) tokens (non-empty) at positions 0..;
    // returns the logits over the vocabulary (V entries, valid until the next call) after the
    // last one. Throws InputError for a token outside [0, V).
    std::span<const float> prefill(std::span<const std::int32_t> tokens);
    // Appends one token (sliding first if the cache is full) and returns the logits after it.
    std::span<const float> step(std::int32_t token);

    // Appends tokens[i] to sessions[i] for every i, as step() would, the weights read once for all
    // of them (model/kv_cache_batch.cpp); the sessions (distinct, of one model, weight format and
    // pool) then hold their logits. Each session's logits are the bits its own step() gives.
    static void step_together(std::span<KvCacheSession* const> sessions,
                              std::span<const std::int32_t> tokens);
    // The logits after the last token (V entries).
    [[nodiscard]] std::span<const float> logits() const {
        return {logits_, static_cast<std::size_t>(config().vocab_size)};
    }

    // Positions currently cached, and the tokens at them.
    [[nodiscard]] int length() const { return static_cast<int>(context_.size()); }
    [[nodiscard]] std::span<const std::int32_t> context() const { return context_; }
    [[nodiscard]] int slide_keep() const { return slide_keep_; }
    // Times the window has slid since construction.
    [[nodiscard]] int slides() const { return slides_; }
    [[nodiscard]] const ModelConfig& config() const { return model_.config; }
    [[nodiscard]] Generator& generator() const { return gen_; }
    [[nodiscard]] PromptProducts prompt_products() const { return gen_.prompt_products(); }
    [[nodiscard]] std::string prompt_products_name() const { return gen_.prompt_products_name(); }
    // Bytes of the K/V caches and the token's vectors, and of the generator if it is its own.
    [[nodiscard]] std::size_t memory_bytes() const {
        return (kv_.size() + scratch_.size()) * sizeof(float) + kv_bf16_.size() * sizeof(Bf16) +
               (own_generator_ != nullptr ? own_generator_->memory_bytes() : 0);
    }

  private:
    // One worker's scratch for a token: its LayerNorm of the row and attention scores.
    struct WorkerScratch {
        float* ln = nullptr;        // (C) a token's (or a prompt's last row's)
        float* ln_stats = nullptr;  // its mean and rstd
        float* scores = nullptr;    // (3, maxT): the scores; the new key; the new value
    };

    // With `own` its generator, else the `shared` one.
    KvCacheSession(std::unique_ptr<Generator> own, Generator* shared, int slide_keep);
    // One token at position length(), appending its K/V; the logits after it land in logits_.
    void forward_token(std::int32_t token);
    // A prompt chunk (at most the generator's chunk rows, at least 2) at positions length()..,
    // appending their K/V; with `logits`, the logits after the last one land in logits_.
    void forward_prompt(std::span<const std::int32_t> tokens, bool logits);
    // Rows of `out` (C apart): each token's embedding plus its position's (pos0..).
    void embed(std::span<const std::int32_t> tokens, int pos0, float* out) const;
    // The worker's share of the logits after one row of the residual stream, into logits_: the
    // final LayerNorm (recomputed by every worker: cheaper than a barrier), then its vocabulary
    // rows of the LM head.
    void head_logits(int worker, const float* row);
    // Runs forward(worker) on every worker, releasing the others from the barrier if one fails
    // (defined in model/kv_cache_passes.hpp, which both forwards include).
    template <typename Forward>
    void run_workers(Forward&& forward);
    // Clears the cache and encodes window_ from position 0 in chunks.
    void encode_window();
    void check_token(std::int32_t token) const;

    std::unique_ptr<Generator> own_generator_;  // null when the generator is shared
    Generator& gen_;
    // The generator's, at hand for the passes.
    const Model& model_;
    const DecodeWeights* compact_;
    ThreadPool& pool_;
    int workers_;
    WorkerBarrier* barrier_;
    int slide_keep_;
    int slides_ = 0;
    std::vector<std::int32_t> context_;  // capacity maxT, reserved once
    std::vector<std::int32_t> window_;   // staging for a slide, capacity maxT
    // [L][keys, values][KVH][maxT * hs]: per layer and key/value head (NH for GPT-2), the keys
    // transposed (hs, maxT) and the values (maxT, hs), so one query reads both as contiguous
    // streams.
    AlignedBuffer<float> kv_;       // fp32 weights: the cache in fp32
    AlignedBuffer<Bf16> kv_bf16_;   // compact weights: the same layout in bf16
    AlignedBuffer<float> scratch_;  // the vectors below and the workers' scratch
    float* x_ = nullptr;            // (C) a token's residual stream
    float* qkv_ = nullptr;          // (W) its query, key and value
    float* atty_ = nullptr;         // (C) its attention output
    float* fch_ = nullptr;          // (F) its MLP hidden, the activation applied in place
    float* logits_ = nullptr;       // (V)
    std::vector<WorkerScratch> worker_scratch_;
};

// What one generate_kv() call did; seconds are wall time.
struct GenerationStats {
    int prompt_tokens = 0;     // tokens prefilled (at most maxT)
    int generated_tokens = 0;  // tokens appended
    double prefill_seconds = 0.0;
    double generate_seconds = 0.0;  // sampling and steps after the prefill
    int slides = 0;
};

// What a caller's on_token says after seeing a token: go on, or end the generation with it (an
// end-of-text, a stop string met, a stop asked for).
enum class TokenVerdict { Continue, Stop };
using TokenCallback = std::function<TokenVerdict(std::int32_t)>;

// Appends at most `count` tokens to `tokens` (the prompt, non-empty) using the session: prefill,
// then one step per token. Same contract as generate_recompute; on_token, when set, sees each new
// token (already appended) and may end the generation there. vocab_limit > 0 restricts sampling
// to ids below it (a tokenizer smaller than the model's vocabulary cannot print the others); 0
// means the model's V. params.repetition_penalty weighs every token of `tokens` so far.
GenerationStats generate_kv(KvCacheSession& session, std::vector<std::int32_t>& tokens, int count,
                            const SamplingParams& params, Rng& rng,
                            const TokenCallback& on_token = {}, int vocab_limit = 0);

}  // namespace gpt2
