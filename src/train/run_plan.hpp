// The run's plan before its first step: gradient accumulation, the lineage, and where a resumed
// run continues (rank 0 reads the checkpoint's state; every rank receives what it needs).
#pragma once

#include <cstdint>

#include "core/random.hpp"
#include "optim/spike_guard.hpp"
#include "parallel/comm.hpp"
#include "train/options.hpp"
#include "train/replica.hpp"
#include "train/start_point.hpp"

namespace gpt2 {

// Plain values the step loop runs on, fixed before it starts.
struct RunPlan {
    int grad_accum = 1;
    std::int64_t global_sequences = 0;  // per optimizer step, all ranks
    std::int64_t first_step = 0;
    std::int64_t decay_steps = 0;  // the schedule's length
    std::uint64_t run_id = 0;      // the lineage (rank 0's; only rank 0 writes checkpoints)
    bool resumed = false;
    Rng sample_rng{0};
    SpikeGuard spikes;  // --skip-loss-z / --skip-norm-z and their windows (resumed)
};

// Collective. A fresh lineage and schedule, or the resume state of the checkpoint we start from:
// step, the replica's optimizer moments (its slice of them) and schedule length.
[[nodiscard]] RunPlan plan_run(const TrainOptions& o, const Communicator& comm,
                               const StartPoint& start, Replica& replica);

// Rank 0: a warning when the warmup is not shorter than the run.
void warn_about_schedule(const TrainOptions& o, const RunPlan& plan);

}  // namespace gpt2
