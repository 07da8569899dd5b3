#include "model/forward_backward.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>

#include "model/block_parts.hpp"
#include "model/lora.hpp"
#include "ops/attention.hpp"
#include "ops/dropout.hpp"
#include "ops/kernels.hpp"
#include "ops/lm_head.hpp"

namespace gpt2 {

namespace {
// Pointers to layer l's slice of every per-layer activation (at the layers level every layer
// shares one slice, except the layer outputs).
struct LayerActs {
    float *ln1_mean, *ln1_rstd, *qkv, *qk_rstd, *atty, *att_lse, *residual2, *ln2_mean, *ln2_rstd,
        *fch, *residual3;
    Bf16* qkv_bf16;  // where attention runs in bf16 (qkv then only with QK-norm, for its backward)
};

LayerActs layer_acts(const ThreadLocalTrainingContext& ctx, const ModelConfig& c, int l) {
    const long N = static_cast<long>(ctx.max_batch()) * ctx.seq_len();
    const long C = c.channels, W = c.qkv_width(), F = c.fc_width();
    const long s = std::min(l, ctx.stored_layers() - 1);  // the stored slot
    const auto& a = ctx.acts;
    return LayerActs{
        a.ln1_mean + s * N,
        a.ln1_rstd + s * N,
        a.qkv != nullptr ? a.qkv + s * N * W : nullptr,
        a.qk_rstd != nullptr ? a.qk_rstd + s * N * (c.num_heads + c.kv_heads()) : nullptr,
        a.atty + s * N * C,
        a.att_lse + s * N * c.num_heads,
        a.residual2 + s * N * C,
        a.ln2_mean + s * N,
        a.ln2_rstd + s * N,
        a.fch + s * N * F,
        a.residual3 + l * N * C,
        a.qkv_bf16 != nullptr ? a.qkv_bf16 + s * N * W : nullptr};
}

// The model's matrix products in its precision: fp32 through OpenBLAS, or bf16 operands (the
// weights' bf16 copy, activations and gradients rounded into the context's scratch) with fp32
// accumulation. Both paths take the same arguments, so forward/backward read the same either way.
// Attention's products follow in bf16 where bf16 attention is the faster (bf16_attention_pays).
class PrecisionMatmul {
  public:
    PrecisionMatmul(const Model& model, ThreadLocalTrainingContext& ctx)
        : model_(model),
          ctx_(ctx),
          bf16_(model.precision == Precision::Bf16),
          bf16_attention_(attention_in_bf16(model.precision)) {
        if (bf16_ && (ctx.bf16_inputs.size() == 0 || model.params_bf16.size() == 0)) {
            throw std::invalid_argument("bf16 model: the context or the weights have no bf16 copy");
        }
        if ((ctx.acts.qkv_bf16 != nullptr) != bf16_attention_) {
            throw std::invalid_argument(
                "forward: the context's qkv is not in attention's precision");
        }
    }

    // out(N,OC) = residual + inp(N,C) @ weight(OC,C)^T + bias; residual and bias may be null.
    void forward(float* out, const float* residual, const float* inp, const float* weight,
                 const float* bias, int N, int C, int OC) const {
        if (bf16_) {
            matmul_forward_bf16(out, residual, inp, ctx_.bf16_inputs.data(),
                                model_.bf16_twin(weight), bias, N, C, OC);
        } else if (residual != nullptr) {
            matmul_residual_forward(out, residual, inp, weight, bias, N, C, OC);
        } else {
            matmul_forward(out, inp, weight, bias, N, C, OC);
        }
    }
    // The qkv product into bf16 attention's layout (bf16 precision only): qkv (3 * NH, N, hs) =
    // inp(N,C) @ weight(3C,C)^T + bias, rounded.
    void qkv_forward_by_heads(Bf16* qkv, const float* inp, const float* weight, const float* bias,
                              int N, int C, int NH) const {
        matmul_forward_bf16_by_blocks(qkv, inp, ctx_.bf16_inputs.data(), model_.bf16_twin(weight),
                                      bias, N, C, 3 * C, C / NH);
    }
    // dinp = dout @ weight (skipped when null), dweight += dout^T @ inp, dbias += sums of dout.
    void backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                  const float* weight, int N, int C, int OC) const {
        if (bf16_) {
            matmul_backward_bf16(dinp, dweight, dbias, dout, inp, model_.bf16_twin(weight),
                                 ctx_.bf16_gradients.data(), ctx_.bf16_inputs.data(), N, C, OC);
        } else {
            matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
        }
    }

    // The LM head (tied to wte (Vp, C)) over R rows of inp: the rows' losses against targets.
    void lm_head_loss(float* losses, const float* inp, const float* wte,
                      const std::int32_t* targets, int R, int C, int V, int Vp) const {
        if (bf16_) {
            lm_head_loss_bf16(losses, inp, model_.bf16_twin(wte), targets, R, C, V, Vp,
                              lm_head_scratch(Vp));
        } else {
            matmul_forward(ctx_.scratch.logits, inp, wte, nullptr, R, C, Vp);
            cross_entropy_forward(losses, ctx_.scratch.logits, targets, R, V, Vp);
        }
    }
    // ... and the backward: dinp = dlogits @ wte (overwritten), dwte += dlogits^T @ inp (skipped
    // when null), dlogits = (softmax - onehot) * dloss.
    void lm_head_forward_backward(float* losses, float* dinp, float* dwte, const float* inp,
                                  const float* wte, const std::int32_t* targets, int R, int C,
                                  int V, int Vp, float dloss) const {
        if (bf16_) {
            lm_head_forward_backward_bf16(losses, dinp, dwte, inp, model_.bf16_twin(wte), targets,
                                          R, C, V, Vp, dloss, lm_head_scratch(Vp));
            return;
        }
        float* const logits = ctx_.scratch.logits;
        matmul_forward(logits, inp, wte, nullptr, R, C, Vp);
        cross_entropy_forward_backward(losses, logits, targets, R, V, Vp, dloss);
        matmul_backward(dinp, dwte, nullptr, logits, inp, wte, R, C, Vp);
    }

    // Attention over the layer's q, k and v: acts.qkv or, where attention runs in bf16,
    // acts.qkv_bf16.
    void attention_forward(float* out, float* lse, const LayerActs& acts, int B, int T, int C,
                           int NH, const DropoutMask& dropout,
                           std::span<const std::int32_t> first_keys) const {
        if (bf16_attention_) {
            attention_forward_bf16(out, lse, attention_scratch(), acts.qkv_bf16, B, T, C, NH,
                                   dropout, first_keys, model_.config.kv_heads());
        } else {
            gpt2::attention_forward(out, lse, ctx_.scratch.attention, acts.qkv, B, T, C, NH,
                                    dropout, first_keys, model_.config.kv_heads());
        }
    }
    void attention_backward(float* dqkv, const float* dout, const float* out, const float* lse,
                            const LayerActs& acts, int B, int T, int C, int NH,
                            const DropoutMask& dropout,
                            std::span<const std::int32_t> first_keys) const {
        if (bf16_attention_) {
            attention_backward_bf16(dqkv, attention_scratch(), dout, out, lse, acts.qkv_bf16, B, T,
                                    C, NH, dropout, first_keys, model_.config.kv_heads());
        } else {
            gpt2::attention_backward(dqkv, ctx_.scratch.attention, dout, out, lse, acts.qkv, B, T,
                                     C, NH, dropout, first_keys, model_.config.kv_heads());
        }
    }

  private:
    [[nodiscard]] LmHeadBf16Scratch lm_head_scratch(int Vp) const {
        const long rows = ctx_.logits_rows;
        return LmHeadBf16Scratch{ctx_.scratch.logits, ctx_.scratch.logits + rows * Vp,
                                 ctx_.bf16_inputs.data(), ctx_.bf16_gradients.data()};
    }
    [[nodiscard]] AttentionBf16Scratch attention_scratch() const {
        return AttentionBf16Scratch{ctx_.scratch.attention, ctx_.bf16_attention.data()};
    }

    const Model& model_;
    ThreadLocalTrainingContext& ctx_;
    bool bf16_;
    bool bf16_attention_;
};

void check_batch(const ThreadLocalTrainingContext& ctx, const Model& model,
                 const TokenBatch& batch) {
    // The activations are laid out by tokens (max_batch x seq_len of them), so more sequences
    // than max_batch fit when they are shorter (HellaSwag's endings in one forward).
    if (static_cast<long>(batch.B) * batch.T > static_cast<long>(ctx.max_batch()) * ctx.seq_len() ||
        batch.T > ctx.seq_len() || batch.T > model.config.max_seq_len ||
        batch.inputs.size() < static_cast<std::size_t>(batch.B) * batch.T) {
        throw std::invalid_argument("forward: batch larger than the context was sized for");
    }
}
// One layer's adapter (inactive without LoRA): its matrices, their gradients (backward only),
// LoRA's input dropout masks for the batch and the worker's scratch, so that an adapted product is
// the base product plus lora_forward/backward.
class LayerAdapter {
  public:
    LayerAdapter() = default;
    LayerAdapter(const Model& model, ThreadLocalTrainingContext& ctx, int l,
                 const TokenBatch& batch, std::span<float> adapter_grads)
        : config_(&model.config),
          scale_(model.lora->config.scale()),
          rank_(model.lora->config.rank),
          sequences_(batch.B),
          weights_(model.lora->layer(l)) {
        const std::size_t rows = static_cast<std::size_t>(ctx.max_batch()) * ctx.seq_len();
        u_ = ctx.adapter_scratch.data();
        v_ = u_ + rows * static_cast<std::size_t>(rank_);
        dropped_ = v_ + rows * static_cast<std::size_t>(rank_);
        if (!adapter_grads.empty()) {
            grads_ = lora_layer_view(model.lora->layout, model.lora->config, adapter_grads, l);
        }
        if (batch.dropout.lora_rate > 0.0f) {
            for (int i = 0; i < kLoraTargets; ++i) {
                masks_[static_cast<std::size_t>(i)] =
                    DropoutMask{batch.dropout.lora_rate,
                                lora_input_site_key(batch.dropout.seed, batch.dropout.step, l, i),
                                batch.first_sequence};
            }
        }
    }
    // Whether any adapter adds to the product of base weight `weight`.
    [[nodiscard]] bool adapts(ParamTensor weight) const {
        for (int i = 0; i < kLoraTargets; ++i) {
            const auto t = static_cast<LoraTarget>(i);
            if (weights_.a[static_cast<std::size_t>(i)] != nullptr &&
                lora_target_weight(t) == weight)
                return true;
        }
        return false;
    }
    // out (N, OC) += the adapters' terms for the product of `inp` (N, C) with `weight`: each
    // target's on its rows of the product (all of them, or a row block as q_proj's of qkvw).
    void forward(ParamTensor weight, float* out, const float* inp, int N, int C, int OC) const {
        for (int i = 0; i < kLoraTargets; ++i) {
            const auto t = static_cast<LoraTarget>(i);
            const auto k = static_cast<std::size_t>(i);
            if (weights_.a[k] == nullptr || lora_target_weight(t) != weight) continue;
            const ProductShape s = lora_product_shape(*config_, t);
            lora_forward(out + s.first_row, u_, inp, weights_.a[k], weights_.b[k], scale_, N, C,
                         s.out, rank_, OC, input_dropout(t));
        }
    }
    // dinp += the adapters' part of the input gradient; their gradients accumulated.
    void backward(ParamTensor weight, float* dinp, const float* dout, const float* inp, int N,
                  int C, int OC) const {
        for (int i = 0; i < kLoraTargets; ++i) {
            const auto t = static_cast<LoraTarget>(i);
            const auto k = static_cast<std::size_t>(i);
            if (weights_.a[k] == nullptr || lora_target_weight(t) != weight) continue;
            const ProductShape s = lora_product_shape(*config_, t);
            lora_backward(dinp, grads_.a[k], grads_.b[k], u_, v_, dout + s.first_row, inp,
                          weights_.a[k], weights_.b[k], scale_, N, C, s.out, rank_, OC,
                          input_dropout(t));
        }
    }

  private:
    [[nodiscard]] LoraInputDropout input_dropout(LoraTarget t) const {
        return LoraInputDropout{masks_[static_cast<std::size_t>(t)], sequences_, dropped_};
    }
    const ModelConfig* config_ = nullptr;
    float scale_ = 0.0f;
    int rank_ = 0;
    int sequences_ = 0;
    float* u_ = nullptr;
    float* v_ = nullptr;
    float* dropped_ = nullptr;  // LoRA's input dropout only
    LoraLayerView<const float> weights_{};
    LoraLayerView<float> grads_{};
    std::array<DropoutMask, kLoraTargets> masks_{};  // inactive without LoRA's input dropout
};

// Layer l's adapter, inactive when the model has none.
LayerAdapter layer_adapter(const Model& model, ThreadLocalTrainingContext& ctx, int l,
                           const TokenBatch& batch, std::span<float> adapter_grads = {}) {
    if (model.lora == nullptr) return {};
    const int dropped_channels = lora_dropout_channels(model.config, batch.dropout.lora_rate);
    const std::size_t needed = ThreadLocalTrainingContext::adapter_scratch_floats(
        ctx.max_batch(), ctx.seq_len(), model.lora->config.rank, dropped_channels);
    if (ctx.adapter_scratch.size() < needed) {
        throw std::invalid_argument(
            "forward: the context has no scratch for the adapter's rank and input dropout");
    }
    return LayerAdapter(model, ctx, l, batch, adapter_grads);
}
}  // namespace

namespace {
// The batch's mask at one site of layer l (inactive without dropout).
DropoutMask dropout_mask(const TokenBatch& batch, int l, DropoutSite site) {
    if (batch.dropout.rate <= 0.0f) return {};
    return DropoutMask{batch.dropout.rate,
                       dropout_site_key(batch.dropout.seed, batch.dropout.step, l, site),
                       batch.first_sequence};
}

// A layer's three dropout sites.
struct LayerDropout {
    DropoutMask probabilities, attention_output, mlp_output;
};

LayerDropout layer_dropout(const TokenBatch& batch, int l) {
    return LayerDropout{dropout_mask(batch, l, DropoutSite::AttentionProbabilities),
                        dropout_mask(batch, l, DropoutSite::AttentionOutput),
                        dropout_mask(batch, l, DropoutSite::MlpOutput)};
}

// out (B*T, OC) = residual + dropout(inp @ weight^T + bias): the product and the residual add
// stay one fused call without dropout.
void residual_product(const PrecisionMatmul& matmul, float* out, const float* residual,
                      const float* inp, const float* weight, const float* bias, int B, int T, int C,
                      int OC, const DropoutMask& dropout, const LayerAdapter& adapter,
                      ParamTensor target) {
    const int N = B * T;
    if (!dropout.active()) {
        matmul.forward(out, residual, inp, weight, bias, N, C, OC);
        adapter.forward(target, out, inp, N, C, OC);
        return;
    }
    matmul.forward(out, nullptr, inp, weight, bias, N, C, OC);
    adapter.forward(target, out, inp, N, C, OC);
    apply_dropout(out, B, static_cast<long>(T) * OC, dropout);
    const long n = static_cast<long>(N) * OC;
    for (long i = 0; i < n; ++i)
        out[i] += residual[i];
}

// The gradient reaching a dropped product's output: `dres` itself without dropout, else dres
// masked into `scratch` (N * C floats).
const float* dropped_gradient(const float* dres, float* scratch, int B, int T, int C,
                              const DropoutMask& dropout) {
    if (!dropout.active()) return dres;
    std::memcpy(scratch, dres, sizeof(float) * static_cast<std::size_t>(B) * T * C);
    apply_dropout(scratch, B, static_cast<long>(T) * C, dropout);
    return scratch;
}

// qkv (N, C + 2 KV) = ln @ qkvw^T + qkvb (+ the adapter's term), QK-norm and rotary applied, into
// the layer's qkv or, where attention runs in bf16, rounded into its qkv_bf16 by heads: by the
// product itself (GPT-2's block without an adapter on it: nothing comes between), or once the
// fp32 q, k and v are done (in qkv where QK-norm's backward reads them, else in dqkv, backward's
// scratch, free during forward).
void qkv_forward(const PrecisionMatmul& matmul, ThreadLocalTrainingContext& ctx, const LayerActs& a,
                 const LayerView<const float>& p, const LayerAdapter& adapter, const float* ln,
                 int T, int N, const ModelConfig& c) {
    const int C = c.channels, NH = c.num_heads, W = c.qkv_width();
    const bool rounded_by_product = c.arch.positions == PositionKind::Learned && !c.arch.qk_norm &&
                                    c.kv_heads() == NH && !adapter.adapts(ParamTensor::qkvw);
    if (a.qkv_bf16 != nullptr && rounded_by_product) {
        matmul.qkv_forward_by_heads(a.qkv_bf16, ln, p.qkvw, p.qkvb, N, C, NH);
        return;
    }
    float* qkv = a.qkv != nullptr ? a.qkv : ctx.scratch.dqkv;
    matmul.forward(qkv, nullptr, ln, p.qkvw, p.qkvb, N, C, W);
    adapter.forward(ParamTensor::qkvw, qkv, ln, N, C, W);
    qk_norm_forward(c, qkv, a.qk_rstd, N);        // where QK-norm
    rotate_qk_forward(c, ctx.rotary, qkv, N, T);  // q and k rotated where they are stored
    if (a.qkv_bf16 != nullptr) round_qkv_by_heads(a.qkv_bf16, qkv, N, C, NH, c.kv_heads());
}

// One layer's forward from its input `residual` (N, C). Writes the layer's stored activations and
// the scratch LayerNorm and GELU outputs; with `output` false it stops before GELU and the last
// product, whose results backward recomputes or never reads.
void layer_forward(const PrecisionMatmul& matmul, ThreadLocalTrainingContext& ctx,
                   const LayerActs& a, const LayerView<const float>& p, const LayerAdapter& adapter,
                   const float* residual, int B, int T, const ModelConfig& c,
                   const LayerDropout& dropout, std::span<const std::int32_t> first_keys,
                   bool output) {
    const int N = B * T, C = c.channels, NH = c.num_heads, F = c.fc_width(), H = c.mlp_hidden();
    float* ln = ctx.scratch.normalized;
    float* act = ctx.scratch.gelu;
    norm_forward(c, ln, a.ln1_mean, a.ln1_rstd, residual, p.ln1w, p.ln1b, N);
    qkv_forward(matmul, ctx, a, p, adapter, ln, T, N, c);
    matmul.attention_forward(a.atty, a.att_lse, a, B, T, C, NH, dropout.probabilities, first_keys);
    residual_product(matmul, a.residual2, residual, a.atty, p.attprojw, p.attprojb, B, T, C, C,
                     dropout.attention_output, adapter, ParamTensor::attprojw);
    norm_forward(c, ln, a.ln2_mean, a.ln2_rstd, a.residual2, p.ln2w, p.ln2b, N);
    matmul.forward(a.fch, nullptr, ln, p.fcw, p.fcb, N, C, F);
    adapter.forward(ParamTensor::fcw, a.fch, ln, N, C, F);
    if (output) {  // the activation feeds only the last product; backward recomputes it itself
        activation_forward(c, act, a.fch, N);
        residual_product(matmul, a.residual3, a.residual2, act, p.fcprojw, p.fcprojb, B, T, H, C,
                         dropout.mlp_output, adapter, ParamTensor::fcprojw);
    }
}

// One layer's backward: dres (N, C) holds the gradient of the layer's output and becomes that of
// its input; the parameter gradients are accumulated into d. The LayerNorm and GELU outputs are
// recomputed from what forward stored, bitwise as forward computed them.
void layer_backward(const PrecisionMatmul& matmul, ThreadLocalTrainingContext& ctx,
                    const LayerActs& a, const LayerView<const float>& p, const LayerView<float>& d,
                    const LayerAdapter& adapter, const float* residual, int B, int T,
                    const ModelConfig& c, const LayerDropout& dropout,
                    std::span<const std::int32_t> first_keys) {
    const int N = B * T, C = c.channels, NH = c.num_heads, W = c.qkv_width(), F = c.fc_width();
    const int H = c.mlp_hidden();
    float* dres = ctx.scratch.dresidual;
    float* dch = ctx.scratch.dchannels;
    float* dfch = ctx.scratch.dfch;
    float* ln = ctx.scratch.normalized;
    float* act = ctx.scratch.gelu;
    // MLP: residual3 = residual2 + dropout(fcproj(act(fc(ln2(residual2))))).
    activation_forward(c, act, a.fch, N);
    const float* dmlp = dropped_gradient(dres, dch, B, T, C, dropout.mlp_output);
    // The activation's gradient: in dfch, where its backward runs in place (GELU, ReLU^2), or
    // apart (SwiGLU: F = 2H).
    float* dact = c.arch.mlp == MlpKind::SwiGlu ? ctx.scratch.dact : dfch;
    matmul.backward(dact, d.fcprojw, d.fcprojb, dmlp, act, p.fcprojw, N, H, C);
    adapter.backward(ParamTensor::fcprojw, dact, dmlp, act, N, H, C);
    activation_backward(c, dfch, a.fch, dact, N);
    norm_recompute(c, ln, a.residual2, a.ln2_mean, a.ln2_rstd, p.ln2w, p.ln2b, N);
    matmul.backward(dch, d.fcw, d.fcb, dfch, ln, p.fcw, N, C, F);
    adapter.backward(ParamTensor::fcw, dch, dfch, ln, N, C, F);
    norm_backward(c, dres, d.ln2w, d.ln2b, dch, a.residual2, p.ln2w, a.ln2_mean, a.ln2_rstd, N);
    // Attention: residual2 = residual + dropout(attproj(attention(qkv(ln1(residual))))).
    const float* dattn = dropped_gradient(dres, dfch, B, T, C, dropout.attention_output);
    matmul.backward(dch, d.attprojw, d.attprojb, dattn, a.atty, p.attprojw, N, C, C);
    adapter.backward(ParamTensor::attprojw, dch, dattn, a.atty, N, C, C);
    matmul.attention_backward(ctx.scratch.dqkv, dch, a.atty, a.att_lse, a, B, T, C, NH,
                              dropout.probabilities, first_keys);
    qk_norm_backward(c, ctx.scratch.dqkv, a.qkv, a.qk_rstd, N);  // in the rotated frame
    rotate_qk_backward(c, ctx.rotary, ctx.scratch.dqkv, N, T);   // where rotary
    norm_recompute(c, ln, residual, a.ln1_mean, a.ln1_rstd, p.ln1w, p.ln1b, N);
    matmul.backward(dch, d.qkvw, d.qkvb, ctx.scratch.dqkv, ln, p.qkvw, N, C, W);
    adapter.backward(ParamTensor::qkvw, dch, ctx.scratch.dqkv, ln, N, C, W);
    norm_backward(c, dres, d.ln1w, d.ln1b, dch, residual, p.ln1w, a.ln1_mean, a.ln1_rstd, N);
}

// The batch's document masking for attention: the first keys forward_hidden wrote into the
// context, or empty (no masking) when the batch does not ask for it.
std::span<const std::int32_t> attention_first_keys(const ThreadLocalTrainingContext& ctx,
                                                   const TokenBatch& batch) {
    if (!batch.document_start) return {};
    return std::span<const std::int32_t>(ctx.attention_first_keys)
        .first(static_cast<std::size_t>(batch.B) * static_cast<std::size_t>(batch.T));
}

// Layer l's input: the embeddings' sum or the previous layer's output.
const float* layer_input(const ThreadLocalTrainingContext& ctx, const ModelConfig& c, int l) {
    return l == 0 ? ctx.acts.encoded : layer_acts(ctx, c, l - 1).residual3;
}
}  // namespace

void forward_hidden(const Model& model, ThreadLocalTrainingContext& ctx, const TokenBatch& batch) {
    check_batch(ctx, model, batch);
    const ModelConfig& c = model.config;
    const ParameterLayout& layout = model.layout;
    const std::span<const float> w = model.weights();
    const int B = batch.B, T = batch.T, C = c.channels, N = B * T;
    const PrecisionMatmul matmul(model, ctx);
    if (batch.document_start) {  // once per forward: every layer, and backward, read them
        ctx.attention_first_keys.resize(static_cast<std::size_t>(N));
        document_first_keys(ctx.attention_first_keys, batch.inputs, B, T, *batch.document_start);
    }
    const std::span<const std::int32_t> first_keys = attention_first_keys(ctx, batch);

    encoder_forward(ctx.acts.encoded, batch.inputs.data(),
                    layout.tensor(w, ParamTensor::wte).data(),
                    tensor_or_null(layout, w, ParamTensor::wpe), B, T, C);
    const DropoutMask embeddings = dropout_mask(batch, 0, DropoutSite::Embeddings);
    if (embeddings.active())
        apply_dropout(ctx.acts.encoded, B, static_cast<long>(T) * C, embeddings);
    embedding_norm_forward(c, ctx.acts.encoded, ctx.acts.encoded_rstd, N);  // where normed
    for (int l = 0; l < c.num_layers; ++l) {
        layer_forward(matmul, ctx, layer_acts(ctx, c, l), layer_view(layout, w, l),
                      layer_adapter(model, ctx, l, batch), layer_input(ctx, c, l), B, T, c,
                      layer_dropout(batch, l), first_keys, true);
    }
    norm_forward(c, ctx.acts.lnf, ctx.acts.lnf_mean, ctx.acts.lnf_rstd,
                 layer_input(ctx, c, c.num_layers), tensor_or_null(layout, w, ParamTensor::lnfw),
                 tensor_or_null(layout, w, ParamTensor::lnfb), N);
}

double forward_loss(const Model& model, ThreadLocalTrainingContext& ctx, const TokenBatch& batch) {
    // Evaluation (validation, HellaSwag) never drops anything.
    TokenBatch undropped = batch;
    undropped.dropout = Dropout{};
    forward_hidden(model, ctx, undropped);
    const ModelConfig& c = model.config;
    const float* wte = model.layout.tensor(model.weights(), head_tensor(model.layout)).data();
    const int N = batch.B * batch.T, C = c.channels, Vp = c.padded_vocab_size;
    const PrecisionMatmul matmul(model, ctx);
    double loss_sum = 0.0;
    for (int r0 = 0; r0 < N; r0 += ctx.logits_rows) {
        const int rows = std::min(ctx.logits_rows, N - r0);
        matmul.lm_head_loss(ctx.acts.losses + r0, ctx.acts.lnf + static_cast<long>(r0) * C, wte,
                            batch.targets.data() + r0, rows, C, c.vocab_size, Vp);
        for (int r = 0; r < rows; ++r)
            loss_sum += ctx.acts.losses[r0 + r];
    }
    return loss_sum;
}

double forward_backward(const Model& model, ThreadLocalTrainingContext& ctx,
                        const TokenBatch& batch, float dloss, GradientSink& sink) {
    forward_hidden(model, ctx, batch);
    const ModelConfig& c = model.config;
    const ParameterLayout& layout = model.layout;
    const std::span<const float> w = model.weights();
    const int B = batch.B, T = batch.T, C = c.channels, N = B * T;
    const int Vp = c.padded_vocab_size;
    const float* wte = layout.tensor(w, head_tensor(layout)).data();  // the LM head's weight
    float* dres = ctx.scratch.dresidual;
    float* dch = ctx.scratch.dchannels;
    const PrecisionMatmul matmul(model, ctx);
    if ((model.lora != nullptr) != !sink.adapter().empty()) {
        throw std::invalid_argument(
            "forward_backward: an adapter trains through an AdapterGradient");
    }

    // LM head (tied to wte) in row chunks: logits -> loss and dlogits in place -> dlnf, dwte.
    const GradientSink::Head head = sink.head();
    double loss_sum = 0.0;
    for (int r0 = 0; r0 < N; r0 += ctx.logits_rows) {
        const int rows = std::min(ctx.logits_rows, N - r0);
        matmul.lm_head_forward_backward(ctx.acts.losses + r0, dch + static_cast<long>(r0) * C,
                                        head.dhead, ctx.acts.lnf + static_cast<long>(r0) * C, wte,
                                        batch.targets.data() + r0, rows, C, c.vocab_size, Vp,
                                        dloss);
        for (int r = 0; r < rows; ++r)
            loss_sum += ctx.acts.losses[r0 + r];
    }

    std::memset(dres, 0, sizeof(float) * static_cast<std::size_t>(N) * C);
    norm_backward(c, dres, head.dlnfw, head.dlnfb, dch, layer_input(ctx, c, c.num_layers),
                  tensor_or_null(layout, w, ParamTensor::lnfw), ctx.acts.lnf_mean,
                  ctx.acts.lnf_rstd, N);
    sink.head_done();

    const bool rerun_layers = ctx.stored_layers() < c.num_layers;
    const std::span<const std::int32_t> first_keys = attention_first_keys(ctx, batch);
    for (int l = c.num_layers - 1; l >= 0; --l) {
        const LayerActs a = layer_acts(ctx, c, l);
        const LayerView<const float> p = layer_view(layout, w, l);
        const float* residual = layer_input(ctx, c, l);
        // --recompute layers: the layer's activations again, from its stored input.
        const LayerDropout dropout = layer_dropout(batch, l);
        const LayerAdapter adapter = layer_adapter(model, ctx, l, batch, sink.adapter());
        if (rerun_layers) {
            layer_forward(matmul, ctx, a, p, adapter, residual, B, T, c, dropout, first_keys,
                          false);
        }
        layer_backward(matmul, ctx, a, p, sink.layer(l), adapter, residual, B, T, c, dropout,
                       first_keys);
        sink.layer_done(l);
    }
    embedding_norm_backward(c, dres, ctx.acts.encoded, ctx.acts.encoded_rstd, N);
    const DropoutMask embeddings = dropout_mask(batch, 0, DropoutSite::Embeddings);
    if (embeddings.active()) apply_dropout(dres, B, static_cast<long>(T) * C, embeddings);
    sink.embeddings(dres, batch);
    return loss_sum;
}

double forward_backward(const Model& model, ThreadLocalTrainingContext& ctx,
                        const TokenBatch& batch, float dloss, std::span<float> grads) {
    FullGradient sink(model, grads);
    return forward_backward(model, ctx, batch, dloss, sink);
}

FullGradient::FullGradient(const Model& model, std::span<float> grads)
    : model_(model), grads_(grads) {
    if (grads.size() != model.layout.total()) {
        throw std::invalid_argument("FullGradient: the buffer is not the model's size");
    }
}

GradientSink::Head FullGradient::head() {
    const ParameterLayout& layout = model_.layout;
    return Head{layout.tensor(grads_, head_tensor(layout)).data(),
                tensor_or_null(layout, grads_, ParamTensor::lnfw),
                tensor_or_null(layout, grads_, ParamTensor::lnfb)};
}

LayerView<float> FullGradient::layer(int l) {
    return layer_view(model_.layout, grads_, l);
}

void FullGradient::embeddings(const float* dresidual, const TokenBatch& batch) {
    const ParameterLayout& layout = model_.layout;
    encoder_backward(layout.tensor(grads_, ParamTensor::wte).data(),
                     tensor_or_null(layout, grads_, ParamTensor::wpe), dresidual,
                     batch.inputs.data(), batch.B, batch.T, model_.config.channels);
}

}  // namespace gpt2

namespace gpt2 {

AdapterGradient::AdapterGradient(const Model& model, std::span<float> grads) : grads_(grads) {
    if (model.lora == nullptr || grads.size() != model.lora->layout.total()) {
        throw std::invalid_argument("AdapterGradient: the buffer is not the adapter's size");
    }
}

double forward_backward_adapter(const Model& model, ThreadLocalTrainingContext& ctx,
                                const TokenBatch& batch, float dloss, std::span<float> grads) {
    AdapterGradient sink(model, grads);
    return forward_backward(model, ctx, batch, dloss, sink);
}

}  // namespace gpt2
