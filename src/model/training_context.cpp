#include "model/training_context.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>

#include "ops/attention.hpp"
#include "ops/kernels.hpp"
#include "ops/lm_head.hpp"

namespace gpt2 {

namespace {
// Rows of logits materialised at once: the (B*T x Vp) logits never exist in full. bf16's LM head
// (ops/lm_head.hpp) takes 1024: each chunk adds its share into all of dwte (154 MB at GPT-2's
// shapes), and a quarter of those passes made a bf16 step about 2% faster (fp32: no faster).
constexpr int kLogitsChunkRows = 256;
constexpr int kLogitsChunkRowsBf16 = 1024;

// Carves named arrays out of one allocation, each on a 64-byte boundary, and totals the bytes of
// each named part (several arrays may share a part's name).
class ArenaPlan {
  public:
    std::size_t reserve(std::string_view part, std::size_t count) {
        const std::size_t offset = size_;
        const std::size_t floats = (count + 15) / 16 * 16;
        size_ += floats;
        add(part, floats * sizeof(float));
        return offset;
    }
    void add(std::string_view part, std::size_t bytes) {
        const auto it = std::find_if(parts_.begin(), parts_.end(),
                                     [&](const ContextPart& p) { return p.name == part; });
        if (it == parts_.end()) {
            parts_.push_back(ContextPart{part, bytes});
        } else {
            it->bytes += bytes;
        }
    }
    [[nodiscard]] std::size_t size() const { return size_; }
    [[nodiscard]] const std::vector<ContextPart>& parts() const { return parts_; }

  private:
    std::size_t size_ = 0;
    std::vector<ContextPart> parts_;
};

// Where everything of a context lies in its arena, and its bf16 operands.
struct ContextLayout {
    ThreadLocalTrainingContext::Activations acts{};  // null until planned over an arena
    ThreadLocalTrainingContext::Scratch scratch{};
    ArenaPlan plan;
    std::size_t bf16_inputs = 0, bf16_gradients = 0, bf16_attention = 0, bf16_qkv = 0;  // elements
    int logits_rows = 0;
    int stored_layers = 0;
};

// Plans the arrays in order; with `base` (an arena of plan.size() floats) also points them into it.
ContextLayout plan_context(const ModelConfig& c, int max_batch, int seq_len, Precision precision,
                           Recompute recompute, float* base = nullptr) {
    ContextLayout out;
    const auto L = static_cast<std::size_t>(c.num_layers);
    const auto C = static_cast<std::size_t>(c.channels);
    const auto N = static_cast<std::size_t>(max_batch) * static_cast<std::size_t>(seq_len);
    out.stored_layers = recompute == Recompute::Layers ? std::min(c.num_layers, 1) : c.num_layers;
    const auto S = static_cast<std::size_t>(out.stored_layers);
    out.logits_rows = static_cast<int>(std::min<std::size_t>(
        N, precision == Precision::Bf16 ? kLogitsChunkRowsBf16 : kLogitsChunkRows));
    // The block's widths: qkv's row (GPT-2: 3C), the MLP's first product and its activation
    // (GPT-2: 4C both).
    const auto W = static_cast<std::size_t>(c.qkv_width());
    const auto F = static_cast<std::size_t>(c.fc_width());
    const auto H = static_cast<std::size_t>(c.mlp_hidden());
    ArenaPlan& plan = out.plan;
    const auto at = [&](std::string_view part, std::size_t count) -> float* {
        const std::size_t offset = plan.reserve(part, count);
        return base != nullptr ? base + offset : nullptr;
    };
    auto& a = out.acts;
    a.encoded = at("layer inputs", N * C);
    a.encoded_rstd = c.arch.embedding_norm ? at("layer inputs", N) : nullptr;
    a.residual3 = at("layer inputs", L * N * C);
    // Attention in bf16 only ever reads q, k and v rounded (GPT-2's: the qkv product rounds them
    // itself). QK-norm's backward reads its fp32 outputs, which are kept for it.
    const bool qkv_in_bf16 = attention_in_bf16(precision);
    if (qkv_in_bf16) {
        out.bf16_qkv = S * N * W;
        plan.add("qkv", out.bf16_qkv * sizeof(Bf16));
    }
    if (!qkv_in_bf16 || c.arch.qk_norm) a.qkv = at("qkv", S * N * W);
    const auto qk_heads = static_cast<std::size_t>(c.num_heads + c.kv_heads());
    a.qk_rstd = c.arch.qk_norm ? at("qkv", S * N * qk_heads) : nullptr;
    a.atty = at("attention output", S * N * C);
    a.att_lse = at("attention log-sum-exp", S * N * static_cast<std::size_t>(c.num_heads));
    a.residual2 = at("residual2", S * N * C);
    a.fch = at("fch", S * N * F);
    a.ln1_mean = at("LayerNorm statistics", S * N);
    a.ln1_rstd = at("LayerNorm statistics", S * N);
    a.ln2_mean = at("LayerNorm statistics", S * N);
    a.ln2_rstd = at("LayerNorm statistics", S * N);
    a.lnf = at("final LayerNorm and losses", N * C);
    a.lnf_mean = at("final LayerNorm and losses", N);
    a.lnf_rstd = at("final LayerNorm and losses", N);
    a.losses = at("final LayerNorm and losses", N);
    auto& x = out.scratch;
    x.normalized = at("recompute scratch (LayerNorm, GELU)", N * C);
    x.gelu = at("recompute scratch (LayerNorm, GELU)", N * H);
    x.dresidual = at("backward scratch", N * C);
    x.dchannels = at("backward scratch", N * C);
    x.dqkv = at("backward scratch", N * W);
    x.dfch = at("backward scratch", N * F);
    x.dact = c.arch.mlp == MlpKind::SwiGlu ? at("backward scratch", N * H) : nullptr;
    const int hs = c.channels / std::max(c.num_heads, 1);
    x.attention = at("attention panels", precision == Precision::Bf16
                                             ? attention_bf16_scratch_floats(seq_len, hs)
                                             : attention_scratch_floats(seq_len));
    const auto logits_floats = static_cast<std::size_t>(out.logits_rows) * c.padded_vocab_size;
    x.logits =
        at("LM head chunk", precision == Precision::Bf16
                                ? lm_head_bf16_scratch_floats(out.logits_rows, c.padded_vocab_size)
                                : logits_floats);
    if (precision == Precision::Bf16) {
        // The LM head's operands (lm_head_bf16_scratch_pieces) fit in these two.
        out.bf16_inputs = N * std::max(4 * C, H);
        out.bf16_gradients =
            std::max({N * 4 * C, N * F, N * W,
                      static_cast<std::size_t>(out.logits_rows) * kLmHeadVocabBlock});
        out.bf16_attention = attention_bf16_scratch_pieces(seq_len, hs);
        plan.add("bf16 operands",
                 (out.bf16_inputs + out.bf16_gradients + out.bf16_attention) * sizeof(Bf16));
    }
    return out;
}

}  // namespace

bool attention_in_bf16(Precision precision) {
    return precision == Precision::Bf16 && bf16_attention_pays();
}

std::vector<ContextPart> context_parts(const ModelConfig& config, int max_batch, int seq_len,
                                       Precision precision, Recompute recompute) {
    return plan_context(config, max_batch, seq_len, precision, recompute).plan.parts();
}

std::size_t context_bytes(const ModelConfig& config, int max_batch, int seq_len,
                          Precision precision, Recompute recompute) {
    std::size_t total = 0;
    for (const ContextPart& part : context_parts(config, max_batch, seq_len, precision, recompute))
        total += part.bytes;
    return total;
}

ThreadLocalTrainingContext::ThreadLocalTrainingContext(const ModelConfig& c, int max_batch,
                                                       int seq_len, Precision precision,
                                                       Recompute recompute)
    : max_batch_(max_batch), seq_len_(seq_len), recompute_(recompute) {
    if (c.arch.positions == PositionKind::Rotary) {
        rotary = rotary_table(seq_len, c.head_size(), c.arch.rope_theta);
    }
    arena_ =
        AlignedBuffer<float>(plan_context(c, max_batch, seq_len, precision, recompute).plan.size());
    const ContextLayout layout =
        plan_context(c, max_batch, seq_len, precision, recompute, arena_.data());
    stored_layers_ = layout.stored_layers;
    logits_rows = layout.logits_rows;
    acts = layout.acts;
    scratch = layout.scratch;
    if (layout.bf16_qkv > 0) {
        bf16_qkv = AlignedBuffer<Bf16>(layout.bf16_qkv);
        acts.qkv_bf16 = bf16_qkv.data();
    }
    if (precision == Precision::Bf16) {
        bf16_inputs = AlignedBuffer<Bf16>(layout.bf16_inputs);
        bf16_gradients = AlignedBuffer<Bf16>(layout.bf16_gradients);
        bf16_attention = AlignedBuffer<Bf16>(layout.bf16_attention);
    }
}

namespace {
// Per-layer floats of each of the twelve layer tensors, in LayerView order (ln1w .. fcprojb).
std::array<std::size_t, kLayerTensors> layer_tensor_floats(const ModelConfig& config) {
    const ParameterLayout layout(config);
    const auto L = static_cast<std::size_t>(std::max(config.num_layers, 1));
    std::array<std::size_t, kLayerTensors> sizes{};
    for (int i = 0; i < kLayerTensors; ++i)
        sizes[static_cast<std::size_t>(i)] = layout.size(layer_tensor(i)) / L;
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
    const std::array<std::size_t, kLayerTensors> sizes = layer_tensor_floats(config);
    std::array<float*, kLayerTensors> at{};
    for (std::size_t i = 0; i < sizes.size(); ++i) {
        at[i] = sizes[i] > 0 ? slot : nullptr;  // a tensor the configuration lacks: null
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
