// One data-parallel training step: worker threads run forward/backward on disjoint sequences
// into their own contexts, sum gradients over disjoint slices, ranks allreduce once, and every
// rank applies the same clipped AdamW update.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/model.hpp"
#include "model/optimizer.hpp"
#include "model/training_context.hpp"
#include "parallel/comm.hpp"
#include "parallel/thread_pool.hpp"

namespace gpt2 {

// One worker's scalar result, alone on its cache line so workers never write the same line.
struct alignas(64) WorkerPartial {
    double value = 0.0;
};

// A rank's compute: the thread pool and one ThreadLocalTrainingContext per worker. After a
// reduction, worker 0's gradient buffer holds the rank's (and after allreduce, the global)
// gradient, so no separate buffer is kept.
class WorkerGroup {
  public:
    // Each context holds ceil(batch_size / workers) sequences of seq_len tokens, with bf16
    // scratch when the model trains in bf16.
    WorkerGroup(const ModelConfig& config, int workers, int batch_size, int seq_len, bool pin,
                Precision precision = Precision::fp32);

    [[nodiscard]] int size() const { return pool_.size(); }
    [[nodiscard]] int batch_size() const { return batch_size_; }
    [[nodiscard]] int seq_len() const { return seq_len_; }
    [[nodiscard]] ThreadPool& pool() { return pool_; }
    [[nodiscard]] ThreadLocalTrainingContext& context(int w) {
        return contexts_[static_cast<std::size_t>(w)];
    }
    [[nodiscard]] const ThreadLocalTrainingContext& context(int w) const {
        return contexts_[static_cast<std::size_t>(w)];
    }
    [[nodiscard]] std::span<float> gradient() { return contexts_.front().grads.span(); }
    // Per-worker scalars (loss sums, squared norms), allocated once.
    [[nodiscard]] std::span<WorkerPartial> partials() { return partials_; }

  private:
    int batch_size_;
    int seq_len_;
    ThreadPool pool_;
    std::vector<ThreadLocalTrainingContext> contexts_;
    std::vector<WorkerPartial> partials_;
};

// This rank's tokens for one optimizer step: grad_accum micro-batches of B x T, consecutive.
struct StepBatch {
    std::span<const std::int32_t> inputs;
    std::span<const std::int32_t> targets;
    int grad_accum = 1;
    // Sequences in the whole step over all ranks (B * grad_accum * world size).
    std::int64_t global_sequences = 0;
};

struct StepHyper {
    AdamWHyper adamw;
    float grad_clip = 1.0f;  // max global gradient norm; <= 0 disables clipping
};

// Where a step's time went on this rank (seconds), for --log-level debug.
struct StepTimings {
    double forward_backward = 0.0;
    double thread_reduction = 0.0;  // summing the workers' gradients (and the local norm)
    double allreduce = 0.0;         // gradient and loss across ranks (and the norm after it)
    double optimizer = 0.0;
};

struct StepMetrics {
    double loss = 0.0;       // mean over every token of the step, all ranks
    double grad_norm = 0.0;  // global norm before clipping
    bool skipped = false;    // non-finite loss or norm: no update was made
    StepTimings timings;
};

// Forward/backward over all micro-batches, gradient reduction across workers and ranks, and the
// AdamW update (skipped, with gradients cleared, when the loss or norm is not finite).
// `inject_nan` poisons the gradient first (a test hook for the non-finite path).
[[nodiscard]] StepMetrics train_step(Model& model, AdamWState& optimizer, WorkerGroup& workers,
                                     const Communicator& comm, const StepBatch& batch,
                                     const StepHyper& hyper, bool inject_nan = false);

// Mean loss over `num_batches` micro-batches of this rank's tokens, averaged over all ranks.
[[nodiscard]] double evaluate(const Model& model, WorkerGroup& workers, const Communicator& comm,
                              std::span<const std::int32_t> inputs,
                              std::span<const std::int32_t> targets, int num_batches);

}  // namespace gpt2
