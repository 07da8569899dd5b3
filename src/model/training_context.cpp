#include "model/training_context.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>

#include "ops/kernels.hpp"

namespace gpt2 {

namespace {
// Rows of logits materialised at once: the (B*T x Vp) logits never exist in full.
constexpr int kLogitsChunkRows = 256;

// Carves named arrays out of one allocation; each starts on a 64-byte boundary.
class ArenaPlan {
  public:
    std::size_t reserve(std::size_t count) {
        const std::size_t offset = size_;
        size_ += (count + 15) / 16 * 16;
        return offset;
    }
    [[nodiscard]] std::size_t size() const { return size_; }

  private:
    std::size_t size_ = 0;
};
}  // namespace

ThreadLocalTrainingContext::ThreadLocalTrainingContext(const ModelConfig& c, int max_batch,
                                                       int seq_len, Precision precision)
    : max_batch_(max_batch), seq_len_(seq_len) {
    const auto L = static_cast<std::size_t>(c.num_layers);
    const auto C = static_cast<std::size_t>(c.channels);
    const auto N = static_cast<std::size_t>(max_batch) * static_cast<std::size_t>(seq_len);
    const auto att = static_cast<std::size_t>(max_batch) * static_cast<std::size_t>(c.num_heads) *
                     static_cast<std::size_t>(seq_len) * static_cast<std::size_t>(seq_len);
    logits_rows = static_cast<int>(std::min<std::size_t>(N, kLogitsChunkRows));

    ArenaPlan plan;
    const std::size_t o_encoded = plan.reserve(N * C);
    const std::size_t o_ln1 = plan.reserve(L * N * C);
    const std::size_t o_ln1_mean = plan.reserve(L * N);
    const std::size_t o_ln1_rstd = plan.reserve(L * N);
    const std::size_t o_qkv = plan.reserve(L * N * 3 * C);
    const std::size_t o_atty = plan.reserve(L * N * C);
    const std::size_t o_att = plan.reserve(L * att);
    const std::size_t o_residual2 = plan.reserve(L * N * C);
    const std::size_t o_ln2 = plan.reserve(L * N * C);
    const std::size_t o_ln2_mean = plan.reserve(L * N);
    const std::size_t o_ln2_rstd = plan.reserve(L * N);
    const std::size_t o_fch = plan.reserve(L * N * 4 * C);
    const std::size_t o_fch_gelu = plan.reserve(L * N * 4 * C);
    const std::size_t o_residual3 = plan.reserve(L * N * C);
    const std::size_t o_lnf = plan.reserve(N * C);
    const std::size_t o_lnf_mean = plan.reserve(N);
    const std::size_t o_lnf_rstd = plan.reserve(N);
    const std::size_t o_losses = plan.reserve(N);
    const std::size_t o_dresidual = plan.reserve(N * C);
    const std::size_t o_dchannels = plan.reserve(N * C);
    const std::size_t o_dqkv = plan.reserve(N * 3 * C);
    const std::size_t o_dfch = plan.reserve(N * 4 * C);
    const std::size_t o_attention =
        plan.reserve(static_cast<std::size_t>(attention_backward_scratch_size(seq_len)));
    const std::size_t o_logits = plan.reserve(static_cast<std::size_t>(logits_rows) *
                                              static_cast<std::size_t>(c.padded_vocab_size));

    arena_ = AlignedBuffer<float>(plan.size());
    float* base = arena_.data();
    acts = Activations{base + o_encoded,  base + o_ln1,       base + o_ln1_mean, base + o_ln1_rstd,
                       base + o_qkv,      base + o_atty,      base + o_att,      base + o_residual2,
                       base + o_ln2,      base + o_ln2_mean,  base + o_ln2_rstd, base + o_fch,
                       base + o_fch_gelu, base + o_residual3, base + o_lnf,      base + o_lnf_mean,
                       base + o_lnf_rstd, base + o_losses};
    scratch = Scratch{base + o_dresidual, base + o_dchannels, base + o_dqkv,
                      base + o_dfch,      base + o_attention, base + o_logits};
    if (precision == Precision::bf16) {
        bf16_inputs = AlignedBuffer<Bf16>(N * 4 * C);
        bf16_gradients = AlignedBuffer<Bf16>(
            std::max(N * 4 * C, static_cast<std::size_t>(logits_rows) * c.padded_vocab_size));
    }
}

namespace {
// Pointers to layer l's slice of every per-layer activation.
struct LayerActs {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *residual2, *ln2, *ln2_mean, *ln2_rstd,
        *fch, *fch_gelu, *residual3;
};

LayerActs layer_acts(const ThreadLocalTrainingContext& ctx, const ModelConfig& c, int l) {
    const long N = static_cast<long>(ctx.max_batch()) * ctx.seq_len();
    const long C = c.channels;
    const long att =
        static_cast<long>(ctx.max_batch()) * c.num_heads * ctx.seq_len() * ctx.seq_len();
    const auto& a = ctx.acts;
    return LayerActs{a.ln1 + l * N * C,       a.ln1_mean + l * N,    a.ln1_rstd + l * N,
                     a.qkv + l * N * 3 * C,   a.atty + l * N * C,    a.att + l * att,
                     a.residual2 + l * N * C, a.ln2 + l * N * C,     a.ln2_mean + l * N,
                     a.ln2_rstd + l * N,      a.fch + l * N * 4 * C, a.fch_gelu + l * N * 4 * C,
                     a.residual3 + l * N * C};
}

// The model's matrix products in its precision: fp32 through OpenBLAS, or bf16 operands (the
// weights' bf16 copy, activations and gradients rounded into the context's scratch) with fp32
// accumulation. Both paths take the same arguments, so forward/backward read the same either way.
class Products {
  public:
    Products(const Model& model, ThreadLocalTrainingContext& ctx)
        : model_(model), ctx_(ctx), bf16_(model.precision == Precision::bf16) {
        if (bf16_ && (ctx.bf16_inputs.size() == 0 || model.params_bf16.size() == 0)) {
            throw std::invalid_argument("bf16 model: the context or the weights have no bf16 copy");
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

  private:
    const Model& model_;
    ThreadLocalTrainingContext& ctx_;
    bool bf16_;
};

void check_batch(const ThreadLocalTrainingContext& ctx, const Model& model,
                 const TokenBatch& batch) {
    if (batch.B > ctx.max_batch() || batch.T > ctx.seq_len() ||
        batch.T > model.config.max_seq_len ||
        batch.inputs.size() < static_cast<std::size_t>(batch.B) * batch.T) {
        throw std::invalid_argument("forward: batch larger than the context was sized for");
    }
}
}  // namespace

void forward_hidden(const Model& model, ThreadLocalTrainingContext& ctx, const TokenBatch& batch) {
    check_batch(ctx, model, batch);
    const ModelConfig& c = model.config;
    const ParameterLayout& layout = model.layout;
    const std::span<const float> w = model.weights();
    const int B = batch.B, T = batch.T, C = c.channels, NH = c.num_heads, N = B * T;
    const Products products(model, ctx);

    encoder_forward(ctx.acts.encoded, batch.inputs.data(),
                    layout.tensor(w, ParamTensor::wte).data(),
                    layout.tensor(w, ParamTensor::wpe).data(), B, T, C);
    const float* residual = ctx.acts.encoded;
    for (int l = 0; l < c.num_layers; ++l) {
        const LayerActs a = layer_acts(ctx, c, l);
        const LayerView<const float> p = layer_view(layout, w, l);
        layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, residual, p.ln1w, p.ln1b, N, C);
        products.forward(a.qkv, nullptr, a.ln1, p.qkvw, p.qkvb, N, C, 3 * C);
        attention_forward(a.atty, a.att, a.qkv, B, T, C, NH);
        products.forward(a.residual2, residual, a.atty, p.attprojw, p.attprojb, N, C, C);
        layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, p.ln2w, p.ln2b, N, C);
        products.forward(a.fch, nullptr, a.ln2, p.fcw, p.fcb, N, C, 4 * C);
        gelu_forward(a.fch_gelu, a.fch, N * 4 * C);
        products.forward(a.residual3, a.residual2, a.fch_gelu, p.fcprojw, p.fcprojb, N, 4 * C, C);
        residual = a.residual3;
    }
    layernorm_forward(ctx.acts.lnf, ctx.acts.lnf_mean, ctx.acts.lnf_rstd, residual,
                      layout.tensor(w, ParamTensor::lnfw).data(),
                      layout.tensor(w, ParamTensor::lnfb).data(), N, C);
}

double forward_loss(const Model& model, ThreadLocalTrainingContext& ctx, const TokenBatch& batch) {
    forward_hidden(model, ctx, batch);
    const ModelConfig& c = model.config;
    const float* wte = model.layout.tensor(model.weights(), ParamTensor::wte).data();
    const int N = batch.B * batch.T, C = c.channels, Vp = c.padded_vocab_size;
    const Products products(model, ctx);
    double loss_sum = 0.0;
    for (int r0 = 0; r0 < N; r0 += ctx.logits_rows) {
        const int rows = std::min(ctx.logits_rows, N - r0);
        products.forward(ctx.scratch.logits, nullptr, ctx.acts.lnf + static_cast<long>(r0) * C, wte,
                         nullptr, rows, C, Vp);
        cross_entropy_forward(ctx.acts.losses + r0, ctx.scratch.logits, batch.targets.data() + r0,
                              rows, c.vocab_size, Vp);
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
    const int B = batch.B, T = batch.T, C = c.channels, NH = c.num_heads, N = B * T;
    const int Vp = c.padded_vocab_size;
    const float* wte = layout.tensor(w, ParamTensor::wte).data();
    float* dres = ctx.scratch.dresidual;
    float* dch = ctx.scratch.dchannels;
    const Products products(model, ctx);

    // LM head (tied to wte) in row chunks: logits -> loss and dlogits in place -> dlnf, dwte.
    const GradientSink::Head head = sink.head();
    double loss_sum = 0.0;
    for (int r0 = 0; r0 < N; r0 += ctx.logits_rows) {
        const int rows = std::min(ctx.logits_rows, N - r0);
        const float* lnf_rows = ctx.acts.lnf + static_cast<long>(r0) * C;
        float* logits = ctx.scratch.logits;
        products.forward(logits, nullptr, lnf_rows, wte, nullptr, rows, C, Vp);
        cross_entropy_forward_backward(ctx.acts.losses + r0, logits, batch.targets.data() + r0,
                                       rows, c.vocab_size, Vp, dloss);
        for (int r = 0; r < rows; ++r)
            loss_sum += ctx.acts.losses[r0 + r];
        products.backward(dch + static_cast<long>(r0) * C, head.dwte, nullptr, logits, lnf_rows,
                          wte, rows, C, Vp);
    }

    const float* last_residual =
        c.num_layers > 0 ? layer_acts(ctx, c, c.num_layers - 1).residual3 : ctx.acts.encoded;
    std::memset(dres, 0, sizeof(float) * static_cast<std::size_t>(N) * C);
    layernorm_backward(dres, head.dlnfw, head.dlnfb, dch, last_residual,
                       layout.tensor(w, ParamTensor::lnfw).data(), ctx.acts.lnf_mean,
                       ctx.acts.lnf_rstd, N, C);
    sink.head_done();

    for (int l = c.num_layers - 1; l >= 0; --l) {
        const LayerActs a = layer_acts(ctx, c, l);
        const LayerView<const float> p = layer_view(layout, w, l);
        const LayerView<float> d = sink.layer(l);
        const float* residual = l == 0 ? ctx.acts.encoded : layer_acts(ctx, c, l - 1).residual3;
        // MLP: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))).
        products.backward(ctx.scratch.dfch, d.fcprojw, d.fcprojb, dres, a.fch_gelu, p.fcprojw, N,
                          4 * C, C);
        gelu_backward(ctx.scratch.dfch, a.fch, ctx.scratch.dfch, N * 4 * C);
        products.backward(dch, d.fcw, d.fcb, ctx.scratch.dfch, a.ln2, p.fcw, N, C, 4 * C);
        layernorm_backward(dres, d.ln2w, d.ln2b, dch, a.residual2, p.ln2w, a.ln2_mean, a.ln2_rstd,
                           N, C);
        // Attention: residual2 = residual + attproj(attention(qkv(ln1(residual)))).
        products.backward(dch, d.attprojw, d.attprojb, dres, a.atty, p.attprojw, N, C, C);
        attention_backward(ctx.scratch.dqkv, ctx.scratch.attention, dch, a.qkv, a.att, B, T, C, NH);
        products.backward(dch, d.qkvw, d.qkvb, ctx.scratch.dqkv, a.ln1, p.qkvw, N, C, 3 * C);
        layernorm_backward(dres, d.ln1w, d.ln1b, dch, residual, p.ln1w, a.ln1_mean, a.ln1_rstd, N,
                           C);
        sink.layer_done(l);
    }
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
    return Head{layout.tensor(grads_, ParamTensor::wte).data(),
                layout.tensor(grads_, ParamTensor::lnfw).data(),
                layout.tensor(grads_, ParamTensor::lnfb).data()};
}

LayerView<float> FullGradient::layer(int l) {
    return layer_view(model_.layout, grads_, l);
}

void FullGradient::embeddings(const float* dresidual, const TokenBatch& batch) {
    const ParameterLayout& layout = model_.layout;
    encoder_backward(layout.tensor(grads_, ParamTensor::wte).data(),
                     layout.tensor(grads_, ParamTensor::wpe).data(), dresidual, batch.inputs.data(),
                     batch.B, batch.T, model_.config.channels);
}

namespace {
// Per-layer floats of each of the twelve layer tensors, in LayerView order (ln1w .. fcprojb).
std::array<std::size_t, 12> layer_tensor_floats(const ModelConfig& config) {
    const ParameterLayout layout(config);
    const auto L = static_cast<std::size_t>(std::max(config.num_layers, 1));
    std::array<std::size_t, 12> sizes{};
    for (std::size_t i = 0; i < sizes.size(); ++i)
        sizes[i] = layout.size(static_cast<ParamTensor>(static_cast<int>(ParamTensor::ln1w) +
                                                        static_cast<int>(i))) /
                   L;
    return sizes;
}
}  // namespace

std::size_t layer_gradient_floats(const ModelConfig& config) {
    std::size_t total = 0;
    for (const std::size_t n : layer_tensor_floats(config))
        total += n;
    return total;
}

LayerView<float> layer_slot_view(const ModelConfig& config, float* slot) {
    const std::array<std::size_t, 12> sizes = layer_tensor_floats(config);
    std::array<float*, 12> at{};
    for (std::size_t i = 0; i < sizes.size(); ++i) {
        at[i] = slot;
        slot += sizes[i];
    }
    return LayerView<float>{at[0], at[1], at[2], at[3], at[4],  at[5],
                            at[6], at[7], at[8], at[9], at[10], at[11]};
}

std::size_t gradient_window_floats(const ModelConfig& config) {
    const auto C = static_cast<std::size_t>(config.channels);
    const std::size_t head = static_cast<std::size_t>(config.padded_vocab_size) * C + 2 * C;
    return std::max(head, 2 * layer_gradient_floats(config));
}

}  // namespace gpt2
