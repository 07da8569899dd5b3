#include "parallel/adapter_exchange.hpp"

#include <algorithm>
#include <stdexcept>

#include "model/lora.hpp"

namespace gpt2 {

using namespace exchange_detail;

AdapterExchange::AdapterExchange(const Communicator& comm, std::size_t adapter_floats, int workers)
    : comm_(comm), floats_(adapter_floats) {
    for (int w = 0; w < workers; ++w)
        per_worker_.emplace_back(adapter_floats);
}

GradientPass AdapterExchange::backward(const Model& model, WorkerGroup& workers,
                                       const StepBatch& batch, bool /*overlap: one allreduce*/) {
    if (model.lora == nullptr || model.lora->layout.total() != floats_) {
        throw std::invalid_argument("AdapterExchange: the model has no adapter of this size");
    }
    const int W = workers.size();
    const int B = workers.batch_size();
    const int T = workers.seq_len();
    // The mean over the step's trained targets (all of them, or the loss mask's).
    const float dloss = static_cast<float>(1.0 / step_targets(batch, T));
    GradientPass pass;
    pass.sequence_losses.assign(static_cast<std::size_t>(batch.global_sequences), 0.0);
    workers.pool().run([&](int w) {
        for (int a = 0; a < batch.grad_accum; ++a) {
            const TokenBatch mine = worker_sequences(batch, a, B, T, w, W);
            if (mine.B > 0) {
                (void)forward_backward_adapter(model, workers.context(w), mine, dloss,
                                               per_worker_[static_cast<std::size_t>(w)].span());
                record_sequence_losses(workers.context(w), mine, pass.sequence_losses);
            }
        }
    });
    // The workers' gradients summed into worker 0's in worker order, each worker a range of the
    // adapter (deterministic, no lock), the others cleared for the next step.
    workers.pool().run([&](int w) {
        const Range r = split_range(floats_, w, W);
        float* total = per_worker_.front().data();
        for (std::size_t k = 1; k < per_worker_.size(); ++k) {
            float* part = per_worker_[k].data();
            for (std::size_t i = r.begin; i < r.end; ++i) {
                total[i] += part[i];
                part[i] = 0.0f;
            }
        }
    });
    pass.seconds_at_barriers.assign(static_cast<std::size_t>(W), 0.0);
    return pass;
}

std::span<float> AdapterExchange::finish(WorkerGroup& /*workers*/) {
    comm_.allreduce_sum(gradient());
    return gradient();
}

double AdapterExchange::norm_squared(std::span<float> gradient, WorkerGroup& workers) {
    return norm_squared_in_blocks(gradient, owned(), workers, false,
                                  nullptr);  // every rank holds it
}

TrainedParameters AdapterExchange::trained(Model& model) {
    if (model.lora == nullptr)
        throw std::invalid_argument("AdapterExchange: the model has no adapter");
    return {model.lora->params.span(), {}, nullptr};
}

void AdapterExchange::publish(Model& /*model*/, WorkerGroup& /*workers*/) {
    // Every rank updated the whole adapter alike.
}

void AdapterExchange::discard(std::span<float> gradient, WorkerGroup& workers) {
    clear_owned(gradient, owned(), workers);
}

}  // namespace gpt2
