// ZeRO-1: each rank keeps the AdamW moments of its slice of the weights only. The gradient is
// reduce-scattered after backward (or allreduced in buckets while backward runs, each rank keeping
// its slice), each rank updates its slice, and the slices are allgathered.
#pragma once

#include <cstddef>
#include <vector>

#include "parallel/gradient_buckets.hpp"
#include "parallel/gradient_exchange.hpp"

namespace gpt2 {

class ZeroExchange final : public GradientExchange {
  public:
    // `slices`: every rank's slice of the flat parameters, in rank order. `bucket_floats` 0: one
    // reduce-scatter after backward; else buckets allreduced while backward runs.
    ZeroExchange(const Communicator& comm, std::vector<Range> slices, std::size_t bucket_floats);

    [[nodiscard]] GradientPass backward(const Model& model, WorkerGroup& workers,
                                        const StepBatch& batch, bool overlap) override;
    [[nodiscard]] std::span<float> finish(WorkerGroup& workers) override;
    [[nodiscard]] double norm_squared(std::span<float> gradient, WorkerGroup& workers) override;
    void publish(Model& model, WorkerGroup& workers) override;
    void discard(std::span<float> gradient, WorkerGroup& workers) override;
    [[nodiscard]] Range owned() const override {
        return slices_[static_cast<std::size_t>(comm_.rank())];
    }
    [[nodiscard]] const Communicator& world() const override { return comm_; }

  private:
    const Communicator& comm_;
    std::vector<Range> slices_;
    BucketedBackward backward_;
};

}  // namespace gpt2
