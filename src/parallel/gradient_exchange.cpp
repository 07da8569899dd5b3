#include "parallel/gradient_exchange.hpp"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "ops/sum_of_squares.hpp"

namespace gpt2::exchange_detail {

void owned_block_sums(std::span<float> gradient, Range owned, WorkerGroup& workers,
                      bool clear_others, std::span<float> block_sums) {
    // An empty slice (more ranks than blocks) owns no block wherever it lies.
    const bool empty = owned.begin == owned.end;
    if ((!empty && owned.begin % kNormBlock != 0) ||
        block_sums.size() != norm_blocks(gradient.size())) {
        throw std::invalid_argument("owned_block_sums: a slice that cuts a norm block");
    }
    const int W = workers.size();
    const std::size_t P = gradient.size();
    const std::size_t first_block = owned.begin / kNormBlock;
    const std::size_t blocks = empty ? 0 : norm_blocks(owned.end) - first_block;
    workers.pool().run([&](int w) {
        const Range r = split_range(blocks, w, W);
        for (std::size_t b = first_block + r.begin; b < first_block + r.end; ++b) {
            const std::size_t begin = b * kNormBlock;
            const std::size_t end = std::min(begin + kNormBlock, owned.end);
            // One block's sum: a float in double, exactly.
            block_sums[b] =
                static_cast<float>(sum_of_squares(gradient.subspan(begin, end - begin)));
        }
        if (!clear_others) return;
        for (const Range other : {Range{0, owned.begin}, Range{owned.end, P}}) {
            const Range z = split_range(other.end - other.begin, w, W);
            std::fill(gradient.begin() + static_cast<std::ptrdiff_t>(other.begin + z.begin),
                      gradient.begin() + static_cast<std::ptrdiff_t>(other.begin + z.end), 0.0f);
        }
    });
}

double norm_squared_in_blocks(std::span<float> gradient, Range owned, WorkerGroup& workers,
                              bool clear_others, const Communicator* ranks, bool counts) {
    std::vector<float> block_sums(norm_blocks(gradient.size()), 0.0f);
    owned_block_sums(gradient, counts ? owned : Range{owned.begin, owned.begin}, workers,
                     clear_others, block_sums);
    if (ranks != nullptr) ranks->allreduce_sum(std::span<float>(block_sums));
    return sum_in_block_order(block_sums);
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

double sum_in_block_order(std::span<const float> block_sums) {
    double total = 0.0;
    for (const float block : block_sums)
        total += block;
    return total;
}

TrainedParameters GradientExchange::trained(Model& model) {
    return {model.params.span(), model.params_bf16.span(), &model.layout};
}

std::span<float> GradientExchange::rank_gradient(WorkerGroup& workers) {
    return workers.gradient();
}

}  // namespace gpt2
