// The sum of squares of a float array, in float lanes per 1024-element block and double across
// blocks: the gradient's norm (the same bits wherever it is called: compiled once, here).
#pragma once

#include <span>

namespace gpt2 {

// Sum of squares, accumulated in double across blocks of 1024 (sixteen float lanes within each).
[[nodiscard]] double sum_of_squares(std::span<const float> x);

}  // namespace gpt2
