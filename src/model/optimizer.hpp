// AdamW with decoupled weight decay on the 2-D matrices, and global-norm gradient clipping, over
// ranges of the flat parameter/gradient buffers so worker threads can each update a slice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/aligned_buffer.hpp"
#include "model/model.hpp"

namespace gpt2 {

struct AdamWHyper {
    float lr = 3e-4f;
    float beta1 = 0.9f;
    float beta2 = 0.95f;
    float eps = 1e-8f;
    float weight_decay = 0.0f;
};

// The moments of the parameters [first, first + count) of the flat layout (all of them, or one
// rank's slice under ZeRO-1), and the number of updates made so far.
struct AdamWState {
    AlignedBuffer<float> m;
    AlignedBuffer<float> v;
    std::int64_t step = 0;
    std::size_t first = 0;

    explicit AdamWState(std::size_t count, std::size_t first_param = 0)
        : m(count), v(count), first(first_param) {}
};

// Sum of squares, accumulated in double.
[[nodiscard]] double sum_of_squares(std::span<const float> x);

// The factor clipping applies to gradients with global norm `norm` (PyTorch's clip_grad_norm_
// rule: max_norm / (norm + 1e-6) when that is below 1). max_norm <= 0 disables clipping.
[[nodiscard]] float clip_scale(double norm, float max_norm);

// One AdamW update of the elements [begin, end) (inside the state's range): the gradient is
// multiplied by grad_scale, and zeroed once consumed so the buffer is ready for the next step's
// accumulation. `t` is the 1-based step number used for bias correction. A non-empty `params_bf16`
// (bf16 training) receives the rounded updated parameters in the same pass.
void adamw_update_range(const ParameterLayout& layout, std::span<float> params,
                        std::span<float> grads, AdamWState& state, std::size_t begin,
                        std::size_t end, const AdamWHyper& hyper, std::int64_t t, float grad_scale,
                        std::span<Bf16> params_bf16 = {});

// The same over a buffer of matrices only (a LoRA adapter: every element is weight-decayed).
void adamw_update_matrices(std::span<float> params, std::span<float> grads, AdamWState& state,
                           std::size_t begin, std::size_t end, const AdamWHyper& hyper,
                           std::int64_t t, float grad_scale);

}  // namespace gpt2
