// How a step sums the gradient across ranks, which weights each rank updates and how the updated
// weights reach every rank: one interface, and one implementation per strategy (allreduce.hpp,
// zero.hpp, shared_replica.hpp, adapter_exchange.hpp), each owning its buffers and threads. Which
// optimizer updates the owned weights is not its business (train/step.cpp calls it between
// finish() and publish()).
#pragma once

#include <span>

#include "core/range.hpp"
#include "model/model.hpp"
#include "parallel/comm.hpp"
#include "parallel/worker_group.hpp"

namespace gpt2 {

// The parameters a step's optimizer updates: the model's, with their bf16 copy (empty in fp32) and
// layout, or what the exchange trains instead (a LoRA adapter's: no copy, no layout).
struct TrainedParameters {
    std::span<float> params;
    std::span<Bf16> params_bf16;
    const ParameterLayout* layout = nullptr;
};

// What a step needs of the exchange, in the order it calls it (train/step.cpp).
class GradientExchange {
  public:
    virtual ~GradientExchange() = default;

    // Forward and backward over the step's micro-batches on the workers, the rank's gradient
    // summed into workers.gradient(); with `overlap`, parts of it may leave as backward completes
    // them (without: all of it after backward, so that a test can change it first).
    [[nodiscard]] virtual GradientPass backward(const Model& model, WorkerGroup& workers,
                                                const StepBatch& batch, bool overlap) = 0;
    // The rest of the exchange after backward. Returns the buffer whose owned() elements hold the
    // gradient summed over every rank.
    [[nodiscard]] virtual std::span<float> finish(WorkerGroup& workers) = 0;
    // The squared norm of the whole summed gradient, the same number on every rank.
    [[nodiscard]] virtual double norm_squared(std::span<float> gradient, WorkerGroup& workers) = 0;
    // The parameters the optimizer updates (the model's by default).
    [[nodiscard]] virtual TrainedParameters trained(Model& model);
    // After the optimizer updated the owned() elements (and zeroed their gradient): every rank
    // holds the same weights, and the gradient buffers are zero for the next step.
    virtual void publish(Model& model, WorkerGroup& workers) = 0;
    // A skipped step: the gradient cleared for the next, no weight changed.
    virtual void discard(std::span<float> gradient, WorkerGroup& workers) = 0;

    // The elements of the flat parameters this rank updates (all, or its slice).
    [[nodiscard]] virtual Range owned() const = 0;
    // The ranks the step's loss is summed over.
    [[nodiscard]] virtual const Communicator& world() const = 0;
    // This rank's gradient after backward, before finish() (tests inject faults into it): the
    // workers' full gradient, or what the exchange trains instead (an adapter's).
    [[nodiscard]] virtual std::span<float> rank_gradient(WorkerGroup& workers);
};

// The gradient's squared norm comes out the same bits for any split of the step over workers and
// ranks: the buffer is cut into blocks of kNormBlock elements from element 0, each block's sum of
// squares taken alone (sum_of_squares: float lanes), and the block sums added in double in block
// order. Ranks' slices begin on block boundaries (slice_between), so no block is cut between two
// ranks, and a block summed on one rank travels to the others exactly (x + 0 = x).
inline constexpr std::size_t kNormBlock = 1024;
[[nodiscard]] inline std::size_t norm_blocks(std::size_t n) {
    return (n + kNormBlock - 1) / kNormBlock;
}
// The blocks' sums of squares added in double in block order: the squared norm.
[[nodiscard]] double sum_in_block_order(std::span<const float> block_sums);

namespace exchange_detail {
// block_sums[b] (norm_blocks(gradient.size()) of them) for every block of gradient[owned], summed
// on the workers (owned.begin on a block boundary; the other entries are left as they are), and,
// when `clear_others`, the rest of the buffer cleared (partial sums under ZeRO-1).
void owned_block_sums(std::span<float> gradient, Range owned, WorkerGroup& workers,
                      bool clear_others, std::span<float> block_sums);
// The squared norm of the gradient summed over every rank, from this rank's blocks of
// gradient[owned] (none where `counts` is false: ranks that hold a copy of another's slice), the
// block sums summed across `ranks` (null: this rank holds the whole gradient) and added in block
// order: the same bits on every rank and for any split. `clear_others` as owned_block_sums.
[[nodiscard]] double norm_squared_in_blocks(std::span<float> gradient, Range owned,
                                            WorkerGroup& workers, bool clear_others,
                                            const Communicator* ranks, bool counts = true);
// gradient[owned] zeroed on the workers.
void clear_owned(std::span<float> gradient, Range owned, WorkerGroup& workers);
}  // namespace exchange_detail

}  // namespace gpt2
