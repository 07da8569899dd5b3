// Multiple-choice accuracy during training (HellaSwag, from llm.c's evaluation files): each ending
// is scored by its mean token loss after the context, the lowest wins (llm.c's acc_norm); the
// examples are split over ranks and worker threads.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "data/multiple_choice.hpp"
#include "model/forward_backward.hpp"
#include "model/model.hpp"
#include "parallel/comm.hpp"
#include "parallel/worker_group.hpp"

namespace gpt2 {

struct MultipleChoiceScore {
    std::int64_t correct = 0;
    std::int64_t scored = 0;
    std::int64_t too_long = 0;  // context + ending longer than the sequence length: not scored
    [[nodiscard]] double accuracy() const {
        return scored > 0 ? static_cast<double>(correct) / static_cast<double>(scored) : 0.0;
    }
};

// The mean loss of each ending after the context: the endings in one forward when their rows fit
// the context's max_batch() x seq_len() tokens, else one by one, so that the figures do not depend
// on the context's batch; empty if some ending does not fit seq_len(). `rows` is scratch.
[[nodiscard]] std::vector<double> ending_losses(const Model& model, ThreadLocalTrainingContext& ctx,
                                                const MultipleChoiceExample& example,
                                                std::vector<std::int32_t>& rows);

// Example i goes to rank i % ranks, and within the rank to the workers with sequences in turn.
// Every rank returns the totals.
[[nodiscard]] MultipleChoiceScore evaluate_multiple_choice(
    const Model& model, WorkerGroup& workers, const Communicator& comm,
    std::span<const MultipleChoiceExample> examples);

// The largest token id in `examples` (a file made with another tokenizer shows here).
[[nodiscard]] std::int32_t max_token(std::span<const MultipleChoiceExample> examples);

}  // namespace gpt2
