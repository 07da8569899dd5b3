#include "optim/optimizer.hpp"

#include "optim/adamw.hpp"
#include "optim/muon.hpp"

namespace gpt2 {

std::string_view optimizer_name(OptimizerKind kind) {
    return kind == OptimizerKind::Muon ? "muon" : "adamw";
}

std::optional<OptimizerKind> parse_optimizer_kind(std::string_view name) {
    if (name == "adamw") return OptimizerKind::AdamW;
    if (name == "muon") return OptimizerKind::Muon;
    return std::nullopt;
}

float clip_scale(double norm, float max_norm) {
    if (max_norm <= 0.0f) return 1.0f;
    const double coef = static_cast<double>(max_norm) / (norm + 1e-6);
    return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

std::vector<Range> indivisible_ranges(OptimizerKind kind, const ParameterLayout& layout) {
    std::vector<Range> ranges;
    if (kind != OptimizerKind::Muon) return ranges;
    for (const MuonMatrix& mat : muon_matrices(layout))
        ranges.push_back({mat.offset, mat.offset + mat.size()});
    return ranges;
}

std::size_t optimizer_state_bytes(OptimizerKind kind, const ParameterLayout& layout) {
    std::size_t floats = 2 * layout.total();
    if (kind == OptimizerKind::Muon) {
        for (const MuonMatrix& mat : muon_matrices(layout))
            floats -= mat.size();  // its v: never written, never resident
    }
    return floats * sizeof(float);
}

std::size_t Optimizer::resident_bytes(const ParameterLayout& layout) const {
    std::size_t floats = 2 * state.m.size();
    const Range mine{state.first, state.first + state.m.size()};
    for (const Range& whole : indivisible_ranges(kind(), layout)) {
        if (whole.begin >= mine.begin && whole.end <= mine.end) floats -= whole.end - whole.begin;
    }
    return floats * sizeof(float);
}

std::unique_ptr<Optimizer> make_optimizer(OptimizerKind kind, std::size_t count, std::size_t first,
                                          const MuonSettings& muon) {
    if (kind == OptimizerKind::Muon) return std::make_unique<Muon>(count, first, muon);
    return std::make_unique<AdamW>(count, first);
}

}  // namespace gpt2
