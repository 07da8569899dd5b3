#include "model/architecture.hpp"

#include <sstream>
#include <vector>

namespace gpt2 {

namespace {
template <typename Kind, std::size_t N>
std::optional<Kind> kind_of(std::string_view name, const std::array<std::string_view, N>& names) {
    for (std::size_t i = 0; i < N; ++i) {
        if (names[i] == name) return static_cast<Kind>(i);
    }
    return std::nullopt;
}
constexpr std::array<std::string_view, 2> kNormNames = {"layernorm", "rmsnorm"};
constexpr std::array<std::string_view, 2> kPositionNames = {"learned", "rotary"};
constexpr std::array<std::string_view, 3> kMlpNames = {"gelu", "swiglu", "relu2"};
}  // namespace

std::string_view norm_name(NormKind kind) {
    return kNormNames.at(static_cast<std::size_t>(kind));
}
std::string_view position_name(PositionKind kind) {
    return kPositionNames.at(static_cast<std::size_t>(kind));
}
std::string_view mlp_name(MlpKind kind) {
    return kMlpNames.at(static_cast<std::size_t>(kind));
}
std::optional<NormKind> norm_of(std::string_view name) {
    return kind_of<NormKind>(name, kNormNames);
}
std::optional<PositionKind> position_of(std::string_view name) {
    return kind_of<PositionKind>(name, kPositionNames);
}
std::optional<MlpKind> mlp_of(std::string_view name) {
    return kind_of<MlpKind>(name, kMlpNames);
}

std::string describe(const Architecture& a) {
    const Architecture gpt2;
    if (a == gpt2) return "GPT-2";
    std::ostringstream out;
    std::string_view separator;
    const auto part = [&](const auto&... pieces) {
        out << separator;
        (out << ... << pieces);
        separator = ", ";
    };
    if (a.norm != gpt2.norm || !a.norm_gains) {
        part(norm_name(a.norm), a.norm_gains ? "" : " without gains");
    }
    if (a.norm_eps != gpt2.norm_eps) part("norm eps ", a.norm_eps);
    if (a.positions == PositionKind::Rotary) part("rotary theta ", a.rope_theta);
    if (a.mlp != gpt2.mlp || a.mlp_hidden != 0) {
        if (a.mlp_hidden > 0) {
            part(mlp_name(a.mlp), " ", a.mlp_hidden);
        } else {
            part(mlp_name(a.mlp));
        }
    }
    if (!a.biases) part("no biases");
    if (a.kv_heads > 0) part(a.kv_heads, " kv heads");
    if (a.qk_norm) part("QK-norm");
    if (!a.tied_head) part("untied head");
    if (a.zero_init_projections) part("zero-initialized projections");
    return out.str();
}

}  // namespace gpt2
