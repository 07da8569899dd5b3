#include "parallel/allreduce.hpp"

namespace gpt2 {

using namespace exchange_detail;

AllreduceExchange::AllreduceExchange(const Communicator& comm, std::size_t parameters,
                                     std::size_t bucket_floats)
    : comm_(comm), parameters_(parameters), backward_(comm, bucket_floats, "AllreduceExchange") {}

GradientPass AllreduceExchange::backward(const Model& model, WorkerGroup& workers,
                                         const StepBatch& batch, bool overlap) {
    return backward_.run(model, workers, batch, overlap);
}

std::span<float> AllreduceExchange::finish(WorkerGroup& workers) {
    if (!backward_.sent()) comm_.allreduce_sum(workers.gradient());
    return workers.gradient();
}

double AllreduceExchange::norm_squared(std::span<float> gradient, WorkerGroup& workers) {
    return norm_squared_in_blocks(gradient, owned(), workers, false,
                                  nullptr);  // every rank holds it
}

void AllreduceExchange::publish(Model& /*model*/, WorkerGroup& /*workers*/) {
    // Every rank updated all of the weights alike.
}

void AllreduceExchange::discard(std::span<float> gradient, WorkerGroup& workers) {
    clear_owned(gradient, owned(), workers);
}

}  // namespace gpt2
