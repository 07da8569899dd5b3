#include "model/lora.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/error.hpp"
#include "core/random.hpp"
#include "ops/bf16.hpp"
#include "ops/gemm.hpp"

namespace gpt2 {

std::string_view lora_target_module(LoraTarget t) {
    switch (t) {
        case LoraTarget::CAttn:
            return "attn.c_attn";
        case LoraTarget::AttnCProj:
            return "attn.c_proj";
        case LoraTarget::CFc:
            return "mlp.c_fc";
        case LoraTarget::MlpCProj:
            return "mlp.c_proj";
    }
    return "?";
}

ParamTensor lora_target_weight(LoraTarget t) {
    switch (t) {
        case LoraTarget::CAttn:
            return ParamTensor::qkvw;
        case LoraTarget::AttnCProj:
            return ParamTensor::attprojw;
        case LoraTarget::CFc:
            return ParamTensor::fcw;
        case LoraTarget::MlpCProj:
            return ParamTensor::fcprojw;
    }
    throw std::invalid_argument("lora_target_weight: unknown target");
}

std::array<bool, kLoraTargets> parse_lora_targets(std::string_view list, std::string_view flag) {
    std::array<bool, kLoraTargets> targets{};
    const auto set = [&](LoraTarget t) { targets[static_cast<std::size_t>(t)] = true; };
    std::size_t start = 0;
    while (start <= list.size()) {
        const std::size_t comma = std::min(list.find(',', start), list.size());
        const std::string_view name = list.substr(start, comma - start);
        if (name == "c_attn" || name == "attn.c_attn") {
            set(LoraTarget::CAttn);
        } else if (name == "attn.c_proj") {
            set(LoraTarget::AttnCProj);
        } else if (name == "c_fc" || name == "mlp.c_fc") {
            set(LoraTarget::CFc);
        } else if (name == "mlp.c_proj") {
            set(LoraTarget::MlpCProj);
        } else if (name == "c_proj") {
            set(LoraTarget::AttnCProj);
            set(LoraTarget::MlpCProj);
        } else if (name == "all") {
            targets.fill(true);
        } else {
            throw InputError(std::string(flag) + ": unknown projection '" + std::string(name) +
                             "' (choose from c_attn, attn.c_proj, c_fc, mlp.c_proj, c_proj, all)");
        }
        start = comma + 1;
    }
    return targets;
}

std::vector<std::string> lora_target_modules(const std::array<bool, kLoraTargets>& targets) {
    const auto has = [&](LoraTarget t) { return targets[static_cast<std::size_t>(t)]; };
    std::vector<std::string> modules;
    if (has(LoraTarget::CAttn)) modules.emplace_back("c_attn");
    if (has(LoraTarget::AttnCProj) && has(LoraTarget::MlpCProj)) {
        modules.emplace_back("c_proj");  // PEFT matches by suffix: both projections
    } else if (has(LoraTarget::AttnCProj)) {
        modules.emplace_back("attn.c_proj");
    } else if (has(LoraTarget::MlpCProj)) {
        modules.emplace_back("mlp.c_proj");
    }
    if (has(LoraTarget::CFc)) modules.emplace_back("c_fc");
    return modules;
}

ProductShape lora_product_shape(const ModelConfig& config, LoraTarget t) {
    const int C = config.channels;
    switch (t) {
        case LoraTarget::CAttn:
            return {C, 3 * C};
        case LoraTarget::AttnCProj:
            return {C, C};
        case LoraTarget::CFc:
            return {C, 4 * C};
        case LoraTarget::MlpCProj:
            return {4 * C, C};
    }
    throw std::invalid_argument("lora_product_shape: unknown target");
}

LoraLayout::LoraLayout(const ModelConfig& model, const LoraConfig& lora)
    : model_(model), lora_(lora) {
    require_gpt2_block(model, "LoRA");  // GPT-2's targets and their shapes
    for (int i = 0; i < kLoraTargets; ++i) {
        const auto t = static_cast<LoraTarget>(i);
        within_layer_[static_cast<std::size_t>(i)] = per_layer_;
        if (lora.adapts(t)) per_layer_ += a_floats(t) + b_floats(t);
    }
    total_ = per_layer_ * static_cast<std::size_t>(model.num_layers);
}

std::size_t LoraLayout::a_floats(LoraTarget t) const {
    return static_cast<std::size_t>(lora_.rank) *
           static_cast<std::size_t>(lora_product_shape(model_, t).in);
}

std::size_t LoraLayout::b_floats(LoraTarget t) const {
    return static_cast<std::size_t>(lora_product_shape(model_, t).out) *
           static_cast<std::size_t>(lora_.rank);
}

std::size_t LoraLayout::offset(int l, LoraTarget t) const {
    if (!lora_.adapts(t)) throw std::invalid_argument("LoraLayout: target not adapted");
    return per_layer_ * static_cast<std::size_t>(l) + within_layer_[static_cast<std::size_t>(t)];
}

double lora_training_flops_per_token(const ModelConfig& config, int seq_len,
                                     const LoraConfig& lora) {
    const double C = config.channels, L = config.num_layers, T = seq_len;
    const double matmul_params =
        L * 12.0 * C * C + static_cast<double>(config.padded_vocab_size) * C;
    const double attention = L * 2.0 * 2.0 * T * C;  // QK^T and PV forward, as training counts it
    double adapter = 0.0;
    for (int i = 0; i < kLoraTargets; ++i) {
        const auto t = static_cast<LoraTarget>(i);
        if (!lora.adapts(t)) continue;
        const ProductShape s = lora_product_shape(config, t);
        // forward: 2r(in + out); backward: 2r(in) + 2r(out) + 2r(in) + 2r(in) + 2r(out)
        adapter += L * 2.0 * lora.rank * (4.0 * s.in + 3.0 * s.out);
    }
    return 2.0 * 2.0 * matmul_params + 3.0 * attention + adapter;
}

void validate_lora(const LoraConfig& config, std::string_view source) {
    const std::string where(source);
    if (config.rank <= 0) throw InputError(where + ": the LoRA rank must be at least 1");
    if (!(config.alpha > 0.0f) || !std::isfinite(config.alpha)) {
        throw InputError(where + ": LoRA's alpha must be a positive number");
    }
    if (!(config.dropout >= 0.0f && config.dropout < 1.0f)) {
        throw InputError(where + ": LoRA's dropout must be in [0, 1)");
    }
    bool any = false;
    for (const bool t : config.targets)
        any = any || t;
    if (!any) throw InputError(where + ": LoRA adapts no projection");
}

void init_lora(LoraAdapter& adapter, std::uint64_t seed) {
    const std::span<float> flat = adapter.params.span();
    std::fill(flat.begin(), flat.end(), 0.0f);  // B = 0
    for (int l = 0; l < adapter.layout.num_layers(); ++l) {
        for (int i = 0; i < kLoraTargets; ++i) {
            const auto t = static_cast<LoraTarget>(i);
            if (!adapter.config.adapts(t)) continue;
            // Each matrix from its own stream: the values do not depend on which others exist.
            Rng rng =
                Rng::derived(seed, static_cast<std::uint64_t>(l), static_cast<std::uint64_t>(i));
            const float bound =
                1.0f /
                std::sqrt(static_cast<float>(lora_product_shape(adapter.layout.model(), t).in));
            float* a = flat.data() + adapter.layout.a_offset(l, t);
            for (std::size_t k = 0; k < adapter.layout.a_floats(t); ++k)
                a[k] = (2.0f * rng.uniform() - 1.0f) * bound;
        }
    }
}

namespace {
// Layer l's matrix of target t (its base weight, (out, in)) += scale * B (out, r) @ A (r, in):
// merge_lora's one product, shared with merged_lora_pieces so that both give bitwise the same.
void add_lora_update(float* weight, const LoraAdapter& adapter, const ModelConfig& config, int l,
                     LoraTarget t) {
    const auto i = static_cast<std::size_t>(t);
    const LoraLayerView<const float> view = adapter.layer(l);
    const ProductShape s = lora_product_shape(config, t);
    const int r = adapter.config.rank;
    gemm_nn(s.out, s.in, r, adapter.config.scale(), view.b[i], r, view.a[i], s.in, 1.0f, weight,
            s.in);
}

// The adapted target whose base weight is `tensor`, if any.
std::optional<LoraTarget> adapted_target(const LoraConfig& config, ParamTensor tensor) {
    for (int i = 0; i < kLoraTargets; ++i) {
        const auto t = static_cast<LoraTarget>(i);
        if (config.adapts(t) && lora_target_weight(t) == tensor) return t;
    }
    return std::nullopt;
}
}  // namespace

void merge_lora(Model& model, const LoraAdapter& adapter) {
    const std::span<float> w = model.params.span();
    for (int l = 0; l < model.config.num_layers; ++l) {
        for (int i = 0; i < kLoraTargets; ++i) {
            const auto t = static_cast<LoraTarget>(i);
            if (!adapter.config.adapts(t)) continue;
            add_lora_update(model.layout.layer(w, lora_target_weight(t), l).data(), adapter,
                            model.config, l, t);
        }
    }
    if (model.precision == Precision::Bf16) set_precision(model, Precision::Bf16);
}

std::size_t merge_buffer_floats(const ModelConfig& config, const std::optional<LoraConfig>& lora,
                                bool layer_matrices_bf16_only) {
    std::size_t largest = 0;
    if (!lora) return largest;
    for (int i = 0; i < kLoraTargets; ++i) {
        const auto t = static_cast<LoraTarget>(i);
        // A bf16-only base converts every layer matrix, adapted or not, in the buffer.
        if (!lora->adapts(t) && !layer_matrices_bf16_only) continue;
        const ProductShape s = lora_product_shape(config, t);
        largest =
            std::max(largest, static_cast<std::size_t>(s.in) * static_cast<std::size_t>(s.out));
    }
    return largest;
}

void merged_lora_pieces(const Model& base, const LoraAdapter& adapter,
                        const std::function<void(std::span<const float>)>& emit) {
    const std::span<const float> w = base.params.span();
    const bool bf16_only = base.layer_matrices_bf16_only;
    AlignedBuffer<float> matrix(merge_buffer_floats(base.config, adapter.config, bf16_only));
    for (const TensorSpec& spec : base.layout.specs()) {
        const ParamTensor tensor = spec.id;
        const std::optional<LoraTarget> target = adapted_target(adapter.config, tensor);
        const bool from_twin = bf16_only && is_layer_matrix(tensor);
        if (!target && !from_twin) {
            emit(base.layout.tensor(w, tensor));
            continue;
        }
        for (int l = 0; l < base.config.num_layers; ++l) {
            const std::span<const float> layer = base.layout.layer(w, tensor, l);
            const std::span<float> merged = matrix.span().first(layer.size());
            if (from_twin) {
                // The fp32 copy was released: the base is its bf16 rounding.
                convert_to_float(merged.data(), base.bf16_twin(layer.data()), layer.size());
            } else {
                std::copy(layer.begin(), layer.end(), merged.begin());
            }
            if (target) add_lora_update(merged.data(), adapter, base.config, l, *target);
            emit(merged);
        }
    }
}

void lora_forward(float* out, float* u, const float* inp, const float* A, const float* B,
                  float scale, int N, int C, int OC, int r) {
    gemm_nt(N, r, C, 1.0f, inp, C, A, C, 0.0f, u, r);     // u = inp @ A^T
    gemm_nt(N, OC, r, scale, u, r, B, r, 1.0f, out, OC);  // out += scale * u @ B^T
}

void lora_backward(float* dinp, float* dA, float* dB, float* u, float* v, const float* dout,
                   const float* inp, const float* A, const float* B, float scale, int N, int C,
                   int OC, int r) {
    gemm_nt(N, r, C, 1.0f, inp, C, A, C, 0.0f, u, r);      // u = inp @ A^T (as forward)
    gemm_nn(N, r, OC, scale, dout, OC, B, r, 0.0f, v, r);  // v = scale * dout @ B
    if (dinp != nullptr) gemm_nn(N, C, r, 1.0f, v, r, A, C, 1.0f, dinp, C);  // dinp += v @ A
    gemm_tn(r, C, N, 1.0f, v, r, inp, C, 1.0f, dA, C);                       // dA += v^T @ inp
    gemm_tn(OC, r, N, scale, dout, OC, u, r, 1.0f, dB, r);  // dB += scale * dout^T @ u
}

namespace {
// dropout.dropped (N, C) = dropout(inp), the same values every time for the same mask.
float* dropped_input(const float* inp, int N, int C, const LoraInputDropout& dropout) {
    if (dropout.sequences <= 0 || N % dropout.sequences != 0 || dropout.dropped == nullptr) {
        throw std::invalid_argument("LoRA dropout: rows do not split into the mask's sequences");
    }
    const std::size_t n = static_cast<std::size_t>(N) * static_cast<std::size_t>(C);
    std::copy_n(inp, n, dropout.dropped);
    apply_dropout(dropout.dropped, dropout.sequences,
                  static_cast<long>(N / dropout.sequences) * static_cast<long>(C), dropout.mask);
    return dropout.dropped;
}
}  // namespace

void lora_forward(float* out, float* u, const float* inp, const float* A, const float* B,
                  float scale, int N, int C, int OC, int r, const LoraInputDropout& dropout) {
    if (!dropout.mask.active()) {
        lora_forward(out, u, inp, A, B, scale, N, C, OC, r);
        return;
    }
    lora_forward(out, u, dropped_input(inp, N, C, dropout), A, B, scale, N, C, OC, r);
}

void lora_backward(float* dinp, float* dA, float* dB, float* u, float* v, const float* dout,
                   const float* inp, const float* A, const float* B, float scale, int N, int C,
                   int OC, int r, const LoraInputDropout& dropout) {
    if (!dropout.mask.active()) {
        lora_backward(dinp, dA, dB, u, v, dout, inp, A, B, scale, N, C, OC, r);
        return;
    }
    // Regenerated rather than stored: the mask is a function of its key, so this is forward's.
    float* dropped = dropped_input(inp, N, C, dropout);
    lora_backward(nullptr, dA, dB, u, v, dout, dropped, A, B, scale, N, C, OC, r);
    if (dinp == nullptr) return;
    // The input's gradient through the mask: dropout's backward is the same mask applied to v @ A
    // (computed into the scratch, whose dropped input dA and dB no longer need).
    gemm_nn(N, C, r, 1.0f, v, r, A, C, 0.0f, dropped, C);
    apply_dropout(dropped, dropout.sequences,
                  static_cast<long>(N / dropout.sequences) * static_cast<long>(C), dropout.mask);
    const std::size_t n = static_cast<std::size_t>(N) * static_cast<std::size_t>(C);
    for (std::size_t i = 0; i < n; ++i)
        dinp[i] += dropped[i];
}

}  // namespace gpt2
