// A contiguous range [begin, end) of items, and the near-equal share of n items that worker w of W
// takes: how work and gradient slices are divided between workers and ranks.
#pragma once

#include <algorithm>
#include <cstddef>

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

}  // namespace gpt2
