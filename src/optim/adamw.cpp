#include "optim/adamw.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>

#include "threads/thread_pool.hpp"

namespace gpt2 {

namespace {
// `p_bf16`, when not null, receives the rounded new parameters in the same pass (bf16 training
// reads them in the next step's products), so the weights are read and written once per step.
template <bool kWithBf16>
void adamw_kernel(float* __restrict p, Bf16* __restrict p_bf16, float* __restrict g,
                  float* __restrict m, float* __restrict v, std::size_t n, float lr, float beta1,
                  float beta2, float eps, float decay_factor, float inv_bias1, float inv_sqrt_bias2,
                  float grad_scale) {
    for (std::size_t i = 0; i < n; ++i) {
        const float grad = g[i] * grad_scale;
        const float mi = beta1 * m[i] + (1.0f - beta1) * grad;
        const float vi = beta2 * v[i] + (1.0f - beta2) * grad * grad;
        const float denom = std::sqrt(vi) * inv_sqrt_bias2 + eps;
        const float updated = p[i] * decay_factor - lr * inv_bias1 * mi / denom;
        p[i] = updated;
        if constexpr (kWithBf16) p_bf16[i] = to_bf16(updated);
        m[i] = mi;
        v[i] = vi;
        g[i] = 0.0f;
    }
}
}  // namespace

void adamw_update_range(const ParameterLayout& layout, std::span<float> params,
                        std::span<float> grads, OptimizerState& state, std::size_t begin,
                        std::size_t end, const AdamWHyper& h, std::int64_t t, float grad_scale,
                        std::span<Bf16> params_bf16) {
    const float inv_bias1 =
        1.0f / (1.0f - static_cast<float>(std::pow(static_cast<double>(h.beta1), t)));
    const float inv_sqrt_bias2 =
        1.0f / std::sqrt(1.0f - static_cast<float>(std::pow(static_cast<double>(h.beta2), t)));
    if (begin < state.first || end > state.first + state.m.size()) {
        throw std::invalid_argument("adamw_update_range: elements outside the optimizer's range");
    }
    for (int i = 0; i < kNumParamTensors; ++i) {
        const auto tensor = static_cast<ParamTensor>(i);
        const std::size_t lo = std::max(begin, layout.offset(tensor));
        const std::size_t hi = std::min(end, layout.offset(tensor) + layout.size(tensor));
        if (lo >= hi) continue;
        const float wd = layout.decays(tensor) ? h.weight_decay : 0.0f;
        const auto kernel = params_bf16.empty() ? adamw_kernel<false> : adamw_kernel<true>;
        kernel(params.data() + lo, params_bf16.empty() ? nullptr : params_bf16.data() + lo,
               grads.data() + lo, state.m.data() + (lo - state.first),
               state.v.data() + (lo - state.first), hi - lo, h.lr, h.beta1, h.beta2, h.eps,
               1.0f - h.lr * wd, inv_bias1, inv_sqrt_bias2, grad_scale);
    }
}

void adamw_update_matrices(std::span<float> params, std::span<float> grads, OptimizerState& state,
                           std::size_t begin, std::size_t end, const AdamWHyper& h, std::int64_t t,
                           float grad_scale) {
    const float inv_bias1 =
        1.0f / (1.0f - static_cast<float>(std::pow(static_cast<double>(h.beta1), t)));
    const float inv_sqrt_bias2 =
        1.0f / std::sqrt(1.0f - static_cast<float>(std::pow(static_cast<double>(h.beta2), t)));
    if (begin < state.first || end > state.first + state.m.size()) {
        throw std::invalid_argument(
            "adamw_update_matrices: elements outside the optimizer's range");
    }
    if (begin >= end) return;
    adamw_kernel<false>(params.data() + begin, nullptr, grads.data() + begin,
                        state.m.data() + (begin - state.first),
                        state.v.data() + (begin - state.first), end - begin, h.lr, h.beta1, h.beta2,
                        h.eps, 1.0f - h.lr * h.weight_decay, inv_bias1, inv_sqrt_bias2, grad_scale);
}

void AdamW::update(const UpdateTarget& target, const StepRates& rates, ThreadPool& pool) {
    const std::int64_t t = ++state.step;
    const Range owned = target.owned;
    const int W = pool.size();
    pool.run([&](int w) {
        const Range r = split_range(owned.end - owned.begin, w, W);
        if (target.layout != nullptr) {
            adamw_update_range(*target.layout, target.params, target.gradient, state,
                               owned.begin + r.begin, owned.begin + r.end, rates.adamw, t,
                               rates.grad_scale, target.params_bf16);
        } else {
            adamw_update_matrices(target.params, target.gradient, state, owned.begin + r.begin,
                                  owned.begin + r.end, rates.adamw, t, rates.grad_scale);
        }
    });
}

}  // namespace gpt2
