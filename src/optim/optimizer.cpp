#include "optim/optimizer.hpp"

#include <algorithm>
#include <array>
#include <stdexcept>
#include <string>

#include "optim/adamw.hpp"
#include "optim/muon.hpp"

namespace gpt2 {

namespace {
// Every optimizer, once: its kind, its flag value, how to make one for a range, and the ranges a
// rank must update whole (null: none). A third optimizer is its own file in optim/ and a row here
// (and a value of OptimizerKind); --optimizer lists the names from this table.
struct OptimizerEntry {
    OptimizerKind kind;
    std::string_view name;
    std::unique_ptr<Optimizer> (*make)(std::size_t count, std::size_t first,
                                       const MuonSettings& muon);
    std::vector<Range> (*whole)(const ParameterLayout& layout);
};

std::vector<Range> muon_whole(const ParameterLayout& layout) {
    std::vector<Range> ranges;
    for (const MuonMatrix& mat : muon_matrices(layout))
        ranges.push_back({mat.offset, mat.offset + mat.size()});
    return ranges;
}

constexpr std::array kOptimizers = {
    OptimizerEntry{OptimizerKind::AdamW, "adamw",
                   [](std::size_t count, std::size_t first,
                      const MuonSettings&) -> std::unique_ptr<Optimizer> {
                       return std::make_unique<AdamW>(count, first);
                   },
                   nullptr},
    OptimizerEntry{OptimizerKind::Muon, "muon",
                   [](std::size_t count, std::size_t first,
                      const MuonSettings& muon) -> std::unique_ptr<Optimizer> {
                       return std::make_unique<Muon>(count, first, muon);
                   },
                   muon_whole},
};

const OptimizerEntry& entry(OptimizerKind kind) {
    for (const OptimizerEntry& e : kOptimizers) {
        if (e.kind == kind) return e;
    }
    throw std::invalid_argument("no optimizer of kind " +
                                std::to_string(static_cast<std::uint32_t>(kind)));
}
}  // namespace

std::string_view optimizer_name(OptimizerKind kind) {
    return entry(kind).name;
}

std::optional<OptimizerKind> parse_optimizer_kind(std::string_view name) {
    for (const OptimizerEntry& e : kOptimizers) {
        if (e.name == name) return e.kind;
    }
    return std::nullopt;
}

std::optional<OptimizerKind> optimizer_kind_of(std::uint32_t number) {
    for (const OptimizerEntry& e : kOptimizers) {
        if (static_cast<std::uint32_t>(e.kind) == number) return e.kind;
    }
    return std::nullopt;
}

std::vector<std::string> optimizer_names() {
    std::vector<std::string> names;
    for (const OptimizerEntry& e : kOptimizers)
        names.emplace_back(e.name);
    return names;
}

float clip_scale(double norm, float max_norm) {
    if (max_norm <= 0.0f) return 1.0f;
    const double coef = static_cast<double>(max_norm) / (norm + 1e-6);
    return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

std::vector<Range> indivisible_ranges(OptimizerKind kind, const ParameterLayout& layout) {
    const OptimizerEntry& e = entry(kind);
    return e.whole != nullptr ? e.whole(layout) : std::vector<Range>{};
}

std::vector<double> indivisible_costs(OptimizerKind kind, const ParameterLayout& layout) {
    std::vector<double> costs;
    if (kind != OptimizerKind::Muon) return costs;
    for (const MuonMatrix& mat : muon_matrices(layout))
        costs.push_back(1.0 + 0.1 * newton_schulz_flops(mat) / static_cast<double>(mat.size()));
    return costs;
}

double muon_update_flops(const ParameterLayout& layout) {
    double flops = 0.0;
    for (const MuonMatrix& mat : muon_matrices(layout))
        flops += newton_schulz_flops(mat);
    return flops;
}

std::size_t optimizer_scratch_bytes(OptimizerKind kind, const ParameterLayout& layout,
                                    bool bf16_products) {
    if (kind != OptimizerKind::Muon) return 0;
    std::size_t largest = 0;
    for (const MuonMatrix& mat : muon_matrices(layout)) {
        largest = std::max(largest, muon_scratch_floats(mat) * sizeof(float) +
                                        (bf16_products ? muon_scratch_bf16s(mat) * 2 : 0));
    }
    return largest;
}

std::size_t optimizer_state_bytes(OptimizerKind kind, const ParameterLayout& layout) {
    // Two floats per parameter, one where a matrix is updated whole (its v: never written, never
    // resident).
    std::size_t floats = 2 * layout.total();
    for (const Range& whole : indivisible_ranges(kind, layout))
        floats -= whole.end - whole.begin;
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
    return entry(kind).make(count, first, muon);
}

}  // namespace gpt2
