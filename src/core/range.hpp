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

}  // namespace gpt2
