#include "ops/dropout.hpp"

#include <cmath>

namespace gpt2 {

std::uint32_t DropoutMask::threshold() const {
    // rate in [0, 1): floor(rate * 2^32) fits in 32 bits.
    return static_cast<std::uint32_t>(std::floor(static_cast<double>(rate) * 4294967296.0));
}

std::uint64_t DropoutMask::sequence_key(int b) const {
    constexpr std::uint64_t kSequenceStride = 0xd1b54a32d192ed03ULL;
    return mix64(site_key + (first_sequence + static_cast<std::uint64_t>(b)) * kSequenceStride);
}

std::uint64_t dropout_site_key(std::uint64_t seed, std::uint64_t step, int layer,
                               DropoutSite site) {
    const std::uint64_t where =
        static_cast<std::uint64_t>(layer) * 4 + static_cast<std::uint64_t>(site);
    return mix64(mix64(mix64(seed) + step) + where);
}

std::uint64_t lora_input_site_key(std::uint64_t seed, std::uint64_t step, int layer,
                                  int projection) {
    constexpr std::uint64_t kLoraInputSites = std::uint64_t{1} << 62;
    const std::uint64_t where = kLoraInputSites + static_cast<std::uint64_t>(layer) * 4 +
                                static_cast<std::uint64_t>(projection);
    return mix64(mix64(mix64(seed) + step) + where);
}

void apply_dropout(float* x, int B, long n, const DropoutMask& mask) {
    const std::uint32_t threshold = mask.threshold();
    const float scale = mask.scale();
    for (int b = 0; b < B; ++b) {
        const std::uint64_t key = mask.sequence_key(b);
        float* row = x + static_cast<long>(b) * n;
        // A multiply by the kept value's factor, not a branch, so that the loop vectorises.
        for (long e = 0; e < n; ++e) {
            const float factor =
                dropout_keeps(key, static_cast<std::uint32_t>(e), threshold) ? scale : 0.0f;
            row[e] *= factor;
        }
    }
}

}  // namespace gpt2
