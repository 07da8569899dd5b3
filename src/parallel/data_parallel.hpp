// One data-parallel training step: the workers' forward/backward (worker_group.hpp), the
// gradient summed across ranks in the run's one way of exchanging it, and the same clipped AdamW
// update on every rank (or on each rank's slice).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "core/range.hpp"
#include "model/model.hpp"
#include "model/optimizer.hpp"
#include "model/spike_guard.hpp"
#include "parallel/comm.hpp"
#include "parallel/worker_group.hpp"

namespace gpt2 {

// How a step sums the gradient across ranks and which weights each rank updates; decided once
// for a run (the train layer chooses from the flags and where the ranks run).
enum class GradientExchange {
    Allreduce,           // one allreduce after backward; every rank updates all weights
    AllreduceBuckets,    // allreduce in buckets while backward runs; every rank updates all
    ZeroReduceScatter,   // ZeRO-1: one reduce-scatter after backward, each rank updates its
                         // slice of the weights, then they are allgathered
    ZeroBuckets,         // ZeRO-1 with AllreduceBuckets' exchange; each rank keeps its slice's sum
    SharedMemory,        // the ranks of a machine share one copy of the weights
                         // (share_replica_memory) and each sums and updates its slice after
                         // backward; on several machines each slice then takes one allreduce
    SharedMemoryBuckets  // several machines: each slice summed on the machine and allreduced
                         // across machines in buckets while backward runs
};
[[nodiscard]] std::string_view exchange_name(GradientExchange exchange);

struct StepHyper {
    AdamWHyper adamw;
    float grad_clip = 1.0f;  // max global gradient norm; <= 0 disables clipping
    GradientExchange exchange = GradientExchange::Allreduce;
    // The *Buckets exchanges: floats per bucket.
    std::size_t bucket_floats = 0;
    // Zero* and SharedMemory*: each rank's slice of the flat parameters, one per rank; this
    // rank's optimizer state holds only its slice. Empty otherwise.
    std::span<const Range> update_slices{};
    // SharedMemory* on several machines: the ranks of this machine share the weights, and each
    // slice is summed with the ranks owning it on the other machines. Null: the ranks that share
    // memory are the world.
    const MachineGroups* machines = nullptr;
};

// Where a step's time went on this rank (seconds), for --log-level debug.
struct StepTimings {
    double forward_backward = 0.0;
    double thread_reduction = 0.0;  // worker 0 waiting for and summing the workers' gradients
    double allreduce = 0.0;  // after backward: the gradient's (rest of the) exchange, the loss's
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

// Test hooks for the skip paths: a non-finite gradient, or one scaled by 10^4 (a norm spike).
enum class InjectedFault { None, NanGradient, GradientSpike };

// What tests may do inside a step: inject a fault into the gradient before it travels, and see
// the gradient the update is about to use.
struct StepTestHooks {
    InjectedFault fault = InjectedFault::None;
    // Called after the exchange with this rank's summed gradient, before clipping (the global
    // sum in the rank's owned elements: all of them, or its slice under ZeRO-1 and shared
    // memory), and the global norm.
    std::function<void(std::span<const float> gradient, double grad_norm)> inspect_gradient;
};

// Forward/backward over all micro-batches, gradient reduction across workers and ranks, and the
// AdamW update; skipped, with gradients cleared, when the loss or norm is not finite or, with a
// `guard`, when its z-score says the step is a spike (every rank judges the same numbers).
[[nodiscard]] StepMetrics train_step(Model& model, AdamWState& optimizer, WorkerGroup& workers,
                                     const Communicator& comm, const StepBatch& batch,
                                     const StepHyper& hyper, const StepTestHooks& hooks = {},
                                     SpikeGuard* guard = nullptr);

// Writes window `window`'s T inputs and their T next-token targets (T = the workers' seq_len).
// Called by several workers at once.
using WindowReader = std::function<void(std::uint64_t window, std::span<std::int32_t> inputs,
                                        std::span<std::int32_t> targets)>;

// What evaluate() measured: the mean per-token loss over `tokens` tokens (windows x T).
struct Evaluation {
    double loss = 0.0;
    std::int64_t tokens = 0;
};

// The mean loss over windows 0 .. windows-1 of the validation data, the same bits for any batch
// size, thread count and rank count: each window is one forward of its own (one sequence, so no
// matrix product ever sees it among other rows), wherever it runs; the windows are divided among
// the ranks and their workers, each window's loss lands at its index, and every rank adds them in
// index order after an allreduce in which each index has one non-zero contributor (exact).
[[nodiscard]] Evaluation evaluate(const Model& model, WorkerGroup& workers,
                                  const Communicator& comm, std::uint64_t windows,
                                  const WindowReader& read_window);

}  // namespace gpt2
