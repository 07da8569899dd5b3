// ThreadLocalTrainingContext: everything one worker writes during forward and backward (its
// activations, backward scratch and its own gradient buffer), allocated once, so workers never
// share writable memory and need no lock.
#pragma once

#include <cstddef>
#include <span>

#include "core/aligned_buffer.hpp"
#include "model/model.hpp"

namespace gpt2 {

class ThreadLocalTrainingContext {
  public:
    // Sized for up to `max_batch` sequences of up to `seq_len` tokens; in bf16 precision it also
    // holds the bf16 operands of the products.
    ThreadLocalTrainingContext(const ModelConfig& config, int max_batch, int seq_len,
                               Precision precision = Precision::fp32);

    ThreadLocalTrainingContext(const ThreadLocalTrainingContext&) = delete;
    ThreadLocalTrainingContext& operator=(const ThreadLocalTrainingContext&) = delete;
    ThreadLocalTrainingContext(ThreadLocalTrainingContext&&) = default;

    [[nodiscard]] int max_batch() const { return max_batch_; }
    [[nodiscard]] int seq_len() const { return seq_len_; }
    // Bytes of activations and scratch (without the gradient buffer) and in total.
    [[nodiscard]] std::size_t activation_bytes() const {
        return arena_.size() * sizeof(float) +
               (bf16_inputs.size() + bf16_gradients.size()) * sizeof(Bf16);
    }
    [[nodiscard]] std::size_t total_bytes() const {
        return activation_bytes() + grads.size() * sizeof(float);
    }

    // Per-layer activations are [L][max_batch*T][...]; only the first B*T rows are used when
    // a call has fewer sequences.
    struct Activations {
        float* encoded;    // (N, C)
        float* ln1;        // [L] (N, C)
        float* ln1_mean;   // [L] (N)
        float* ln1_rstd;   // [L] (N)
        float* qkv;        // [L] (N, 3C)
        float* atty;       // [L] (N, C)
        float* att;        // [L] (B, NH, T, T)
        float* residual2;  // [L] (N, C)
        float* ln2;        // [L] (N, C)
        float* ln2_mean;   // [L] (N)
        float* ln2_rstd;   // [L] (N)
        float* fch;        // [L] (N, 4C)
        float* fch_gelu;   // [L] (N, 4C)
        float* residual3;  // [L] (N, C)
        float* lnf;        // (N, C)
        float* lnf_mean;   // (N)
        float* lnf_rstd;   // (N)
        float* losses;     // (N)
    } acts{};
    struct Scratch {
        float* dresidual;  // (N, C): gradient of the residual stream
        float* dchannels;  // (N, C): dlnf, dln2, datty, dln1 in turn
        float* dqkv;       // (N, 3C)
        float* dfch;       // (N, 4C)
        float* attention;  // attention_backward's scratch
        float* logits;     // (logits_rows, Vp): one chunk of the LM head
    } scratch{};
    int logits_rows = 0;

    // bf16 precision only: an activation (up to N*4C) and an output gradient (up to N*4C, or a
    // chunk of dlogits) rounded to bf16 as they enter a product.
    AlignedBuffer<Bf16> bf16_inputs;
    AlignedBuffer<Bf16> bf16_gradients;

    // This worker's gradient, in the flat parameter layout.
    AlignedBuffer<float> grads;

  private:
    int max_batch_ = 0;
    int seq_len_ = 0;
    AlignedBuffer<float> arena_;
};

// One worker's share of a micro-batch: B sequences of T tokens, row-major.
struct TokenBatch {
    std::span<const std::int32_t> inputs;
    std::span<const std::int32_t> targets;
    int B = 0;
    int T = 0;
};

// Forward and backward over the batch: returns the SUM of the per-token losses and accumulates
// into ctx.grads the gradient of (dloss * that sum). Passing dloss = 1/(tokens in the whole
// optimizer step) makes the sum over all workers, micro-batches and ranks the gradient of the
// mean loss, with no rescaling pass afterwards.
[[nodiscard]] double forward_backward(const Model& model, ThreadLocalTrainingContext& ctx,
                                      const TokenBatch& batch, float dloss);

// Forward only: the sum of the per-token losses (for validation). Gradients are untouched.
[[nodiscard]] double forward_loss(const Model& model, ThreadLocalTrainingContext& ctx,
                                  const TokenBatch& batch);

// Forward up to the final LayerNorm (ctx.acts filled for the batch); exposed for tests.
void forward_hidden(const Model& model, ThreadLocalTrainingContext& ctx, const TokenBatch& batch);

}  // namespace gpt2
