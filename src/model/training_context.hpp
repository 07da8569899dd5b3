// ThreadLocalTrainingContext: everything one worker writes during forward and backward (its
// activations, backward scratch and its gradient window), allocated once, so workers never share
// writable memory and need no lock, and only what backward cannot cheaply recompute.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "model/model.hpp"
#include "ops/block_kernels.hpp"

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

// Floats of one layer's twelve gradient tensors, and a view of them laid out in LayerView order
// from `slot` on (how a gradient window holds one layer).
[[nodiscard]] std::size_t layer_gradient_floats(const ModelConfig& config);
// Whether a context of `precision` runs attention in bf16 (q, k and v rounded by heads, after
// QK-norm and rotary where the block has them): bf16 precision where bf16 attention pays.
[[nodiscard]] bool attention_in_bf16(Precision precision);
[[nodiscard]] LayerView<float> layer_slot_view(const ModelConfig& config, float* slot);
// A gradient window: the head section (Vp*C + 2C) or two layer slots, whichever is larger.
[[nodiscard]] std::size_t gradient_window_floats(const ModelConfig& config);

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
        return arena_.size() * sizeof(float) + (bf16_qkv.size() + bf16_inputs.size() +
                                                bf16_gradients.size() + bf16_attention.size()) *
                                                   sizeof(Bf16);
    }
    [[nodiscard]] std::size_t total_bytes() const {
        return activation_bytes() +
               (gradient_window.size() + adapter_scratch.size()) * sizeof(float);
    }

    // Per-layer activations are [S][max_batch*T][...] with S = stored_layers(); only the first
    // B*T rows are used when a call has fewer sequences. Layer inputs are always kept for all L.
    struct Activations {
        float* encoded;       // (N, C): the embeddings (normed, where the architecture norms them)
        float* encoded_rstd;  // (N): their RMSNorm's, where normed (else null)
        float* ln1_mean;      // [S] (N): LayerNorm's (RMSNorm keeps only rstd)
        float* ln1_rstd;      // [S] (N)
        float* qkv;        // [S] (N, W): q, k, v (W = C + 2 KV; GPT-2: 3C), rotated where rotary;
                           // null where attention runs in bf16, which reads:
        Bf16* qkv_bf16;    // [S] (N, 3C) in bf16 where attention runs in bf16 (else null)
        float* qk_rstd;    // [S] (N, NH + KV): QK-norm's per head of q, then of k (else null)
        float* atty;       // [S] (N, C)
        float* att_lse;    // [S] (B, NH, T): attention's log-sum-exp per query row
        float* residual2;  // [S] (N, C)
        float* ln2_mean;   // [S] (N)
        float* ln2_rstd;   // [S] (N)
        float* fch;        // [S] (N, F): the MLP's first product (F = H, or 2H for SwiGLU)
        float* residual3;  // [L] (N, C): each layer's output, the next layer's input
        float* lnf;        // (N, C)
        float* lnf_mean;   // (N)
        float* lnf_rstd;   // (N)
        float* losses;     // (N)
    } acts{};
    struct Scratch {
        float* normalized;  // (N, C): ln1 or ln2, written by forward, recomputed by backward
        float* gelu;        // (N, H): the MLP's activation (GELU, SwiGLU, ReLU^2), likewise
        float* dresidual;   // (N, C): gradient of the residual stream
        float* dchannels;   // (N, C): dlnf, dln2, datty, dln1 in turn
        float* dqkv;        // (N, W)
        float* dfch;        // (N, F)
        float* dact;        // (N, H): SwiGLU's activation gradient (null for the others, whose
                            // backward runs in place in dfch)
        float* attention;   // attention's panels (ops/attention.hpp; bf16 sizes in bf16)
        float* logits;      // (logits_rows, Vp): one chunk of the LM head (bf16: blocked, with
                            // its row statistics after; ops/lm_head.hpp)
    } scratch{};
    int logits_rows = 0;

    // bf16 precision only: an activation (up to N*4C) and an output gradient (up to N*4C, or a
    // block of dlogits) rounded to bf16 as they enter a product.
    AlignedBuffer<Bf16> bf16_inputs;
    AlignedBuffer<Bf16> bf16_gradients;
    // bf16 precision only: one head's dO and a panel rounded for bf16 attention.
    AlignedBuffer<Bf16> bf16_attention;
    // Where attention runs in bf16 (bf16_attention_pays): the stored qkv, in bf16 (acts.qkv_bf16).
    AlignedBuffer<Bf16> bf16_qkv;

    // Rotary positions' angles for seq_len positions (empty with learned positions).
    RotaryTable rotary;

    // Where this worker writes the gradient sections its sink hands out (see
    // gradient_window_floats); empty when the worker writes straight into a full gradient.
    AlignedBuffer<float> gradient_window;

    // Document masking in attention: the first key each of the batch's query rows sees (B*T),
    // written by each forward whose batch asks for it (4 bytes a token: outside the memory plan);
    // empty otherwise.
    std::vector<std::int32_t> attention_first_keys;

    // LoRA: x @ A^T and scale * dout @ B for one product, (N, r) each, then with LoRA's input
    // dropout the product's dropped input (N, dropped_channels: 4C, the widest); empty without an
    // adapter.
    AlignedBuffer<float> adapter_scratch;
    // Sizes adapter_scratch for adapters of rank r (once, before the first step).
    void reserve_adapter(int r, int dropped_channels = 0) {
        adapter_scratch =
            AlignedBuffer<float>(adapter_scratch_floats(max_batch_, seq_len_, r, dropped_channels));
    }
    [[nodiscard]] static std::size_t adapter_scratch_floats(int max_batch, int seq_len, int r,
                                                            int dropped_channels = 0) {
        return static_cast<std::size_t>(max_batch) * static_cast<std::size_t>(seq_len) *
               (2 * static_cast<std::size_t>(r) + static_cast<std::size_t>(dropped_channels));
    }

  private:
    int max_batch_ = 0;
    int seq_len_ = 0;
    Recompute recompute_ = Recompute::Cheap;
    int stored_layers_ = 0;
    AlignedBuffer<float> arena_;
};

}  // namespace gpt2
