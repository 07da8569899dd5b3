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

// The keys' mixing function: MurmurHash3's 64-bit finalizer (a bijection with full avalanche).
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
// LoRA's dropout on the input of layer `layer`'s adapted projection `projection` (0..3, in
// LoraTarget's order). Its sites are keyed apart from every DropoutSite's: the same chain of mixes
// over a `where` with bit 62 set (theirs are layer * 4 + site, far below), and mix64 is a
// bijection.
[[nodiscard]] std::uint64_t lora_input_site_key(std::uint64_t seed, std::uint64_t step, int layer,
                                                int projection);

// MurmurHash3's 32-bit finalizer: the per-element draw uses 32-bit multiplies only, which AVX2
// vectorises (it has no 64-bit multiply; the figures are in docs/performance.md).
[[nodiscard]] constexpr std::uint32_t mix32(std::uint32_t x) {
    x ^= x >> 16;
    x *= 0x85ebca6bU;
    x ^= x >> 13;
    x *= 0xc2b2ae35U;
    x ^= x >> 16;
    return x;
}

// Whether element `element` (< 2^32 per sequence and site) of the sequence with key
// `sequence_key` is kept. The high half of the key goes in after the first round, so sequences
// whose low halves differ by d do not draw one stream shifted by d.
[[nodiscard]] inline bool dropout_keeps(std::uint64_t sequence_key, std::uint32_t element,
                                        std::uint32_t threshold) {
    const auto low = static_cast<std::uint32_t>(sequence_key);
    const auto high = static_cast<std::uint32_t>(sequence_key >> 32);
    return mix32(mix32(element + low) ^ high) >= threshold;
}

// x (B, n): element e of sequence b kept and scaled, or zeroed, by the mask. The same call on the
// gradient of the result is the backward.
void apply_dropout(float* x, int B, long n, const DropoutMask& mask);

}  // namespace gpt2
