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

}  // namespace gpt2::test
