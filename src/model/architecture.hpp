// The architecture as data: what a model's block is made of (norm, positions, MLP, biases, head,
// key/value heads, QK-norm, a norm on the embeddings) beside its dimensions, and the versioned
// record of both that checkpoints, resume states and the broadcast carry.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace gpt2 {

enum class NormKind { LayerNorm, RmsNorm };
enum class PositionKind { Learned, Rotary };
// GPT-2's tanh-approximated GELU, Llama's SwiGLU (silu(gate) * up), the speedrun's ReLU^2.
enum class MlpKind { GeluTanh, SwiGlu, ReluSquared };

// What varies between GPT-2 and the families after it. The defaults are GPT-2's: every field at
// its default is a GPT-2 model, whose files and bits are those of the versions before this one.
struct Architecture {
    NormKind norm = NormKind::LayerNorm;
    bool norm_gains = true;  // a learned gain per channel (RMSNorm without: the speedrun's)
    float norm_eps = 1e-5f;
    PositionKind positions = PositionKind::Learned;
    float rope_theta = 10000.0f;  // rotary only
    MlpKind mlp = MlpKind::GeluTanh;
    int mlp_hidden = 0;     // the MLP's hidden width; 0: 4 x channels
    bool biases = true;     // on every product and (LayerNorm) every norm
    bool tied_head = true;  // the LM head is the token embedding
    int kv_heads = 0;       // key/value heads (grouped-query attention); 0: as many as query heads
    bool qk_norm = false;   // queries and keys RMS-normalized per head (no gain) before rotary
    bool embedding_norm = false;  // the embeddings RMS-normalized (no gain) before the first block
    bool zero_init_projections = false;  // the residual stream's projections start at zero
    friend bool operator==(const Architecture&, const Architecture&) = default;
};

[[nodiscard]] std::string_view norm_name(NormKind kind);          // "layernorm", "rmsnorm"
[[nodiscard]] std::string_view position_name(PositionKind kind);  // "learned", "rotary"
[[nodiscard]] std::string_view mlp_name(MlpKind kind);            // "gelu", "swiglu", "relu2"
[[nodiscard]] std::optional<NormKind> norm_of(std::string_view name);
[[nodiscard]] std::optional<PositionKind> position_of(std::string_view name);
[[nodiscard]] std::optional<MlpKind> mlp_of(std::string_view name);

// "GPT-2", or the fields that differ from it ("rmsnorm, rotary theta 10000, swiglu 1536, no
// biases, 3 kv heads, untied head").
[[nodiscard]] std::string describe(const Architecture& arch);

// The fields `spec` sets over `a`, as --arch takes them: "key=value,..." (architecture_field_keys
// lists the keys); UsageError naming `flag` and the item for an unknown key or a bad value. The
// result is checked with the dimensions by validate_config.
[[nodiscard]] Architecture with_fields(Architecture a, std::string_view spec,
                                       std::string_view flag);
[[nodiscard]] std::string_view architecture_field_keys();

}  // namespace gpt2
