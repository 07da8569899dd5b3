// LoRA (low-rank adaptation, as Hugging Face PEFT defines it) on GPT-2's four projections or the
// Llama family's seven: the adapter's shape and flat buffer with named views, its initialisation,
// merging it into the base weights, and the forward and backward of one adapted product.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "model/model.hpp"
#include "ops/dropout.hpp"

namespace gpt2 {

// The projections LoRA can adapt, as PEFT names their modules: GPT-2's four (transformer.h.<l>.
// <name>) and the Llama family's seven (model.layers.<l>.<name>). Our block fuses some of them:
// GPT-2's c_attn is all of qkvw, Llama's q_proj, k_proj and v_proj are row blocks of it, gate_proj
// and up_proj of fcw; an adapter on a row block adds its update to those rows only.
enum class LoraTarget : int {
    CAttn,
    AttnCProj,
    CFc,
    MlpCProj,  // GPT-2's
    QProj,
    KProj,
    VProj,
    OProj,
    GateProj,
    UpProj,
    DownProj  // the Llama family's
};
inline constexpr int kLoraTargets = 11;
inline constexpr int kGpt2LoraTargets = 4;  // GPT-2's are the first four

// The projections a model offers: GPT-2's for GPT-2's block, the Llama family's for any other
// (gate_proj only where the MLP is gated: SwiGLU).
struct LoraModules {
    bool llama = false;
    bool gated = false;
    friend bool operator==(const LoraModules&, const LoraModules&) = default;
};
[[nodiscard]] LoraModules lora_modules(const ModelConfig& config);
[[nodiscard]] bool offers(const LoraModules& modules, LoraTarget t);

// "attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"; "self_attn.q_proj" ... "mlp.down_proj".
[[nodiscard]] std::string_view lora_target_module(LoraTarget t);
// The module's last name: "c_attn", "c_proj", ..., "q_proj", "down_proj".
[[nodiscard]] std::string_view lora_target_short_name(LoraTarget t);
// The base weight a target adapts (qkvw, attprojw, fcw or fcprojw).
[[nodiscard]] ParamTensor lora_target_weight(LoraTarget t);
// Parses a comma-separated list of PEFT's names for the projections `modules` offers: GPT-2's
// c_attn, attn.c_proj, c_fc, mlp.c_proj, c_proj (both projections, as PEFT matches a name by
// suffix); the Llama family's q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (with
// or without self_attn./mlp.); all. Throws InputError naming `flag` and the unknown name.
[[nodiscard]] std::array<bool, kLoraTargets> parse_lora_targets(std::string_view list,
                                                                std::string_view flag,
                                                                const LoraModules& modules);
// Throws InputError naming `flag` and the name when a name is of neither family (checks flags
// before the model is known).
void check_lora_target_names(std::string_view list, std::string_view flag);
// Every projection the model offers (--lora-targets all).
[[nodiscard]] std::array<bool, kLoraTargets> all_lora_targets(const ModelConfig& config);
// The targets as PEFT's target_modules (the shortest names that match exactly these modules).
[[nodiscard]] std::vector<std::string> lora_target_modules(
    const std::array<bool, kLoraTargets>& targets);

struct LoraConfig {
    int rank = 0;  // r: 0 means no adapter
    float alpha = 0.0f;
    std::array<bool, kLoraTargets> targets{};
    // PEFT's lora_dropout: the rate, in [0, 1), of the dropout on each adapter's input in training
    // steps (the base product reads the input undropped; evaluation drops nothing).
    float dropout = 0.0f;

    // PEFT's scaling: the update is (alpha / r) * B A.
    [[nodiscard]] float scale() const { return alpha / static_cast<float>(rank); }
    [[nodiscard]] bool adapts(LoraTarget t) const { return targets[static_cast<std::size_t>(t)]; }
    friend bool operator==(const LoraConfig&, const LoraConfig&) = default;
};

// A target's product in the base model: out (N, OC) = inp (N, C) @ W (OC, C)^T, where W is rows
// [first_row, first_row + OC) of its base weight.
struct ProductShape {
    int in = 0;         // C
    int out = 0;        // OC
    int first_row = 0;  // where a row block (q/k/v_proj in qkvw, gate/up_proj in fcw) starts
};
[[nodiscard]] ProductShape lora_product_shape(const ModelConfig& config, LoraTarget t);

// Where each adapter matrix lives in the adapter's flat buffer: layer by layer, and within a layer
// target by target, A (r, in) then B (out, r), PEFT's lora_A.weight and lora_B.weight.
class LoraLayout {
  public:
    LoraLayout(const ModelConfig& model, const LoraConfig& lora);

    [[nodiscard]] std::size_t total() const { return total_; }
    [[nodiscard]] const ModelConfig& model() const { return model_; }
    [[nodiscard]] int num_layers() const { return model_.num_layers; }
    // Offsets of layer l's A and B for target t (the target must be adapted).
    [[nodiscard]] std::size_t a_offset(int l, LoraTarget t) const { return offset(l, t); }
    [[nodiscard]] std::size_t b_offset(int l, LoraTarget t) const {
        return offset(l, t) + a_floats(t);
    }
    [[nodiscard]] std::size_t a_floats(LoraTarget t) const;
    [[nodiscard]] std::size_t b_floats(LoraTarget t) const;

  private:
    [[nodiscard]] std::size_t offset(int l, LoraTarget t) const;
    ModelConfig model_;
    LoraConfig lora_;
    std::array<std::size_t, kLoraTargets> within_layer_{};  // offset of each target in a layer
    std::size_t per_layer_ = 0;
    std::size_t total_ = 0;
};

// Layer l's adapter matrices inside a flat buffer laid out as `layout` (null where a target is not
// adapted): F = const float for the adapter, float for its gradient.
template <typename F>
struct LoraLayerView {
    std::array<F*, kLoraTargets> a{};
    std::array<F*, kLoraTargets> b{};
};
template <typename F>
[[nodiscard]] LoraLayerView<F> lora_layer_view(const LoraLayout& layout, const LoraConfig& config,
                                               std::span<F> flat, int l) {
    LoraLayerView<F> view;
    for (int i = 0; i < kLoraTargets; ++i) {
        const auto t = static_cast<LoraTarget>(i);
        if (!config.adapts(t)) continue;
        view.a[static_cast<std::size_t>(i)] = flat.data() + layout.a_offset(l, t);
        view.b[static_cast<std::size_t>(i)] = flat.data() + layout.b_offset(l, t);
    }
    return view;
}

// A model's adapter: its configuration, layout and weights (fp32).
struct LoraAdapter {
    LoraConfig config;
    LoraLayout layout;
    AlignedBuffer<float> params;

    LoraAdapter(const ModelConfig& model, const LoraConfig& c)
        : config(c), layout(model, c), params(layout.total()) {}
    [[nodiscard]] LoraLayerView<const float> layer(int l) const {
        return lora_layer_view(layout, config, params.span(), l);
    }
};

// FLOPs of one LoRA training step per token (for MFU): the base's products forward and their
// input gradients only (4 per multiply-accumulate'd parameter, not full training's 6: no weight
// gradient), attention as in full training, and the adapter's own products: forward x A^T and
// u B^T, backward u again, dout B, v A, v^T x and dout^T u.
[[nodiscard]] double lora_training_flops_per_token(const ModelConfig& config, int seq_len,
                                                   const LoraConfig& lora);

// Throws InputError naming `source` when the rank, alpha or dropout is impossible or no target is
// chosen.
void validate_lora(const LoraConfig& config, std::string_view source);

// PEFT's initialisation: A uniform in [-1/sqrt(in), 1/sqrt(in)] (kaiming_uniform_ with a=sqrt(5),
// what nn.Linear does), B zero, so the adapted model starts as the base. Deterministic in `seed`.
void init_lora(LoraAdapter& adapter, std::uint64_t seed);

// The base weights with the adapter folded in: W += (alpha/r) * B @ A for every adapted product.
void merge_lora(Model& model, const LoraAdapter& adapter);

// merge_lora's weights without a merged copy of the model: `emit` receives them in the parameter
// buffer's order a piece at a time, the base as it is between adapted matrices and each adapted
// matrix of a layer copied into one buffer of merge_buffer_floats with the update added as
// merge_lora adds it (bitwise the same weights). A piece is valid only during the call. A base
// whose layer matrices are bf16 only (Model::layer_matrices_bf16_only) gives each of them, adapted
// or not, converted from its bf16 twin: bf16(W) + (alpha/r) B A.
void merged_lora_pieces(const Model& base, const LoraAdapter& adapter,
                        const std::function<void(std::span<const float>)>& emit);
// That buffer's size: the largest adapted matrix of one layer, or with layer matrices in bf16 only
// the largest layer matrix (0 without an adapter).
[[nodiscard]] std::size_t merge_buffer_floats(const ModelConfig& config,
                                              const std::optional<LoraConfig>& lora,
                                              bool layer_matrices_bf16_only = false);

// out (N, OC) += scale * (inp (N, C) @ A (r, C)^T) @ B (OC, r)^T; `u` (N, r) receives inp @ A^T.
// `ldo`: the distance between out's rows (OC, or the fused product's width for a row block).
void lora_forward(float* out, float* u, const float* inp, const float* A, const float* B,
                  float scale, int N, int C, int OC, int r, int ldo);
// The adapter's part of the product's backward, for dout (N, OC) (rows ldo apart):
//   v = scale * dout @ B (N, r);  dinp += v @ A;  dA += v^T @ inp;  dB += scale * dout^T @ u
// where u = inp @ A^T is recomputed here (N*r scratch each for u and v). dinp may be null.
void lora_backward(float* dinp, float* dA, float* dB, float* u, float* v, const float* dout,
                   const float* inp, const float* A, const float* B, float scale, int N, int C,
                   int OC, int r, int ldo);

// PEFT's lora_dropout on one adapted product's input: the adapter reads dropout(inp), the base
// product inp itself. The mask spans the batch's `sequences` sequences of N / sequences rows each
// (ops/dropout.hpp); `dropped` (N, C) is scratch that receives the masked input, made again from
// the mask in backward rather than kept from forward. An inactive mask is the plain path, bitwise.
// Channels of scratch per token LoRA's input dropout at `rate` needs: the widest input an adapted
// product reads (the MLP's hidden width, GPT-2's 4C), or 0 without dropout.
[[nodiscard]] inline int lora_dropout_channels(const ModelConfig& config, float rate) {
    return rate > 0.0f ? std::max(config.channels, config.mlp_hidden()) : 0;
}
struct LoraInputDropout {
    DropoutMask mask;
    int sequences = 0;
    float* dropped = nullptr;
};
// lora_forward on dropout(inp): out += scale * (dropout(inp) @ A^T) @ B^T.
void lora_forward(float* out, float* u, const float* inp, const float* A, const float* B,
                  float scale, int N, int C, int OC, int r, int ldo,
                  const LoraInputDropout& dropout);
// lora_backward on dropout(inp): dA += v^T @ dropout(inp), dB as without dropout, and
// dinp += dropout's backward of v @ A (the same mask and 1 / (1 - p) applied to it).
void lora_backward(float* dinp, float* dA, float* dB, float* u, float* v, const float* dout,
                   const float* inp, const float* A, const float* B, float scale, int N, int C,
                   int OC, int r, int ldo, const LoraInputDropout& dropout);

}  // namespace gpt2
