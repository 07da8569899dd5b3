// LoRA's exchange: the base model is frozen, so only the adapter's gradient (megabytes, not the
// model) is summed over the workers in worker order and over the ranks in one allreduce, and
// every rank updates the whole adapter.
#pragma once

#include <vector>

#include "core/aligned_buffer.hpp"
#include "parallel/gradient_exchange.hpp"

namespace gpt2 {

class AdapterExchange final : public GradientExchange {
  public:
    // `adapter_floats`: model.lora->layout.total(); one gradient buffer per worker.
    AdapterExchange(const Communicator& comm, std::size_t adapter_floats, int workers);

    [[nodiscard]] GradientPass backward(const Model& model, WorkerGroup& workers,
                                        const StepBatch& batch, bool overlap) override;
    [[nodiscard]] std::span<float> finish(WorkerGroup& workers) override;
    [[nodiscard]] double norm_squared(std::span<float> gradient, WorkerGroup& workers) override;
    [[nodiscard]] TrainedParameters trained(Model& model) override;
    void publish(Model& model, WorkerGroup& workers) override;
    void discard(std::span<float> gradient, WorkerGroup& workers) override;
    [[nodiscard]] Range owned() const override { return Range{0, floats_}; }
    [[nodiscard]] const Communicator& world() const override { return comm_; }
    // The rank's summed adapter gradient (tests inject faults into it).
    [[nodiscard]] std::span<float> gradient() { return per_worker_.front().span(); }
    [[nodiscard]] std::span<float> rank_gradient(WorkerGroup& /*workers*/) override {
        return gradient();
    }

  private:
    const Communicator& comm_;
    std::size_t floats_;
    std::vector<AlignedBuffer<float>> per_worker_;  // [0] receives the sum
};

}  // namespace gpt2
