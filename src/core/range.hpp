// A contiguous range [begin, end) of items, and the near-equal share of n items that worker w of W
// takes: how work and gradient slices are divided between workers and ranks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

namespace gpt2 {

struct Range {
    std::size_t begin;
    std::size_t end;
};

[[nodiscard]] inline Range split_range(std::size_t n, int w, int W) {
    const std::size_t base = n / static_cast<std::size_t>(W);
    const std::size_t extra = n % static_cast<std::size_t>(W);
    const auto uw = static_cast<std::size_t>(w);
    const std::size_t begin = uw * base + std::min(uw, extra);
    return Range{begin, begin + base + (uw < extra ? 1 : 0)};
}

// Part `part` of `parts` near-equal shares of n items that begin on multiples of `align` (the
// last share ends at n): ranks' gradient slices, so that no norm block is cut between two ranks.
[[nodiscard]] inline Range split_aligned(std::size_t n, int part, int parts, std::size_t align) {
    const std::size_t units = (n + align - 1) / align;
    const Range r = split_range(units, part, parts);
    return Range{std::min(r.begin * align, n), std::min(r.end * align, n)};
}

// `parts` slices of n items in order, each beginning on a multiple of `align` (the last ending at
// n), such that a boundary never falls strictly inside one of `whole` (sorted, disjoint ranges that
// one slice must hold entirely: an optimizer's matrices); such a boundary moves to the nearer
// multiple of `align` outside every one of them (a slice may then be empty). Without `weights`
// the slices hold near-equal counts (split_aligned's); with them, near-equal costs, an item of
// whole[i] costing weights[i] and any other 1.
[[nodiscard]] inline std::vector<Range> slices_between(std::size_t n, int parts, std::size_t align,
                                                       std::span<const Range> whole,
                                                       std::span<const double> weights = {}) {
    const auto inside = [&](std::size_t b) -> const Range* {
        for (const Range& r : whole) {
            if (r.begin < b && b < r.end) return &r;
        }
        return nullptr;
    };
    const auto move = [&](std::size_t b, bool down) {
        while (const Range* r = inside(b))
            b = down ? r->begin / align * align : std::min(n, (r->end + align - 1) / align * align);
        return b;
    };
    // The item where the cumulative cost reaches `target`.
    const auto position_of = [&](double target) {
        double cost = 0.0;
        std::size_t at = 0;
        for (std::size_t i = 0; i < whole.size(); ++i) {
            const auto gap = static_cast<double>(whole[i].begin - at);
            if (cost + gap >= target) return at + static_cast<std::size_t>(target - cost);
            cost += gap;
            const double inner = static_cast<double>(whole[i].end - whole[i].begin) * weights[i];
            if (cost + inner >= target) {
                return whole[i].begin + static_cast<std::size_t>((target - cost) / weights[i]);
            }
            cost += inner;
            at = whole[i].end;
        }
        return std::min(n, at + static_cast<std::size_t>(target - cost));
    };
    double total = static_cast<double>(n);
    for (std::size_t i = 0; i < weights.size(); ++i)
        total += static_cast<double>(whole[i].end - whole[i].begin) * (weights[i] - 1.0);
    std::vector<Range> slices;
    std::size_t begin = 0;
    for (int part = 0; part < parts; ++part) {
        std::size_t end = split_aligned(n, part, parts, align).end;
        if (!weights.empty() && part + 1 < parts) {
            const std::size_t at = position_of(total * (part + 1) / parts);
            end = std::min(n, (at + align / 2) / align * align);
        }
        if (inside(end) != nullptr) {
            const std::size_t down = move(end, true);
            const std::size_t up = move(end, false);
            end = end - down <= up - end ? down : up;
        }
        end = std::max(end, begin);
        slices.push_back(Range{begin, end});
        begin = end;
    }
    return slices;
}

}  // namespace gpt2
