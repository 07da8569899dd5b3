#include "ops/sum_of_squares.hpp"

#include <array>
#include <cstddef>

namespace gpt2 {

double sum_of_squares(std::span<const float> x) {
    // Sixteen float partial sums per block: independent lanes the compiler can keep in one vector
    // register (one running sum would be a chain of dependent adds, several times slower than
    // reading the memory); double across blocks keeps 124M terms accurate.
    constexpr std::size_t kLanes = 16;
    constexpr std::size_t kBlock = 1024;
    double total = 0.0;
    std::size_t start = 0;
    for (; start + kBlock <= x.size(); start += kBlock) {
        std::array<float, kLanes> lanes{};
        for (std::size_t i = start; i < start + kBlock; i += kLanes) {
            for (std::size_t k = 0; k < kLanes; ++k)
                lanes[k] += x[i + k] * x[i + k];
        }
        float block = 0.0f;
        for (const float lane : lanes)
            block += lane;
        total += block;
    }
    float tail = 0.0f;
    for (std::size_t i = start; i < x.size(); ++i)
        tail += x[i] * x[i];
    return total + tail;
}

}  // namespace gpt2
