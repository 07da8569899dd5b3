// Training data: token streams (in memory or memory-mapped shards) cut into windows of T+1 tokens,
// and the deterministic map from (step, rank, micro-step, sequence) to a window, so the set of
// sequences in a step does not depend on how ranks, threads and micro-batches split it.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace gpt2 {

// The target of a position the loss mask leaves out (PyTorch's default ignore_index): the loss
// kernels give it no loss and no gradient.
inline constexpr std::int32_t kIgnoredTarget = -100;

// One or more token segments; windows never cross a segment boundary. Segments are views: the
// owner (a vector or a mapped shard) must outlive the store. A store whose segments carry a loss
// mask (one byte per token, non-zero: the token is trained as a target) gives masked targets as
// kIgnoredTarget; either every segment has a mask or none.
class TokenStore {
  public:
    void add(std::span<const std::int32_t> tokens);
    void add(std::span<const std::uint16_t> tokens);
    // A segment with its loss mask (mask.size() == tokens.size()).
    void add(std::span<const std::uint16_t> tokens, std::span<const std::uint8_t> mask);
    [[nodiscard]] bool masked() const { return masked_; }
    // Targets of window w that the mask trains (T without a mask).
    [[nodiscard]] std::int64_t trained_targets(std::uint64_t window, int T) const;
    // Number of non-overlapping windows of T inputs (+1 target) the segments hold.
    [[nodiscard]] std::uint64_t num_windows(int T) const;
    [[nodiscard]] std::uint64_t num_tokens() const;
    // Copies window w's T inputs and the T next-token targets.
    void copy_window(std::uint64_t window, int T, std::span<std::int32_t> inputs,
                     std::span<std::int32_t> targets) const;
    // Largest token id present (for validating against the vocabulary).
    [[nodiscard]] std::int32_t max_token() const;

  private:
    struct Segment {
        const std::int32_t* wide = nullptr;
        const std::uint16_t* narrow = nullptr;
        const std::uint8_t* mask = nullptr;
        std::uint64_t length = 0;
    };
    // The segment holding window w, and the window's first token in it.
    [[nodiscard]] std::pair<const Segment*, std::uint64_t> locate(std::uint64_t window,
                                                                  int T) const;
    std::vector<Segment> segments_;
    bool masked_ = false;
};

// Which window serves each sequence slot. Slot k counts sequences globally: the step's slots are
// [step * G, (step + 1) * G) with G = B * world * grad_accum, and rank r's sequence b of
// micro-step a is slot step * G + (a * world + r) * B + b. Shuffled: each pass over the data
// visits the windows in a fresh seeded permutation; unshuffled: window k mod n (llm.c's order).
class WindowSampler {
  public:
    WindowSampler(const TokenStore& store, int T, std::uint64_t seed, bool shuffle);

    [[nodiscard]] std::uint64_t num_windows() const { return num_windows_; }
    [[nodiscard]] std::uint64_t window_for_slot(std::uint64_t slot);

    // Fills this rank's grad_accum micro-batches of B sequences for `step`.
    void fill_step(std::uint64_t step, int rank, int world, int B, int grad_accum,
                   std::span<std::int32_t> inputs, std::span<std::int32_t> targets);
    // The targets the loss mask trains in the whole step: its `sequences` slots over every rank
    // (B * world * grad_accum). Every rank counts the same number without communicating.
    [[nodiscard]] std::int64_t step_trained_targets(std::uint64_t step, std::uint64_t sequences);

  private:
    const TokenStore& store_;
    int T_;
    std::uint64_t seed_;
    bool shuffle_;
    std::uint64_t num_windows_;
    std::uint64_t cached_epoch_ = ~std::uint64_t{0};
    std::vector<std::uint64_t> permutation_;
};

// Splits text tokens: the last `val_fraction` of them are validation.
struct TokenSplit {
    std::vector<std::int32_t> train;
    std::vector<std::int32_t> val;
};
[[nodiscard]] TokenSplit split_tokens(std::vector<std::int32_t> tokens, double val_fraction);

}  // namespace gpt2
