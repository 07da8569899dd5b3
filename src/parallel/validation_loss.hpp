// The validation loss: the mean loss over a fixed set of windows of the validation data, the
// same bits for any batch size, thread count and rank count.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>

#include "model/model.hpp"
#include "parallel/comm.hpp"
#include "parallel/worker_group.hpp"

namespace gpt2 {

// Writes window `window`'s T inputs and their T next-token targets (T = the workers' seq_len;
// kIgnoredTarget where a loss mask leaves one out).
// Called by several workers at once.
using WindowReader = std::function<void(std::uint64_t window, std::span<std::int32_t> inputs,
                                        std::span<std::int32_t> targets)>;

// The mean per-token loss over `tokens` targets (windows x T, or with a loss mask the trained
// ones; none: loss 0), and, where the targets' byte lengths are given, bits per byte: the same
// losses over the targets that are text (special tokens such as end-of-text, of 0 bytes, left
// out, as nanochat counts it), in bits, divided by the bytes those targets spell. It compares
// models across tokenizers, as the loss per token cannot.
struct ValidationLoss {
    double loss = 0.0;
    std::int64_t tokens = 0;
    std::optional<double> bits_per_byte;
    std::int64_t bytes = 0;  // what bits_per_byte is over
};

// The mean loss over windows 0 .. windows-1 of the validation data: each window is one forward
// of its own (one sequence, so no matrix product ever sees it among other rows), wherever it
// runs; the windows are divided among the ranks and their workers, each window's loss lands at
// its index, and every rank adds them in index order after an allreduce in which each index has
// one non-zero contributor (exact). `document_start`: the training's document masking in
// attention (TokenBatch::document_start), so that validation sees the windows as training does.
// `token_bytes` (empty: no bits per byte): each token id's length in bytes, 0 for special ones.
[[nodiscard]] ValidationLoss validation_loss(const Model& model, WorkerGroup& workers,
                                             const Communicator& comm, std::uint64_t windows,
                                             const WindowReader& read_window,
                                             std::optional<std::int32_t> document_start = {},
                                             std::span<const std::int32_t> token_bytes = {});

}  // namespace gpt2
