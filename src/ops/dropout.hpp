// Dropout masks drawn from a counter, not from a stream: whether an element is kept depends only on
// (seed, step, layer, site, the sequence's index in the step, the element's index), so any split of
// a step over threads, ranks and micro-steps draws the same masks, and backward regenerates them.
#pragma once

#include <cstdint>

namespace gpt2 {

// Where GPT-2 applies dropout: the embeddings' sum, the attention probabilities, and the outputs
// of the attention and MLP projections before their residual adds.
enum class DropoutSite : std::uint64_t {
    Embeddings = 0,
    AttentionProbabilities = 1,
    AttentionOutput = 2,
    MlpOutput = 3,
};

// One site of one layer for a batch of consecutive sequences; rate 0 is off.
struct DropoutMask {
    float rate = 0.0f;
    std::uint64_t site_key = 0;        // dropout_site_key(seed, step, layer, site)
    std::uint64_t first_sequence = 0;  // the batch's first sequence's index in the step

    [[nodiscard]] bool active() const { return rate > 0.0f; }
    // Kept values are scaled by 1 / (1 - rate) (inverted dropout).
    [[nodiscard]] float scale() const { return 1.0f / (1.0f - rate); }
    // An element is kept when its 32 random bits are at least this.
    [[nodiscard]] std::uint32_t threshold() const;
    // The key of the batch's sequence b.
    [[nodiscard]] std::uint64_t sequence_key(int b) const;
};

// The counter's mixing function: MurmurHash3's 64-bit finalizer (a bijection with full avalanche).
[[nodiscard]] constexpr std::uint64_t mix64(std::uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

[[nodiscard]] std::uint64_t dropout_site_key(std::uint64_t seed, std::uint64_t step, int layer,
                                             DropoutSite site);

// Whether element `element` of the sequence with key `sequence_key` is kept.
[[nodiscard]] inline bool dropout_keeps(std::uint64_t sequence_key, std::uint64_t element,
                                        std::uint32_t threshold) {
    constexpr std::uint64_t kElementStride = 0x9e3779b97f4a7c15ULL;  // 2^64 / golden ratio
    return static_cast<std::uint32_t>(mix64(sequence_key + element * kElementStride) >> 32) >=
           threshold;
}

// x (B, n): element e of sequence b kept and scaled, or zeroed, by the mask. The same call on the
// gradient of the result is the backward.
void apply_dropout(float* x, int B, long n, const DropoutMask& mask);

}  // namespace gpt2
