// One copy of the weights for all ranks of a machine: the weights, their bf16 copy and every
// rank's gradient buffer in memory all of them map, the sums over those buffers, and the gradient
// exchange that trains that way (each rank sums and updates its slice; across machines each slice
// is summed with the same slice of the other machines).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/range.hpp"
#include "model/model.hpp"
#include "parallel/comm.hpp"
#include "parallel/gradient_buckets.hpp"
#include "parallel/gradient_exchange.hpp"
#include "parallel/worker_group.hpp"

namespace gpt2 {

// Every rank's gradient buffer and its count of completed gradient parts (in rank order, in the
// shared memory; only its own rank increases a count), all mapped in this process.
struct SharedGradients {
    std::vector<float*> buffers;
    std::vector<std::uint64_t*> progress;
};

// Ranks on one machine can train one copy of the weights instead of one each. This moves the
// weights (and their bf16 copy) and every rank's gradient buffer into memory all of them map
// (collective). A step then sums the gradient without MPI: each rank adds its slice
// (as under ZeRO-1) of every rank's buffer into rank 0's (after backward, or across machines part
// by part while backward runs), and AdamW updates that slice of the shared weights. Fills
// `shared`, or returns why not on failure, leaving everything as it was. `comm` is the ranks of
// one machine; across machines each machine shares its own copy.
[[nodiscard]] std::string share_replica_memory(Model& model, WorkerGroup& workers,
                                               const Communicator& comm, SharedGradients& shared);
// Back to the rank's own memory (weights copied, gradient zero): when another machine could not
// share, so that every rank trains alike.
void unshare_replica_memory(Model& model, WorkerGroup& workers);

// `ranges` of every rank's gradient (`all`, in rank order) summed into rank 0's buffer, in rank
// order (the same sum whichever rank computes it), clearing the others' for the next step.
void sum_shared_ranges(std::span<float* const> all, std::span<const Range> ranges);

// The ranks of each machine train one copy of the weights in shared memory (share_replica_memory).
class SharedMemoryExchange final : public GradientExchange {
  public:
    // `slices`: every world rank's slice of the flat parameters (its machine's share), in rank
    // order. `machines` null: the world is one machine. Otherwise each slice summed on its machine
    // is also summed with the ranks owning it on the other machines: in buckets of `bucket_floats`
    // while backward runs, or (0) one allreduce after backward.
    SharedMemoryExchange(const Communicator& world, SharedGradients shared,
                         std::vector<Range> slices, const MachineGroups* machines,
                         std::size_t bucket_floats);

    [[nodiscard]] GradientPass backward(const Model& model, WorkerGroup& workers,
                                        const StepBatch& batch, bool overlap) override;
    [[nodiscard]] std::span<float> finish(WorkerGroup& workers) override;
    [[nodiscard]] double norm_squared(std::span<float> gradient, WorkerGroup& workers) override;
    void publish(Model& model, WorkerGroup& workers) override;
    void discard(std::span<float> gradient, WorkerGroup& workers) override;
    [[nodiscard]] Range owned() const override {
        return slices_[static_cast<std::size_t>(world_.rank())];
    }
    [[nodiscard]] const Communicator& world() const override { return world_; }
    // Every rank's gradient buffer on this machine, in rank order (tests).
    [[nodiscard]] std::span<float* const> rank_gradients() const { return shared_.buffers; }

  private:
    // The ranks that share this machine's memory.
    [[nodiscard]] const Communicator& machine() const {
        return machines_ != nullptr ? machines_->machine : world_;
    }
    const Communicator& world_;
    SharedGradients shared_;
    std::vector<Range> slices_;
    const MachineGroups* machines_;
    std::size_t bucket_floats_;
    std::unique_ptr<OverlapState> overlap_;  // across machines, in buckets
    bool overlapped_ = false;                // the last backward sent the slices
};

}  // namespace gpt2
