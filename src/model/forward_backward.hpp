// GPT-2's forward and backward over a worker's ThreadLocalTrainingContext: each layer's forward
// and backward written out over the kernels of ops/, the LM head in chunks, and the gradient
// handed out section by section through a GradientSink.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "model/model.hpp"
#include "model/training_context.hpp"

namespace gpt2 {

// Dropout in a training step (rate 0: none), where GPT-2 applies it: the embeddings' sum, the
// attention probabilities, the attention and MLP projections' outputs. Masks are keyed by the
// run's seed, the step and each sequence's index in the step (ops/dropout.hpp), so every split of
// a step over workers, ranks and micro-steps draws the same masks.
// `lora_rate` is LoRA's dropout on the adapters' inputs (the adapter's config.dropout in training
// steps), keyed by the same seed and step at sites of its own.
struct Dropout {
    float rate = 0.0f;
    std::uint64_t seed = 0;
    std::uint64_t step = 0;
    float lora_rate = 0.0f;
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
    // Document masking in attention (train_gpt2 --attention-within-documents): the token that
    // begins each document (the end-of-text token); a query attends only to the keys of its own
    // document (ops/attention.hpp's document_first_keys). None: every earlier key of the sequence.
    std::optional<std::int32_t> document_start{};
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
        float* dhead;  // (Vp, C): the LM head's weight, wte where the head is tied
        float* dlnfw;  // (C), null where the final norm has no gain
        float* dlnfb;  // (C), null where it has no bias
    };
    virtual ~GradientSink() = default;
    [[nodiscard]] virtual Head head() = 0;
    virtual void head_done() = 0;
    [[nodiscard]] virtual LayerView<float> layer(int l) = 0;
    virtual void layer_done(int l) = 0;
    // dresidual (B*T, C): the gradient of the embeddings' sum for `batch`.
    virtual void embeddings(const float* dresidual, const TokenBatch& batch) = 0;
    // LoRA: the adapter's gradient (laid out as model.lora->layout), accumulated layer by layer;
    // empty when the base model trains.
    [[nodiscard]] virtual std::span<float> adapter() { return {}; }
};

// LoRA fine-tuning: the base model frozen (null sections: backward computes only the gradients
// flowing through it, no weight gradient), the adapter's gradient accumulated into one buffer.
class AdapterGradient final : public GradientSink {
  public:
    AdapterGradient(const Model& model, std::span<float> grads);
    [[nodiscard]] Head head() override { return Head{nullptr, nullptr, nullptr}; }
    void head_done() override {}
    [[nodiscard]] LayerView<float> layer(int /*l*/) override { return LayerView<float>{}; }
    void layer_done(int /*l*/) override {}
    void embeddings(const float* /*dresidual*/, const TokenBatch& /*batch*/) override {}
    [[nodiscard]] std::span<float> adapter() override { return grads_; }

  private:
    std::span<float> grads_;
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

// Forward and backward over the batch: returns the SUM of the per-token losses and accumulates
// through `sink` the gradient of (dloss * that sum). Passing dloss = 1/(tokens in the whole
// optimizer step) makes the sum over all workers, micro-batches and ranks the gradient of the
// mean loss, with no rescaling pass afterwards.
[[nodiscard]] double forward_backward(const Model& model, ThreadLocalTrainingContext& ctx,
                                      const TokenBatch& batch, float dloss, GradientSink& sink);
// The same into one full gradient buffer (model.layout.total() floats).
[[nodiscard]] double forward_backward(const Model& model, ThreadLocalTrainingContext& ctx,
                                      const TokenBatch& batch, float dloss, std::span<float> grads);

// LoRA: forward and backward with the base frozen, the adapter's gradient accumulated into
// `grads` (model.lora->layout.total() floats).
[[nodiscard]] double forward_backward_adapter(const Model& model, ThreadLocalTrainingContext& ctx,
                                              const TokenBatch& batch, float dloss,
                                              std::span<float> grads);

// Forward only: the sum of the per-token losses (for validation), without dropout whatever the
// batch asks. Gradients are untouched.
[[nodiscard]] double forward_loss(const Model& model, ThreadLocalTrainingContext& ctx,
                                  const TokenBatch& batch);

// Forward up to the final LayerNorm (ctx.acts filled for the batch, dropped as it asks); exposed
// for tests.
void forward_hidden(const Model& model, ThreadLocalTrainingContext& ctx, const TokenBatch& batch);

}  // namespace gpt2
