// exp, tanh, log-sum-exp and row reductions (sums, maxima) in forms the compiler vectorises
// (libm's are a call per element, a running sum a chain of dependent adds), shared by the kernels
// of ops/ so that a value recomputed in backward is bitwise the forward's.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>

namespace gpt2 {

// exp(x): x = n*ln2 + r with |r| <= ln2/2, a degree-6 Taylor polynomial for e^r (relative error
// < 2e-7), and 2^n built directly in the exponent bits. Inputs are clamped to [-87, 88], where
// float exp is normal.
inline float vexp(float x) {
    x = std::min(std::max(x, -87.0f), 88.0f);
    constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    const float shifted = x * 1.44269504088896341f + kRound;
    const float n = shifted - kRound;
    const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
    const float p =
        1.0f +
        r * (1.0f +
             r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
    const std::int32_t exponent = std::bit_cast<std::int32_t>(shifted) - 0x4B400000 + 127;
    return p * std::bit_cast<float>(exponent << 23);
}

// tanh through vexp: 1 - 2 / (1 + e^(2u)), exact at the saturated ends.
inline float vtanh(float u) {
    return 1.0f - 2.0f / (1.0f + vexp(2.0f * u));
}

// Row reductions in lanes: term i goes to lane i % kLanes and the lanes are combined in a fixed
// order, so the loop vectorises (a single running sum is a chain of dependent adds) and every CPU
// and vector width combines in the same order.
inline constexpr int kLanes = 16;

inline float add_lanes(const std::array<float, kLanes>& lanes) {
    float result = lanes[0];
    for (int l = 1; l < kLanes; ++l)
        result += lanes[l];
    return result;
}

// combine() of term(i) over i in [0, n), in lanes that each start at init.
template <class Term, class Combine>
inline float reduce_lanes(int n, float init, Term term, Combine combine) {
    std::array<float, kLanes> lanes;
    lanes.fill(init);
    int i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        for (int l = 0; l < kLanes; ++l)
            lanes[l] = combine(lanes[l], term(i + l));
    }
    for (int l = 0; i + l < n; ++l)
        lanes[l] = combine(lanes[l], term(i + l));
    float result = lanes[0];
    for (int l = 1; l < kLanes; ++l)
        result = combine(result, lanes[l]);
    return result;
}

// The sum of term(i) over i in [0, n), in lanes.
template <class Term>
inline float lane_sum(int n, Term term) {
    return reduce_lanes(n, 0.0f, term, [](float a, float b) { return a + b; });
}

// The largest of x[0, n), n >= 1, in lanes.
inline float lane_max(const float* x, int n) {
    return reduce_lanes(
        n, x[0], [x](int i) { return x[i]; }, [](float a, float b) { return std::max(a, b); });
}

// log(sum(exp(row[j]))) over the first n entries, the maximum taken out first: a softmax's
// log-partition (cross-entropy's, attention's log-sum-exp).
inline float log_sum_exp(const float* row, int n) {
    float maxv = row[0];
    for (int j = 1; j < n; ++j)
        maxv = std::max(maxv, row[j]);
    float sum = 0.0f;
    for (int j = 0; j < n; ++j)
        sum += vexp(row[j] - maxv);
    return std::log(sum) + maxv;
}

}  // namespace gpt2
