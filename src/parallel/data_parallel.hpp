// One data-parallel training step: worker threads run forward/backward on disjoint sequences in
// their own contexts, summing the gradient layer by layer into the rank's buffer as backward goes
// (LayerwiseReduction), ranks allreduce once, and every rank applies the same clipped AdamW update.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/model.hpp"
#include "model/optimizer.hpp"
#include "model/spike_guard.hpp"
#include "model/training_context.hpp"
#include "parallel/comm.hpp"
#include "parallel/layerwise_reduction.hpp"
#include "threads/thread_pool.hpp"

namespace gpt2 {

// One worker's scalar result, alone on its cache line so workers never write the same line.
struct alignas(64) WorkerPartial {
    double value = 0.0;
    double seconds_at_barriers = 0.0;  // accumulate_gradients: waiting for the other workers
};

// A rank's compute: the thread pool, one ThreadLocalTrainingContext per worker and the rank's one
// full gradient buffer, which the workers sum into (and after allreduce holds the global
// gradient).
class WorkerGroup {
  public:
    // Each worker with sequences has a context for ceil(batch_size / workers) sequences of seq_len
    // tokens, with bf16 scratch when the model trains in bf16; workers beyond batch_size have no
    // sequences (their contexts hold no activations) and only help sum the gradient. `recompute`
    // sets what the contexts store (model.hpp).
    WorkerGroup(const ModelConfig& config, int workers, int batch_size, int seq_len, bool pin,
                Precision precision = Precision::fp32, Recompute recompute = Recompute::cheap);

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
    // Workers that get sequences: min(workers, batch_size).
    [[nodiscard]] int contributing_workers() const { return reduction_.contributors(); }
    [[nodiscard]] std::span<float> gradient() { return reduction_.gradient(); }
    [[nodiscard]] LayerwiseReduction& reduction() { return reduction_; }
    [[nodiscard]] std::size_t gradient_bytes() const {
        return reduction_.gradient().size() * sizeof(float);
    }
    // Per-worker scalars (loss sums, squared norms), allocated once.
    [[nodiscard]] std::span<WorkerPartial> partials() { return partials_; }
    // After share_replica_memory: every rank's gradient buffer (this rank's is gradient()), in
    // rank order, all mapped here; empty otherwise.
    [[nodiscard]] std::span<float* const> rank_gradients() const { return rank_gradients_; }
    void set_rank_gradients(std::vector<float*> all) { rank_gradients_ = std::move(all); }
    // After share_replica_memory: every rank's count of gradient parts it has completed since
    // sharing began (in rank order, in the shared memory; only its own rank increases it), so
    // that a rank can sum its slice of a part as soon as every rank has it. Empty otherwise.
    [[nodiscard]] std::span<std::uint64_t* const> rank_progress() const { return rank_progress_; }
    void set_rank_progress(std::vector<std::uint64_t*> all) { rank_progress_ = std::move(all); }

  private:
    int batch_size_;
    int seq_len_;
    ThreadPool pool_;
    std::vector<ThreadLocalTrainingContext> contexts_;
    LayerwiseReduction reduction_;  // after contexts_: it gives them their gradient windows
    std::vector<WorkerPartial> partials_;
    std::vector<float*> rank_gradients_;
    std::vector<std::uint64_t*> rank_progress_;

  public:
    // Kept across steps for the overlapped allreduce (created at its first step): the
    // communication thread, and the last micro-batch's embedding rows, this rank's and every
    // rank's.
    std::unique_ptr<BackgroundAllreduce> background_allreduce;
    struct EmbeddingRows {
        std::vector<float> mine, all;
        std::vector<std::int32_t> tokens, all_tokens;
    } embedding_rows;
};

// Ranks on one machine can train one copy of the weights instead of one each. This moves the
// weights (and their bf16 copy) and every rank's gradient buffer into memory all of them map
// (collective). A step then sums the gradient without MPI: each rank adds its slice
// (hyper.zero_shards, as under ZeRO-1) of every rank's buffer into rank 0's (after backward, or
// across machines part by part while backward runs), and AdamW updates that slice of the shared
// weights. Returns why not on failure, leaving everything as it was.
// `comm` is the ranks of one machine; across machines each machine shares its own copy.
[[nodiscard]] std::string share_replica_memory(Model& model, WorkerGroup& workers,
                                               const Communicator& comm);
// Back to the rank's own memory (weights copied, gradient zero): when another machine could not
// share, so that every rank trains alike.
void unshare_replica_memory(Model& model, WorkerGroup& workers);

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
    // With several ranks: floats per allreduce bucket, started while backward goes on (0: one
    // allreduce of the whole gradient after backward).
    std::size_t bucket_floats = 0;
    // ZeRO-1 or shared memory (several ranks): each rank's part of the flat parameters, one per
    // rank; this rank's optimizer state holds only its part. Empty: every rank updates
    // everything.
    std::span<const Range> zero_shards;
    // Shared memory on several machines: the ranks of this machine share the weights and sum
    // into one buffer, and each slice takes an allreduce with the ranks owning it on the other
    // machines: with bucket_floats > 0 in buckets of that size while backward runs (each
    // summed over the machine's ranks as soon as all of them have it), else one after backward.
    // Null: the ranks that share memory are the world.
    const MachineGroups* machines = nullptr;
};

// Where a step's time went on this rank (seconds), for --log-level debug.
struct StepTimings {
    double forward_backward = 0.0;
    double thread_reduction = 0.0;  // worker 0 waiting for and summing the workers' gradients
    double allreduce = 0.0;  // after backward: the gradient's (rest of the) allreduce, the loss's
                             // and the norm
    double optimizer = 0.0;
    // Per worker: time spent at the reduction's barriers waiting for the others (imbalance).
    std::vector<double> barrier_wait;
};

struct StepMetrics {
    double loss = 0.0;       // mean over every token of the step, all ranks
    double grad_norm = 0.0;  // global norm before clipping
    bool skipped = false;    // non-finite loss or norm, or a spike: no update was made
    bool spike = false;      // skipped because a z-score exceeded its threshold (SpikeGuard)
    // z-scores against the last 128 kept steps, once there are 128 (with a SpikeGuard).
    std::optional<double> loss_z;
    std::optional<double> norm_z;
    StepTimings timings;
};

// Forward/backward over the step's micro-batches, the workers' gradients summed into
// workers.gradient() (zero before the step, as AdamW leaves it) as backward goes. `ready`, if set,
// is called on the calling thread (worker 0) as each part of the rank's gradient becomes complete
// during the last micro-batch: the final LayerNorm, layers L-1 down to 0, the embeddings.
struct GradientPass {
    double loss_sum = 0.0;                    // sum of the per-token losses on this rank
    double seconds_summing = 0.0;             // worker 0's share of waiting at barriers and summing
    double seconds_after_backward = 0.0;      // overlapped allreduce: the part left after backward
    std::vector<double> seconds_at_barriers;  // per worker: waiting for the others
};
[[nodiscard]] GradientPass accumulate_gradients(const Model& model, WorkerGroup& workers,
                                                const StepBatch& batch,
                                                const GradientReady& ready = {});

// Test hooks for the skip paths: a non-finite gradient, or one scaled by 10^4 (a norm spike).
enum class InjectedFault { none, nan_gradient, gradient_spike };

// Forward/backward over all micro-batches, gradient reduction across workers and ranks, and the
// AdamW update; skipped, with gradients cleared, when the loss or norm is not finite or, with a
// `guard`, when its z-score says the step is a spike (every rank judges the same numbers).
[[nodiscard]] StepMetrics train_step(Model& model, AdamWState& optimizer, WorkerGroup& workers,
                                     const Communicator& comm, const StepBatch& batch,
                                     const StepHyper& hyper,
                                     InjectedFault fault = InjectedFault::none,
                                     SpikeGuard* guard = nullptr);

// Mean loss over `num_batches` micro-batches of this rank's tokens, averaged over all ranks.
[[nodiscard]] double evaluate(const Model& model, WorkerGroup& workers, const Communicator& comm,
                              std::span<const std::int32_t> inputs,
                              std::span<const std::int32_t> targets, int num_batches);

}  // namespace gpt2
