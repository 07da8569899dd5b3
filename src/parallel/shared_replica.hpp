// One copy of the weights for all ranks of a machine: the weights, their bf16 copy and every
// rank's gradient buffer in memory all of them map, and the sums over those buffers.
#pragma once

#include <span>
#include <string>

#include "core/range.hpp"
#include "model/model.hpp"
#include "parallel/comm.hpp"
#include "parallel/worker_group.hpp"

namespace gpt2 {

// Ranks on one machine can train one copy of the weights instead of one each. This moves the
// weights (and their bf16 copy) and every rank's gradient buffer into memory all of them map
// (collective). A step then sums the gradient without MPI: each rank adds its slice
// (StepHyper::update_slices, as under ZeRO-1) of every rank's buffer into rank 0's (after
// backward, or across machines part by part while backward runs), and AdamW updates that slice of
// the shared weights. Returns why not on failure, leaving everything as it was.
// `comm` is the ranks of one machine; across machines each machine shares its own copy.
[[nodiscard]] std::string share_replica_memory(Model& model, WorkerGroup& workers,
                                               const Communicator& comm);
// Back to the rank's own memory (weights copied, gradient zero): when another machine could not
// share, so that every rank trains alike.
void unshare_replica_memory(Model& model, WorkerGroup& workers);

// `ranges` of every rank's gradient (`all`, in rank order) summed into rank 0's buffer, in rank
// order (the same sum whichever rank computes it), clearing the others' for the next step.
void sum_shared_ranges(std::span<float* const> all, std::span<const Range> ranges);

// After backward: this rank's slice of every rank's gradient summed into rank 0's buffer
// (sum_shared_ranges), divided among the workers.
void sum_shared_gradients(WorkerGroup& workers, Range owned);

}  // namespace gpt2
