// AdamW with decoupled weight decay on the 2-D matrices, over ranges of the flat parameter and
// gradient buffers so that worker threads can each update a slice; the AdamW optimizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "model/model.hpp"
#include "optim/optimizer.hpp"

namespace gpt2 {

// One AdamW update of the elements [begin, end) (inside the state's range): the gradient is
// multiplied by grad_scale, and zeroed once consumed so the buffer is ready for the next step's
// accumulation. `t` is the 1-based step number used for bias correction. A non-empty `params_bf16`
// (bf16 training) receives the rounded updated parameters in the same pass.
void adamw_update_range(const ParameterLayout& layout, std::span<float> params,
                        std::span<float> grads, OptimizerState& state, std::size_t begin,
                        std::size_t end, const AdamWHyper& hyper, std::int64_t t, float grad_scale,
                        std::span<Bf16> params_bf16 = {});

// The same over a buffer of matrices only (a LoRA adapter: every element is weight-decayed).
void adamw_update_matrices(std::span<float> params, std::span<float> grads, OptimizerState& state,
                           std::size_t begin, std::size_t end, const AdamWHyper& hyper,
                           std::int64_t t, float grad_scale);

// AdamW on every parameter it owns (decayed where the layout says: the 2-D matrices).
class AdamW final : public Optimizer {
  public:
    explicit AdamW(std::size_t count, std::size_t first = 0) : Optimizer(count, first) {}
    [[nodiscard]] OptimizerKind kind() const override { return OptimizerKind::AdamW; }
    void update(const UpdateTarget& target, const StepRates& rates, ThreadPool& pool) override;
};

}  // namespace gpt2
