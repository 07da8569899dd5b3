#include "parallel/gradient_exchange.hpp"

#include <algorithm>

namespace gpt2::exchange_detail {

double owned_norm_squared(std::span<float> gradient, Range owned, WorkerGroup& workers,
                          bool clear_others) {
    const int W = workers.size();
    const std::span<WorkerPartial> sums = workers.partials();
    const std::size_t P = gradient.size();
    workers.pool().run([&](int w) {
        const Range r = split_range(owned.end - owned.begin, w, W);
        sums[static_cast<std::size_t>(w)].value =
            sum_of_squares(gradient.subspan(owned.begin + r.begin, r.end - r.begin));
        if (!clear_others) return;
        for (const Range other : {Range{0, owned.begin}, Range{owned.end, P}}) {
            const Range z = split_range(other.end - other.begin, w, W);
            std::fill(gradient.begin() + static_cast<std::ptrdiff_t>(other.begin + z.begin),
                      gradient.begin() + static_cast<std::ptrdiff_t>(other.begin + z.end), 0.0f);
        }
    });
    double norm_sq = 0.0;
    for (const WorkerPartial& s : sums)
        norm_sq += s.value;
    return norm_sq;
}

void update_owned(Model& model, AdamWState& optimizer, std::span<float> gradient, Range owned,
                  const AdamWHyper& hyper, float clip, WorkerGroup& workers) {
    const int W = workers.size();
    const std::int64_t t = ++optimizer.step;
    const std::span<float> params = model.params.span();
    const std::span<Bf16> params_bf16 = model.params_bf16.span();  // empty in fp32
    workers.pool().run([&](int w) {
        const Range r = split_range(owned.end - owned.begin, w, W);
        adamw_update_range(model.layout, params, gradient, optimizer, owned.begin + r.begin,
                           owned.begin + r.end, hyper, t, clip, params_bf16);
    });
}

void clear_owned(std::span<float> gradient, Range owned, WorkerGroup& workers) {
    const int W = workers.size();
    workers.pool().run([&](int w) {
        const Range r = split_range(owned.end - owned.begin, w, W);
        std::fill(gradient.begin() + static_cast<std::ptrdiff_t>(owned.begin + r.begin),
                  gradient.begin() + static_cast<std::ptrdiff_t>(owned.begin + r.end), 0.0f);
    });
}

}  // namespace gpt2::exchange_detail

namespace gpt2 {

std::span<float> GradientExchange::rank_gradient(WorkerGroup& workers) {
    return workers.gradient();
}

}  // namespace gpt2
