#include "parallel/shared_replica.hpp"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace gpt2 {

namespace {
constexpr std::size_t kSumBlock = 4096;  // floats per block of the shared-memory sum
}  // namespace

std::string share_replica_memory(Model& model, WorkerGroup& workers, const Communicator& comm,
                                 SharedGradients& shared_gradients) {
    const std::size_t P = model.layout.total();
    const std::size_t ranks = static_cast<std::size_t>(comm.size());
    // Page-aligned parts: the weights, their bf16 copy, one gradient per rank, and each rank's
    // progress count on a cache line of its own (zero, as the mapping starts).
    const auto aligned = [](std::size_t bytes) { return (bytes + 4095) / 4096 * 4096; };
    const std::size_t weights_bytes = aligned(P * sizeof(float));
    const std::size_t bf16_bytes = aligned(model.params_bf16.size() * sizeof(Bf16));
    const std::size_t gradient_bytes = aligned(P * sizeof(float));
    constexpr std::size_t kLine = 64;
    const std::size_t progress_bytes = aligned(ranks * kLine);
    const Communicator::SharedMemory shared =
        comm.map_shared(weights_bytes + bf16_bytes + ranks * gradient_bytes + progress_bytes);
    if (!shared.mapping) return shared.error;
    std::byte* const base = shared.mapping->data();
    auto* const weights = reinterpret_cast<float*>(base);
    auto* const weights_bf16 = reinterpret_cast<Bf16*>(base + weights_bytes);
    std::vector<float*> gradients;
    std::vector<std::uint64_t*> progress;
    std::byte* const progress_base = base + weights_bytes + bf16_bytes + ranks * gradient_bytes;
    for (std::size_t r = 0; r < ranks; ++r) {
        gradients.push_back(
            reinterpret_cast<float*>(base + weights_bytes + bf16_bytes + r * gradient_bytes));
        progress.push_back(reinterpret_cast<std::uint64_t*>(progress_base + r * kLine));
    }
    // Every rank holds the same weights; rank 0's go into the shared copy.
    if (comm.is_root()) {
        std::copy(model.params.data(), model.params.data() + P, weights);
        std::copy(model.params_bf16.data(), model.params_bf16.data() + model.params_bf16.size(),
                  weights_bf16);
    }
    comm.barrier();
    const std::size_t bf16_count = model.params_bf16.size();
    model.params = AlignedBuffer<float>(weights, P, shared.mapping);
    if (bf16_count > 0)
        model.params_bf16 = AlignedBuffer<Bf16>(weights_bf16, bf16_count, shared.mapping);
    workers.reduction().adopt_gradient(
        AlignedBuffer<float>(gradients[static_cast<std::size_t>(comm.rank())], P, shared.mapping));
    shared_gradients = SharedGradients{std::move(gradients), std::move(progress)};
    return {};
}

void unshare_replica_memory(Model& model, WorkerGroup& workers) {
    AlignedBuffer<float> weights(model.params.size());
    std::copy(model.params.data(), model.params.data() + model.params.size(), weights.data());
    AlignedBuffer<Bf16> weights_bf16(model.params_bf16.size());
    std::copy(model.params_bf16.data(), model.params_bf16.data() + model.params_bf16.size(),
              weights_bf16.data());
    model.params = std::move(weights);
    model.params_bf16 = std::move(weights_bf16);
    workers.reduction().adopt_gradient(AlignedBuffer<float>(model.params.size()));  // zero
}

void sum_shared_ranges(std::span<float* const> all, std::span<const Range> ranges) {
    float* __restrict const sum = all[0];
    for (const Range& range : ranges) {
        for (std::size_t block = range.begin; block < range.end; block += kSumBlock) {
            const std::size_t end = std::min(block + kSumBlock, range.end);
            for (std::size_t r = 1; r < all.size(); ++r) {
                float* __restrict const other = all[r];
                for (std::size_t i = block; i < end; ++i) {
                    sum[i] += other[i];
                    other[i] = 0.0f;
                }
            }
        }
    }
}

using namespace exchange_detail;

SharedMemoryExchange::SharedMemoryExchange(const Communicator& world, SharedGradients shared,
                                           std::vector<Range> slices, const MachineGroups* machines,
                                           std::size_t bucket_floats)
    : world_(world),
      shared_(std::move(shared)),
      slices_(std::move(slices)),
      machines_(machines),
      bucket_floats_(bucket_floats) {
    if (slices_.size() != static_cast<std::size_t>(world.size()) ||
        shared_.buffers.size() != static_cast<std::size_t>(machine().size())) {
        throw std::invalid_argument(
            "SharedMemoryExchange: one slice per rank and one mapped gradient per machine rank");
    }
    if (bucket_floats_ > 0) {
        if (machines_ == nullptr) {
            throw std::invalid_argument("SharedMemoryExchange: buckets only across machines");
        }
        overlap_ = std::make_unique<OverlapState>(machines_->across);
    }
}

GradientPass SharedMemoryExchange::backward(const Model& model, WorkerGroup& workers,
                                            const StepBatch& batch, bool overlap) {
    overlapped_ = overlap && overlap_ != nullptr;
    if (!overlapped_) return accumulate_gradients(model, workers, batch);
    return overlapped_slices(model, workers, *overlap_, world_, *machines_, batch, owned(),
                             bucket_floats_, shared_.buffers, shared_.progress);
}

std::span<float> SharedMemoryExchange::finish(WorkerGroup& workers) {
    // Every rank's gradient is complete (in buckets: the slices are summed), and no rank updates
    // the weights while another may still read them.
    machine().barrier();
    const std::span<float> sum(shared_.buffers[0], workers.gradient().size());
    if (!overlapped_) {
        const Range mine = owned();
        workers.pool().run([&](int w) {
            const Range part = split_range(mine.end - mine.begin, w, workers.size());
            const Range piece{mine.begin + part.begin, mine.begin + part.end};
            sum_shared_ranges(shared_.buffers, std::span(&piece, 1));
        });
        if (machines_ != nullptr) {
            machines_->across.allreduce_sum(sum.subspan(mine.begin, mine.end - mine.begin));
        }
    }
    return sum;
}

double SharedMemoryExchange::norm_squared(std::span<float> gradient, WorkerGroup& workers) {
    // Across machines every machine holds every slice: the first machine's count, so that every
    // machine clips by the very same number whatever its ranks' thread counts.
    const bool counts = machines_ == nullptr || machines_->on_first;
    return norm_squared_in_blocks(gradient, owned(), workers, false, &world_, counts);
}

void SharedMemoryExchange::publish(Model& /*model*/, WorkerGroup& /*workers*/) {
    machine().barrier();  // every slice of the weights is updated before anyone's next forward
}

void SharedMemoryExchange::discard(std::span<float> gradient, WorkerGroup& workers) {
    clear_owned(gradient, owned(), workers);
    machine().barrier();  // nobody starts the next step on a shared buffer still in use
}

}  // namespace gpt2
