#include "model/lora.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/error.hpp"
#include "core/random.hpp"
#include "ops/bf16.hpp"
#include "ops/gemm.hpp"

namespace gpt2 {

namespace {
struct TargetNames {
    LoraTarget target;
    std::string_view module;  // PEFT's module under the layer
    ParamTensor weight;
};
constexpr std::array<TargetNames, kLoraTargets> kTargets = {{
    {LoraTarget::CAttn, "attn.c_attn", ParamTensor::qkvw},
    {LoraTarget::AttnCProj, "attn.c_proj", ParamTensor::attprojw},
    {LoraTarget::CFc, "mlp.c_fc", ParamTensor::fcw},
    {LoraTarget::MlpCProj, "mlp.c_proj", ParamTensor::fcprojw},
    {LoraTarget::QProj, "self_attn.q_proj", ParamTensor::qkvw},
    {LoraTarget::KProj, "self_attn.k_proj", ParamTensor::qkvw},
    {LoraTarget::VProj, "self_attn.v_proj", ParamTensor::qkvw},
    {LoraTarget::OProj, "self_attn.o_proj", ParamTensor::attprojw},
    {LoraTarget::GateProj, "mlp.gate_proj", ParamTensor::fcw},
    {LoraTarget::UpProj, "mlp.up_proj", ParamTensor::fcw},
    {LoraTarget::DownProj, "mlp.down_proj", ParamTensor::fcprojw},
}};

const TargetNames& names_of(LoraTarget t) {
    const auto i = static_cast<std::size_t>(t);
    if (i >= kTargets.size()) throw std::invalid_argument("LoRA: unknown target");
    return kTargets[i];
}

bool is_llama_target(LoraTarget t) {
    return static_cast<int>(t) >= static_cast<int>(LoraTarget::QProj);
}

// The names a list may give for `modules`' projections (each a module or its suffix after a '.').
std::string modules_choice(const LoraModules& modules) {
    return modules.llama ? (modules.gated ? "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                                            "down_proj, all"
                                          : "q_proj, k_proj, v_proj, o_proj, up_proj, down_proj, "
                                            "all")
                         : "c_attn, attn.c_proj, c_fc, mlp.c_proj, c_proj, all";
}

// The targets one name selects among `modules`' (a module equal to it or ending in "." + it, as
// PEFT matches a target_modules list); empty when none.
std::array<bool, kLoraTargets> matching(std::string_view name, const LoraModules& modules) {
    std::array<bool, kLoraTargets> targets{};
    for (const TargetNames& t : kTargets) {
        if (!offers(modules, t.target)) continue;
        const std::string_view m = t.module;
        const bool suffix =
            m.size() > name.size() && m.ends_with(name) && m[m.size() - name.size() - 1] == '.';
        if (name == "all" || m == name || suffix)
            targets[static_cast<std::size_t>(t.target)] = true;
    }
    return targets;
}

bool any_of(const std::array<bool, kLoraTargets>& targets) {
    return std::find(targets.begin(), targets.end(), true) != targets.end();
}

// Calls `each` with every comma-separated name of `list`.
template <typename F>
void for_each_name(std::string_view list, F&& each) {
    std::size_t start = 0;
    while (start <= list.size()) {
        const std::size_t comma = std::min(list.find(',', start), list.size());
        each(list.substr(start, comma - start));
        start = comma + 1;
    }
}
}  // namespace

LoraModules lora_modules(const ModelConfig& config) {
    return LoraModules{!config.is_gpt2(), config.arch.mlp == MlpKind::SwiGlu};
}

bool offers(const LoraModules& modules, LoraTarget t) {
    if (!is_llama_target(t)) return !modules.llama;
    return modules.llama && (t != LoraTarget::GateProj || modules.gated);
}

std::string_view lora_target_module(LoraTarget t) {
    return names_of(t).module;
}

std::string_view lora_target_short_name(LoraTarget t) {
    const std::string_view m = names_of(t).module;
    return m.substr(m.find('.') + 1);
}

ParamTensor lora_target_weight(LoraTarget t) {
    return names_of(t).weight;
}

std::array<bool, kLoraTargets> parse_lora_targets(std::string_view list, std::string_view flag,
                                                  const LoraModules& modules) {
    std::array<bool, kLoraTargets> targets{};
    for_each_name(list, [&](std::string_view name) {
        const std::array<bool, kLoraTargets> named = matching(name, modules);
        if (!any_of(named)) {
            std::string message(flag);
            if (any_of(matching(name, {!modules.llama, true}))) {
                message.append(": '").append(name).append("' is a projection of ");
                message.append(modules.llama ? "GPT-2" : "the Llama family");
                message.append(", not of this model");
            } else if (any_of(matching(name, {modules.llama, true}))) {
                message.append(": '").append(name);
                message.append("' is not a projection of this model: its MLP has no gate");
            } else {
                message.append(": unknown projection '").append(name).append("'");
            }
            throw InputError(message + " (choose from " + modules_choice(modules) + ")");
        }
        for (std::size_t i = 0; i < targets.size(); ++i)
            targets[i] = targets[i] || named[i];
    });
    return targets;
}

void check_lora_target_names(std::string_view list, std::string_view flag) {
    for_each_name(list, [&](std::string_view name) {
        if (!any_of(matching(name, {false, false})) && !any_of(matching(name, {true, true}))) {
            std::string message(flag);
            message.append(": unknown projection '").append(name);
            message.append(
                "' (GPT-2's: c_attn, attn.c_proj, c_fc, mlp.c_proj, c_proj; the Llama "
                "family's: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                "down_proj; or all)");
            throw InputError(message);
        }
    });
}

std::array<bool, kLoraTargets> all_lora_targets(const ModelConfig& config) {
    return parse_lora_targets("all", "all_lora_targets", lora_modules(config));
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
    for (int i = static_cast<int>(LoraTarget::QProj); i < kLoraTargets; ++i) {
        const auto t = static_cast<LoraTarget>(i);
        if (has(t)) modules.emplace_back(lora_target_short_name(t));
    }
    return modules;
}

ProductShape lora_product_shape(const ModelConfig& config, LoraTarget t) {
    const int C = config.channels, H = config.mlp_hidden();
    const int KV = config.kv_heads() * config.head_size();
    const bool gated = config.arch.mlp == MlpKind::SwiGlu;
    switch (t) {
        case LoraTarget::CAttn:
            return {C, config.qkv_width(), 0};
        case LoraTarget::AttnCProj:
        case LoraTarget::OProj:
            return {C, C, 0};
        case LoraTarget::CFc:
            return {C, config.fc_width(), 0};
        case LoraTarget::MlpCProj:
        case LoraTarget::DownProj:
            return {H, C, 0};
        case LoraTarget::QProj:
            return {C, C, 0};
        case LoraTarget::KProj:
            return {C, KV, C};
        case LoraTarget::VProj:
            return {C, KV, C + KV};
        case LoraTarget::GateProj:
            return {C, H, 0};
        case LoraTarget::UpProj:
            return {C, H, gated ? H : 0};  // up after gate in fcw; all of it without a gate
    }
    throw std::invalid_argument("lora_product_shape: unknown target");
}

LoraLayout::LoraLayout(const ModelConfig& model, const LoraConfig& lora)
    : model_(model), lora_(lora) {
    const LoraModules modules = lora_modules(model);
    for (int i = 0; i < kLoraTargets; ++i) {
        const auto t = static_cast<LoraTarget>(i);
        if (lora.adapts(t) && !offers(modules, t)) {
            throw InputError("LoRA: " + std::string(lora_target_short_name(t)) +
                             " is not a projection of this model (" + describe(model.arch) + ")");
        }
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
    double matmul_params = static_cast<double>(config.padded_vocab_size) * C;  // the head
    for (const TensorSpec& spec : tensor_table(config)) {
        if (spec.per_layer && spec.rows > 1) {
            matmul_params += L * static_cast<double>(spec.rows) * static_cast<double>(spec.cols);
        }
    }
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
// Layer l's rows of target t in its base weight (out, in) += scale * B (out, r) @ A (r, in):
// merge_lora's one product, shared with merged_lora_pieces so that both give bitwise the same.
// `weight` is layer l's whole base weight (a row block's rows start at its first_row).
void add_lora_update(float* weight, const LoraAdapter& adapter, const ModelConfig& config, int l,
                     LoraTarget t) {
    const auto i = static_cast<std::size_t>(t);
    const LoraLayerView<const float> view = adapter.layer(l);
    const ProductShape s = lora_product_shape(config, t);
    const int r = adapter.config.rank;
    gemm_nn(s.out, s.in, r, adapter.config.scale(), view.b[i], r, view.a[i], s.in, 1.0f,
            weight + static_cast<std::size_t>(s.first_row) * static_cast<std::size_t>(s.in), s.in);
}

// Layer l's base weight `tensor` += every adapted target's update on it, in the targets' order.
void add_lora_updates(float* weight, const LoraAdapter& adapter, const ModelConfig& config, int l,
                      ParamTensor tensor) {
    for (int i = 0; i < kLoraTargets; ++i) {
        const auto t = static_cast<LoraTarget>(i);
        if (adapter.config.adapts(t) && lora_target_weight(t) == tensor) {
            add_lora_update(weight, adapter, config, l, t);
        }
    }
}

// Whether any adapted target's base weight is `tensor`.
bool adapts_weight(const LoraConfig& config, ParamTensor tensor) {
    for (int i = 0; i < kLoraTargets; ++i) {
        const auto t = static_cast<LoraTarget>(i);
        if (config.adapts(t) && lora_target_weight(t) == tensor) return true;
    }
    return false;
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
    for (const TensorSpec& spec : tensor_table(config)) {
        // A bf16-only base converts every layer matrix, adapted or not, in the buffer.
        const bool in_buffer =
            adapts_weight(*lora, spec.id) || (layer_matrices_bf16_only && is_layer_matrix(spec.id));
        if (!in_buffer || !spec.per_layer) continue;
        largest = std::max(
            largest, static_cast<std::size_t>(spec.rows) * static_cast<std::size_t>(spec.cols));
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
        const bool adapted = adapts_weight(adapter.config, tensor);
        const bool from_twin = bf16_only && is_layer_matrix(tensor);
        if (!adapted && !from_twin) {
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
            if (adapted) add_lora_updates(merged.data(), adapter, base.config, l, tensor);
            emit(merged);
        }
    }
}

void lora_forward(float* out, float* u, const float* inp, const float* A, const float* B,
                  float scale, int N, int C, int OC, int r, int ldo) {
    gemm_nt(N, r, C, 1.0f, inp, C, A, C, 0.0f, u, r);      // u = inp @ A^T
    gemm_nt(N, OC, r, scale, u, r, B, r, 1.0f, out, ldo);  // out += scale * u @ B^T
}

void lora_backward(float* dinp, float* dA, float* dB, float* u, float* v, const float* dout,
                   const float* inp, const float* A, const float* B, float scale, int N, int C,
                   int OC, int r, int ldo) {
    gemm_nt(N, r, C, 1.0f, inp, C, A, C, 0.0f, u, r);       // u = inp @ A^T (as forward)
    gemm_nn(N, r, OC, scale, dout, ldo, B, r, 0.0f, v, r);  // v = scale * dout @ B
    if (dinp != nullptr) gemm_nn(N, C, r, 1.0f, v, r, A, C, 1.0f, dinp, C);  // dinp += v @ A
    gemm_tn(r, C, N, 1.0f, v, r, inp, C, 1.0f, dA, C);                       // dA += v^T @ inp
    gemm_tn(OC, r, N, scale, dout, ldo, u, r, 1.0f, dB, r);  // dB += scale * dout^T @ u
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
                  float scale, int N, int C, int OC, int r, int ldo,
                  const LoraInputDropout& dropout) {
    if (!dropout.mask.active()) {
        lora_forward(out, u, inp, A, B, scale, N, C, OC, r, ldo);
        return;
    }
    lora_forward(out, u, dropped_input(inp, N, C, dropout), A, B, scale, N, C, OC, r, ldo);
}

void lora_backward(float* dinp, float* dA, float* dB, float* u, float* v, const float* dout,
                   const float* inp, const float* A, const float* B, float scale, int N, int C,
                   int OC, int r, int ldo, const LoraInputDropout& dropout) {
    if (!dropout.mask.active()) {
        lora_backward(dinp, dA, dB, u, v, dout, inp, A, B, scale, N, C, OC, r, ldo);
        return;
    }
    // Regenerated rather than stored: the mask is a function of its key, so this is forward's.
    float* dropped = dropped_input(inp, N, C, dropout);
    lora_backward(nullptr, dA, dB, u, v, dout, dropped, A, B, scale, N, C, OC, r, ldo);
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
