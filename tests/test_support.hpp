// Helpers shared by the tests: element-wise comparison with a clear report of the worst element.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/random.hpp"
#include "model/model.hpp"

namespace gpt2::test {

// n draws of offset + scale * N(0, 1) from the project's generator with `seed`.
inline std::vector<float> normal_vector(std::size_t n, std::uint64_t seed, float scale = 1.0f,
                                        float offset = 0.0f) {
    Rng rng(seed);
    std::vector<float> v(n);
    for (float& x : v)
        x = offset + scale * rng.normal();
    return v;
}

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

// ||actual - expected|| and ||expected|| (Euclidean, in double) of two spans of one size.
struct DifferenceNorms {
    double diff = 0.0;
    double norm = 0.0;
    [[nodiscard]] double relative() const { return diff / norm; }
};
inline DifferenceNorms difference_norms(std::span<const float> actual,
                                        std::span<const float> expected) {
    double diff = 0.0, norm = 0.0;
    for (std::size_t i = 0; i < actual.size(); ++i) {
        const double d = static_cast<double>(actual[i]) - expected[i];
        diff += d * d;
        norm += static_cast<double>(expected[i]) * expected[i];
    }
    return {std::sqrt(diff), std::sqrt(norm)};
}

// Passes when ||actual - expected|| <= rtol * ||expected|| (whole-tensor relative error: immune to
// elements whose true value is ~0, such as the key bias, whose gradient vanishes exactly).
inline ::testing::AssertionResult norm_close(std::span<const float> actual,
                                             std::span<const float> expected, double rtol) {
    if (actual.size() != expected.size()) {
        return ::testing::AssertionFailure()
               << "size " << actual.size() << " != expected " << expected.size();
    }
    const DifferenceNorms n = difference_norms(actual, expected);
    if (!(n.diff <= rtol * n.norm)) {
        return ::testing::AssertionFailure()
               << "relative error " << n.relative() << " exceeds " << rtol;
    }
    return ::testing::AssertionSuccess();
}

// Every parameter tensor of `actual` within `rtol` of `expected` in norm (norm_close per tensor),
// naming the first that is not.
inline ::testing::AssertionResult tensors_close(const ParameterLayout& layout,
                                                std::span<const float> actual,
                                                std::span<const float> expected, double rtol) {
    for (int i = 0; i < kNumParamTensors; ++i) {
        const auto t = static_cast<ParamTensor>(i);
        auto r = norm_close(layout.tensor(actual, t), layout.tensor(expected, t), rtol);
        if (!r) return r << " in " << param_tensor_name(t);
    }
    return ::testing::AssertionSuccess();
}

// Two trainings of the same model agree: every tensor to `rtol` in norm, except the key bias.
// Its true gradient is exactly zero (softmax ignores a per-row constant), so Adam turns float
// rounding noise into steps of about lr there: those entries need only stay within
// `key_bias_atol` of each other.
inline ::testing::AssertionResult same_training(const ModelConfig& config,
                                                std::span<const float> actual,
                                                std::span<const float> expected, double rtol,
                                                double key_bias_atol) {
    const ParameterLayout layout(config);
    if (actual.size() != layout.total() || expected.size() != layout.total()) {
        return ::testing::AssertionFailure() << "parameter count differs from the layout";
    }
    std::vector<float> a(actual.begin(), actual.end()), e(expected.begin(), expected.end());
    const int C = config.channels;
    for (int l = 0; l < config.num_layers; ++l) {
        for (int i = C; i < 2 * C; ++i) {
            const std::size_t k =
                layout.offset(ParamTensor::qkvb) + static_cast<std::size_t>(l * 3 * C + i);
            if (std::abs(a[k] - e[k]) > key_bias_atol) {
                return ::testing::AssertionFailure() << "key bias layer " << l << " index " << i - C
                                                     << ": " << a[k] << " vs " << e[k];
            }
            a[k] = e[k] = 0.0f;
        }
    }
    return tensors_close(layout, a, e, rtol);
}

}  // namespace gpt2::test
