#include "parallel/validation_loss.hpp"

#include <algorithm>
#include <vector>

namespace gpt2 {

ValidationLoss validation_loss(const Model& model, WorkerGroup& workers, const Communicator& comm,
                               std::uint64_t windows, const WindowReader& read_window,
                               std::optional<std::int32_t> document_start) {
    const int T = workers.seq_len();
    const auto uT = static_cast<std::size_t>(T);
    // Workers beyond the batch size have no room for activations.
    const int W = workers.contributing_workers();
    const Range rank_windows = split_range(windows, comm.rank(), comm.size());
    // Each window's loss, then its trained targets (T without a mask).
    std::vector<double> losses(2 * windows, 0.0);
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
        }
    });
    comm.allreduce_sum(std::span<double>(losses));
    double loss_sum = 0.0;
    double trained = 0.0;
    for (std::size_t i = 0; i < windows; ++i) {
        loss_sum += losses[i];
        trained += losses[windows + i];
    }
    const auto tokens = static_cast<std::int64_t>(trained);
    return ValidationLoss{tokens > 0 ? loss_sum / static_cast<double>(tokens) : 0.0, tokens};
}

}  // namespace gpt2
