// The overlapped gradient exchange: parts of the gradient travel in buckets on the communication
// thread (BackgroundAllreduce) while backward is still computing the rest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/range.hpp"
#include "model/model.hpp"
#include "parallel/comm.hpp"
#include "parallel/worker_group.hpp"

namespace gpt2 {

// What an overlapping exchange keeps across steps: the communication thread that sums buckets
// across `comm`, and the last micro-batch's embedding rows, this rank's and every rank's.
struct OverlapState {
    explicit OverlapState(const Communicator& comm) : allreduce(comm) {}
    BackgroundAllreduce allreduce;
    std::vector<float> rows, all_rows;
    std::vector<std::int32_t> tokens, all_tokens;
};

// The whole gradient allreduced across the state's communicator in buckets of `bucket_floats` as
// backward completes its parts; on return workers.gradient() holds the sum.
[[nodiscard]] GradientPass overlapped_gradients(const Model& model, WorkerGroup& workers,
                                                OverlapState& state, const StepBatch& batch,
                                                std::size_t bucket_floats);

// The backward of an exchange that may allreduce the whole gradient in buckets while backward runs
// (AllreduceExchange, ZeroExchange): overlapped_gradients, or accumulate_gradients for one
// collective after backward when there are no buckets or a step does not overlap.
class BucketedBackward {
  public:
    // `bucket_floats` 0: no buckets; else they need several ranks in `comm` (std::invalid_argument
    // naming `exchange` otherwise).
    BucketedBackward(const Communicator& comm, std::size_t bucket_floats,
                     std::string_view exchange);

    [[nodiscard]] GradientPass run(const Model& model, WorkerGroup& workers, const StepBatch& batch,
                                   bool overlap);
    // Whether the last run sent the gradient: workers.gradient() already holds the sum.
    [[nodiscard]] bool sent() const { return sent_; }

  private:
    std::size_t bucket_floats_;
    std::unique_ptr<OverlapState> overlap_;  // with buckets
    bool sent_ = false;
};

// Shared memory on several machines: as each part of the gradient is complete on this rank, the
// communication thread (the state's, across machines) waits until every rank of the machine has
// it (`rank_progress`, in the shared memory), sums this rank's slice (`owned`) of it over their
// buffers (`rank_gradients`) into the machine's sum (rank 0's buffer) and allreduces it, in
// buckets, with the ranks that own the same slice on the other machines. `world` gathers the
// embedding rows.
[[nodiscard]] GradientPass overlapped_slices(const Model& model, WorkerGroup& workers,
                                             OverlapState& state, const Communicator& world,
                                             const MachineGroups& machines, const StepBatch& batch,
                                             Range owned, std::size_t bucket_floats,
                                             std::span<float* const> rank_gradients,
                                             std::span<std::uint64_t* const> rank_progress);

}  // namespace gpt2
