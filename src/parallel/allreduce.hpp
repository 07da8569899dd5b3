// Plain data parallelism: every rank sums the whole gradient with the others (one allreduce
// after backward, or buckets sent while backward runs) and updates all of the weights.
#pragma once

#include <cstddef>

#include "parallel/gradient_buckets.hpp"
#include "parallel/gradient_exchange.hpp"

namespace gpt2 {

class AllreduceExchange final : public GradientExchange {
  public:
    // `bucket_floats` 0: one allreduce after backward; else buckets of that many floats, each
    // sent on the communication thread as backward completes it (needs comm.serialized_threads()
    // and several ranks).
    AllreduceExchange(const Communicator& comm, std::size_t parameters, std::size_t bucket_floats);

    [[nodiscard]] GradientPass backward(const Model& model, WorkerGroup& workers,
                                        const StepBatch& batch, bool overlap) override;
    [[nodiscard]] std::span<float> finish(WorkerGroup& workers) override;
    [[nodiscard]] double norm_squared(std::span<float> gradient, WorkerGroup& workers) override;
    void publish(Model& model, WorkerGroup& workers) override;
    void discard(std::span<float> gradient, WorkerGroup& workers) override;
    [[nodiscard]] Range owned() const override { return Range{0, parameters_}; }
    [[nodiscard]] const Communicator& world() const override { return comm_; }

  private:
    const Communicator& comm_;
    std::size_t parameters_;
    BucketedBackward backward_;
};

}  // namespace gpt2
