// The overlapped gradient exchange: parts of the gradient travel in buckets on the communication
// thread (BackgroundAllreduce) while backward is still computing the rest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/range.hpp"
#include "model/model.hpp"
#include "parallel/comm.hpp"
#include "parallel/worker_group.hpp"

namespace gpt2 {

// Kept across steps (WorkerGroup::overlap_state): the communication thread, and the last
// micro-batch's embedding rows, this rank's and every rank's.
struct OverlapState {
    std::unique_ptr<BackgroundAllreduce> allreduce;
    std::vector<float> rows, all_rows;
    std::vector<std::int32_t> tokens, all_tokens;
};

// The whole gradient allreduced across `comm` in buckets of `bucket_floats` as backward completes
// its parts; on return workers.gradient() holds the sum.
[[nodiscard]] GradientPass overlapped_gradients(const Model& model, WorkerGroup& workers,
                                                const Communicator& comm, const StepBatch& batch,
                                                std::size_t bucket_floats);

// Shared memory on several machines: as each part of the gradient is complete on this rank, the
// communication thread waits until every rank of the machine has it, sums this rank's slice
// (`owned`) of it over their buffers into the machine's sum (rank 0's buffer) and allreduces it,
// in buckets, with the ranks that own the same slice on the other machines.
[[nodiscard]] GradientPass overlapped_slices(const Model& model, WorkerGroup& workers,
                                             const Communicator& comm,
                                             const MachineGroups& machines, const StepBatch& batch,
                                             Range owned, std::size_t bucket_floats);

}  // namespace gpt2
