// ThreadLocalTrainingContext: everything one worker writes during forward and backward (its
// activations, backward scratch and its gradient window), allocated once, so workers never share
// writable memory and need no lock, and only what backward cannot cheaply recompute; and
// forward_backward, which writes the gradient section by section through a GradientSink.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "model/model.hpp"

namespace gpt2 {

// One named part of a worker's context and its size (the start-up log's table, the memory check).
struct ContextPart {
    std::string_view name;
    std::size_t bytes = 0;
};

// The parts of a context for up to `max_batch` sequences of up to `seq_len` tokens, exactly as
// ThreadLocalTrainingContext allocates them (without the gradient window), so that the memory a
// run needs is known before anything is allocated.
[[nodiscard]] std::vector<ContextPart> context_parts(const ModelConfig& config, int max_batch,
                                                     int seq_len, Precision precision,
                                                     Recompute recompute);
[[nodiscard]] std::size_t context_bytes(const ModelConfig& config, int max_batch, int seq_len,
                                        Precision precision, Recompute recompute);

class ThreadLocalTrainingContext {
  public:
    // Sized for up to `max_batch` sequences of up to `seq_len` tokens; in bf16 precision it also
    // holds the bf16 operands of the products.
    ThreadLocalTrainingContext(const ModelConfig& config, int max_batch, int seq_len,
                               Precision precision = Precision::Fp32,
                               Recompute recompute = Recompute::Cheap);

    ThreadLocalTrainingContext(const ThreadLocalTrainingContext&) = delete;
    ThreadLocalTrainingContext& operator=(const ThreadLocalTrainingContext&) = delete;
    ThreadLocalTrainingContext(ThreadLocalTrainingContext&&) = default;

    [[nodiscard]] int max_batch() const { return max_batch_; }
    [[nodiscard]] int seq_len() const { return seq_len_; }
    [[nodiscard]] Recompute recompute() const { return recompute_; }
    // Layers whose activations are stored: L at the cheap level, one at the layers level.
    [[nodiscard]] int stored_layers() const { return stored_layers_; }
    // Bytes of activations and scratch (without the gradient buffer) and in total.
    [[nodiscard]] std::size_t activation_bytes() const {
        return arena_.size() * sizeof(float) +
               (bf16_inputs.size() + bf16_gradients.size()) * sizeof(Bf16);
    }
    [[nodiscard]] std::size_t total_bytes() const {
        return activation_bytes() + gradient_window.size() * sizeof(float);
    }

    // Per-layer activations are [S][max_batch*T][...] with S = stored_layers(); only the first
    // B*T rows are used when a call has fewer sequences. Layer inputs are always kept for all L.
    struct Activations {
        float* encoded;    // (N, C)
        float* ln1_mean;   // [S] (N)
        float* ln1_rstd;   // [S] (N)
        float* qkv;        // [S] (N, 3C)
        float* atty;       // [S] (N, C)
        float* att_lse;    // [S] (B, NH, T): attention's log-sum-exp per query row
        float* residual2;  // [S] (N, C)
        float* ln2_mean;   // [S] (N)
        float* ln2_rstd;   // [S] (N)
        float* fch;        // [S] (N, 4C)
        float* residual3;  // [L] (N, C): each layer's output, the next layer's input
        float* lnf;        // (N, C)
        float* lnf_mean;   // (N)
        float* lnf_rstd;   // (N)
        float* losses;     // (N)
    } acts{};
    struct Scratch {
        float* normalized;  // (N, C): ln1 or ln2, written by forward, recomputed by backward
        float* gelu;        // (N, 4C): GELU's output, likewise
        float* dresidual;   // (N, C): gradient of the residual stream
        float* dchannels;   // (N, C): dlnf, dln2, datty, dln1 in turn
        float* dqkv;        // (N, 3C)
        float* dfch;        // (N, 4C)
        float* attention;   // attention's panels (ops/attention.hpp)
        float* logits;      // (logits_rows, Vp): one chunk of the LM head
    } scratch{};
    int logits_rows = 0;

    // bf16 precision only: an activation (up to N*4C) and an output gradient (up to N*4C, or a
    // chunk of dlogits) rounded to bf16 as they enter a product.
    AlignedBuffer<Bf16> bf16_inputs;
    AlignedBuffer<Bf16> bf16_gradients;

    // Where this worker writes the gradient sections its sink hands out (see
    // gradient_window_floats); empty when the worker writes straight into a full gradient.
    AlignedBuffer<float> gradient_window;

  private:
    int max_batch_ = 0;
    int seq_len_ = 0;
    Recompute recompute_ = Recompute::Cheap;
    int stored_layers_ = 0;
    AlignedBuffer<float> arena_;
};

// Dropout in a training step (rate 0: none), where GPT-2 applies it: the embeddings' sum, the
// attention probabilities, the attention and MLP projections' outputs. Masks are keyed by the
// run's seed, the step and each sequence's index in the step (ops/dropout.hpp), so every split of
// a step over workers, ranks and micro-steps draws the same masks.
struct Dropout {
    float rate = 0.0f;
    std::uint64_t seed = 0;
    std::uint64_t step = 0;
};

// One worker's part of a micro-batch: B sequences of T tokens, row-major; `first_sequence` is the
// index of its first sequence in the step (the sequences are consecutive), which keys dropout.
struct TokenBatch {
    std::span<const std::int32_t> inputs;
    std::span<const std::int32_t> targets;
    int B = 0;
    int T = 0;
    Dropout dropout{};
    std::uint64_t first_sequence = 0;
};

// Where forward_backward writes the gradient. Backward produces it in three kinds of section, in
// this order, and reports each one as soon as it is written:
//   head        dwte from the LM head (dense, Vp x C), dlnfw, dlnfb            then head_done()
//   layer l     the layer's twelve tensors, for l = L-1 down to 0              then layer_done(l)
//   embeddings  dresidual at the input: the token rows of dwte and dwpe        embeddings(...)
// Every kernel accumulates (+=) into what the sink hands out. A sink may hand each worker a small
// window that it reduces across workers at every report (parallel/layerwise_reduction.hpp), or
// one full gradient (FullGradient).
class GradientSink {
  public:
    struct Head {
        float* dwte;   // (Vp, C)
        float* dlnfw;  // (C)
        float* dlnfb;  // (C)
    };
    virtual ~GradientSink() = default;
    [[nodiscard]] virtual Head head() = 0;
    virtual void head_done() = 0;
    [[nodiscard]] virtual LayerView<float> layer(int l) = 0;
    virtual void layer_done(int l) = 0;
    // dresidual (B*T, C): the gradient of the embeddings' sum for `batch`.
    virtual void embeddings(const float* dresidual, const TokenBatch& batch) = 0;
};

// The whole gradient in one flat buffer laid out as the model's parameters.
class FullGradient final : public GradientSink {
  public:
    FullGradient(const Model& model, std::span<float> grads);
    [[nodiscard]] Head head() override;
    void head_done() override {}
    [[nodiscard]] LayerView<float> layer(int l) override;
    void layer_done(int /*l*/) override {}
    void embeddings(const float* dresidual, const TokenBatch& batch) override;

  private:
    const Model& model_;
    std::span<float> grads_;
};

// Floats of one layer's twelve gradient tensors, and a view of them laid out in LayerView order
// from `slot` on (how a gradient window holds one layer).
[[nodiscard]] std::size_t layer_gradient_floats(const ModelConfig& config);
[[nodiscard]] LayerView<float> layer_slot_view(const ModelConfig& config, float* slot);
// A gradient window: the head section (Vp*C + 2C) or two layer slots, whichever is larger.
[[nodiscard]] std::size_t gradient_window_floats(const ModelConfig& config);

// Forward and backward over the batch: returns the SUM of the per-token losses and accumulates
// through `sink` the gradient of (dloss * that sum). Passing dloss = 1/(tokens in the whole
// optimizer step) makes the sum over all workers, micro-batches and ranks the gradient of the
// mean loss, with no rescaling pass afterwards.
[[nodiscard]] double forward_backward(const Model& model, ThreadLocalTrainingContext& ctx,
                                      const TokenBatch& batch, float dloss, GradientSink& sink);
// The same into one full gradient buffer (model.layout.total() floats).
[[nodiscard]] double forward_backward(const Model& model, ThreadLocalTrainingContext& ctx,
                                      const TokenBatch& batch, float dloss, std::span<float> grads);

// Forward only: the sum of the per-token losses (for validation), without dropout whatever the
// batch asks. Gradients are untouched.
[[nodiscard]] double forward_loss(const Model& model, ThreadLocalTrainingContext& ctx,
                                  const TokenBatch& batch);

// Forward up to the final LayerNorm (ctx.acts filled for the batch, dropped as it asks); exposed
// for tests.
void forward_hidden(const Model& model, ThreadLocalTrainingContext& ctx, const TokenBatch& batch);

}  // namespace gpt2
