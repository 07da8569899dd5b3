#include "model/architecture.hpp"

#include <charconv>
#include <cmath>
#include <sstream>
#include <type_traits>
#include <vector>

#include "core/error.hpp"

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
    if (a.embedding_norm) part("normed embeddings");
    if (!a.tied_head) part("untied head");
    if (a.zero_init_projections) part("zero-initialized projections");
    return out.str();
}

std::string_view architecture_field_keys() {
    return "norm=layernorm|rmsnorm, norm-gains=on|off, norm-eps=E, positions=learned|rotary, "
           "rope-theta=T, mlp=gelu|swiglu|relu2, mlp-hidden=N (0: 4C), biases=on|off, "
           "head=tied|untied, kv-heads=N (0: all), qk-norm=on|off, embedding-norm=on|off, "
           "zero-init=on|off";
}

Architecture with_fields(Architecture a, std::string_view spec, std::string_view flag) {
    std::string_view rest = spec;
    while (!rest.empty()) {
        const std::size_t comma = rest.find(',');
        const std::string_view item = rest.substr(0, comma);
        rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
        const std::size_t eq = item.find('=');
        const std::string_view key = item.substr(0, eq);
        const std::string_view value =
            eq == std::string_view::npos ? std::string_view{} : item.substr(eq + 1);
        const auto fail = [&](const std::string& why) -> void {
            throw UsageError(std::string(flag) + ": '" + std::string(item) + "' " + why +
                             " (keys: " + std::string(architecture_field_keys()) + ")");
        };
        const auto on_off = [&]() {
            if (value != "on" && value != "off") fail("takes on or off");
            return value == "on";
        };
        const auto number = [&]<typename T>(T lowest, const char* what) {
            T parsed{};
            const char* end = value.data() + value.size();
            const auto [stop, error] = std::from_chars(value.data(), end, parsed);
            bool finite = true;
            if constexpr (std::is_floating_point_v<T>) finite = std::isfinite(parsed);
            if (error != std::errc{} || stop != end || !finite || !(parsed >= lowest)) fail(what);
            return parsed;
        };
        const auto kind = [&](const auto& parsed) {
            if (!parsed) fail("is not one of its kinds");
            return *parsed;
        };
        if (eq == std::string_view::npos) fail("is not key=value");
        if (key == "norm")
            a.norm = kind(norm_of(value));
        else if (key == "norm-gains")
            a.norm_gains = on_off();
        else if (key == "norm-eps")
            a.norm_eps = number(0.0f, "needs a number >= 0");
        else if (key == "positions")
            a.positions = kind(position_of(value));
        else if (key == "rope-theta")
            a.rope_theta = number(1.0f, "needs a number > 1");
        else if (key == "mlp")
            a.mlp = kind(mlp_of(value));
        else if (key == "mlp-hidden")
            a.mlp_hidden = number(0, "needs a whole number >= 0");
        else if (key == "biases")
            a.biases = on_off();
        else if (key == "head") {
            if (value != "tied" && value != "untied") fail("takes tied or untied");
            a.tied_head = value == "tied";
        } else if (key == "kv-heads")
            a.kv_heads = number(0, "needs a whole number >= 0");
        else if (key == "qk-norm")
            a.qk_norm = on_off();
        else if (key == "embedding-norm")
            a.embedding_norm = on_off();
        else if (key == "zero-init")
            a.zero_init_projections = on_off();
        else
            fail("names no field");
    }
    return a;
}

}  // namespace gpt2
