#include "parallel/allreduce.hpp"

#include <stdexcept>

namespace gpt2 {

using namespace exchange_detail;

AllreduceExchange::AllreduceExchange(const Communicator& comm, std::size_t parameters,
                                     std::size_t bucket_floats)
    : comm_(comm), parameters_(parameters), bucket_floats_(bucket_floats) {
    if (bucket_floats_ > 0) {
        if (comm.size() < 2) {
            throw std::invalid_argument("AllreduceExchange: buckets need several ranks");
        }
        overlap_ = std::make_unique<OverlapState>(comm);
    }
}

GradientPass AllreduceExchange::backward(const Model& model, WorkerGroup& workers,
                                         const StepBatch& batch, bool overlap) {
    overlapped_ = overlap && overlap_ != nullptr;
    return overlapped_ ? overlapped_gradients(model, workers, *overlap_, batch, bucket_floats_)
                       : accumulate_gradients(model, workers, batch);
}

std::span<float> AllreduceExchange::finish(WorkerGroup& workers) {
    if (!overlapped_) comm_.allreduce_sum(workers.gradient());
    return workers.gradient();
}

double AllreduceExchange::norm_squared(std::span<float> gradient, WorkerGroup& workers) {
    return owned_norm_squared(gradient, owned(), workers, false);  // every rank holds the sum
}

void AllreduceExchange::update(Model& model, AdamWState& optimizer, std::span<float> gradient,
                               const AdamWHyper& hyper, float clip, WorkerGroup& workers) {
    update_owned(model, optimizer, gradient, owned(), hyper, clip, workers);
}

void AllreduceExchange::discard(std::span<float> gradient, WorkerGroup& workers) {
    clear_owned(gradient, owned(), workers);
}

}  // namespace gpt2
