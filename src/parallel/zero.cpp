#include "parallel/zero.hpp"

#include <stdexcept>

namespace gpt2 {

using namespace exchange_detail;

namespace {
std::vector<Range> one_slice_per_rank(std::vector<Range> slices, const Communicator& comm) {
    if (slices.size() != static_cast<std::size_t>(comm.size())) {
        throw std::invalid_argument("ZeroExchange: one slice per rank");
    }
    return slices;
}
}  // namespace

// Open MPI 4.1's non-blocking reduce-scatter (a binomial reduce, then a linear scatter) measured
// slower over a 1 Gbit/s link than the blocking one, while the ring allreduce of buckets overlaps:
// in buckets, the whole gradient is allreduced and each rank keeps its slice.
ZeroExchange::ZeroExchange(const Communicator& comm, std::vector<Range> slices,
                           std::size_t bucket_floats)
    : comm_(comm),
      slices_(one_slice_per_rank(std::move(slices), comm)),
      backward_(comm, bucket_floats, "ZeroExchange") {}

GradientPass ZeroExchange::backward(const Model& model, WorkerGroup& workers,
                                    const StepBatch& batch, bool overlap) {
    return backward_.run(model, workers, batch, overlap);
}

std::span<float> ZeroExchange::finish(WorkerGroup& workers) {
    if (!backward_.sent()) comm_.reduce_scatter_sum(workers.gradient(), slices_);
    return workers.gradient();
}

double ZeroExchange::norm_squared(std::span<float> gradient, WorkerGroup& workers) {
    // The rest of the buffer holds this rank's partial sums: cleared for the next step.
    return norm_squared_in_blocks(gradient, owned(), workers, true, &comm_);
}

void ZeroExchange::publish(Model& model, WorkerGroup& workers) {
    const Range mine = owned();
    const std::span<float> params = model.params.span();
    comm_.allgather_slices(params, slices_);
    const std::span<Bf16> params_bf16 = model.params_bf16.span();  // empty in fp32
    if (params_bf16.empty()) return;
    const int W = workers.size();
    const std::size_t P = params.size();
    workers.pool().run([&](int w) {
        for (const Range other : {Range{0, mine.begin}, Range{mine.end, P}}) {
            const Range z = split_range(other.end - other.begin, w, W);
            convert_to_bf16(params_bf16.data() + other.begin + z.begin,
                            params.data() + other.begin + z.begin, z.end - z.begin);
        }
    });
}

void ZeroExchange::discard(std::span<float> gradient, WorkerGroup& workers) {
    clear_owned(gradient, owned(), workers);
}

}  // namespace gpt2
