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

// `parts` slices of n items in order, as split_aligned's, except that a boundary never falls
// strictly inside one of `whole` (sorted, disjoint ranges that one slice must hold entirely: an
// optimizer's matrices): such a boundary moves to the nearer multiple of `align` outside every
// one of them (a slice may then be empty).
[[nodiscard]] inline std::vector<Range> slices_between(std::size_t n, int parts, std::size_t align,
                                                       std::span<const Range> whole) {
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
    std::vector<Range> slices;
    std::size_t begin = 0;
    for (int part = 0; part < parts; ++part) {
        std::size_t end = split_aligned(n, part, parts, align).end;
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
