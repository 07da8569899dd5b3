// Helpers shared by the tests: element-wise comparison with a clear report of the worst element.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <span>
#include <string>

namespace gpt2::test {

// Passes when |a - e| <= atol + rtol * |e| everywhere; reports the worst element otherwise.
inline ::testing::AssertionResult all_close(std::span<const float> actual,
                                            std::span<const float> expected, double rtol,
                                            double atol) {
    if (actual.size() != expected.size()) {
        return ::testing::AssertionFailure()
               << "size " << actual.size() << " != expected " << expected.size();
    }
    std::size_t worst = 0;
    double worst_excess = -1.0;
    for (std::size_t i = 0; i < actual.size(); ++i) {
        const double a = actual[i], e = expected[i];
        const double excess = std::abs(a - e) - (atol + rtol * std::abs(e));
        if (!std::isfinite(a) || excess > worst_excess) {
            worst_excess = std::isfinite(a) ? excess : 1e30;
            worst = i;
        }
    }
    if (worst_excess > 0.0) {
        return ::testing::AssertionFailure()
               << "element " << worst << ": " << actual[worst] << " vs expected " << expected[worst]
               << " (rtol " << rtol << ", atol " << atol << ")";
    }
    return ::testing::AssertionSuccess();
}

// Passes when ||actual - expected|| <= rtol * ||expected|| (whole-tensor relative error: immune to
// elements whose true value is ~0, such as the key bias, whose gradient vanishes exactly).
inline ::testing::AssertionResult norm_close(std::span<const float> actual,
                                             std::span<const float> expected, double rtol) {
    if (actual.size() != expected.size()) {
        return ::testing::AssertionFailure()
               << "size " << actual.size() << " != expected " << expected.size();
    }
    double diff = 0.0, norm = 0.0;
    for (std::size_t i = 0; i < actual.size(); ++i) {
        const double d = static_cast<double>(actual[i]) - expected[i];
        diff += d * d;
        norm += static_cast<double>(expected[i]) * expected[i];
    }
    if (!(std::sqrt(diff) <= rtol * std::sqrt(norm))) {
        return ::testing::AssertionFailure()
               << "relative error " << std::sqrt(diff / norm) << " exceeds " << rtol;
    }
    return ::testing::AssertionSuccess();
}

}  // namespace gpt2::test
