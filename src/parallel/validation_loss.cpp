#include "parallel/validation_loss.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace gpt2 {

ValidationLoss validation_loss(const Model& model, WorkerGroup& workers, const Communicator& comm,
                               std::uint64_t windows, const WindowReader& read_window,
                               std::optional<std::int32_t> document_start,
                               std::span<const std::int32_t> token_bytes) {
    const int T = workers.seq_len();
    const auto uT = static_cast<std::size_t>(T);
    // Workers beyond the batch size have no room for activations.
    const int W = workers.contributing_workers();
    const Range rank_windows = split_range(windows, comm.rank(), comm.size());
    // Each window's loss, then its trained targets (T without a mask); with token lengths also
    // its text targets' loss and their bytes.
    const std::size_t parts = token_bytes.empty() ? 2 : 4;
    std::vector<double> losses(parts * windows, 0.0);
    workers.pool().run([&](int w) {
        if (w >= W) return;
        const Range mine = split_range(rank_windows.end - rank_windows.begin, w, W);
        std::vector<std::int32_t> inputs(uT), targets(uT);
        for (std::size_t i = rank_windows.begin + mine.begin; i < rank_windows.begin + mine.end;
             ++i) {
            read_window(i, inputs, targets);
            TokenBatch window{inputs, targets, 1, T};
            window.document_start = document_start;
            losses[i] = forward_loss(model, workers.context(w), window);
            losses[windows + i] = static_cast<double>(std::count_if(
                targets.begin(), targets.end(), [](std::int32_t t) { return t >= 0; }));
            if (token_bytes.empty()) continue;
            // forward_loss left each target's loss in the context.
            const float* row_losses = workers.context(w).acts.losses;
            double text_loss = 0.0, bytes = 0.0;
            for (std::size_t t = 0; t < uT; ++t) {
                if (targets[t] < 0) continue;  // left out by a loss mask
                const std::int32_t length = token_bytes[static_cast<std::size_t>(targets[t])];
                if (length == 0) continue;  // a special token: no text
                text_loss += row_losses[t];
                bytes += length;
            }
            losses[2 * windows + i] = text_loss;
            losses[3 * windows + i] = bytes;
        }
    });
    comm.allreduce_sum(std::span<double>(losses));
    std::array<double, 4> sums{};  // in window order: the same bits however the windows ran
    for (std::size_t part = 0; part < parts; ++part) {
        for (std::size_t i = 0; i < windows; ++i)
            sums[part] += losses[part * windows + i];
    }
    ValidationLoss result;
    result.tokens = static_cast<std::int64_t>(sums[1]);
    result.loss = result.tokens > 0 ? sums[0] / static_cast<double>(result.tokens) : 0.0;
    if (parts == 4 && sums[3] > 0.0) {
        result.bytes = static_cast<std::int64_t>(sums[3]);
        result.bits_per_byte = sums[2] / (std::log(2.0) * sums[3]);
    }
    return result;
}

}  // namespace gpt2
