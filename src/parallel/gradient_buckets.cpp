#include "parallel/gradient_buckets.hpp"

#include <algorithm>
#include <atomic>
#include <functional>
#include <stdexcept>
#include <string>

#include "core/clock.hpp"
#include "parallel/shared_replica.hpp"

namespace gpt2 {

namespace {
// Cuts the parts of the gradient, in the order backward completes them, into buckets of exactly
// `bucket_floats` (the last one smaller) and sends each when full.
class GradientBuckets {
  public:
    using Send = std::function<void(std::vector<Range>)>;
    GradientBuckets(std::size_t bucket_floats, Send send)
        : bucket_floats_(bucket_floats), send_(std::move(send)) {}

    void add(std::span<const Range> ranges) {
        for (Range r : ranges) {
            while (r.begin < r.end) {
                const std::size_t take = std::min(r.end - r.begin, bucket_floats_ - filled_);
                pending_.push_back(Range{r.begin, r.begin + take});
                filled_ += take;
                r.begin += take;
                if (filled_ == bucket_floats_) flush();
            }
        }
    }
    void flush() {
        if (pending_.empty()) return;
        send_(std::move(pending_));
        pending_ = {};
        filled_ = 0;
    }

  private:
    std::size_t bucket_floats_;
    Send send_;
    std::vector<Range> pending_;
    std::size_t filled_ = 0;
};

std::size_t rows_per_micro_batch(const WorkerGroup& workers) {
    return static_cast<std::size_t>(workers.batch_size()) *
           static_cast<std::size_t>(workers.seq_len());
}

// Whether the last micro-batch's embedding rows of every rank in `world` are fewer floats than
// wte: then they are left out of the buffers so that wte is complete right after the LM head, and
// travel on their own (add_deferred_embedding_rows).
bool defer_embeddings(const Model& model, const WorkerGroup& workers, const Communicator& world) {
    const auto C = static_cast<std::size_t>(model.config.channels);
    return static_cast<std::size_t>(world.size()) * rows_per_micro_batch(workers) * (C + 1) <
           model.layout.size(ParamTensor::wte);
}

// Every rank's deferred embedding rows gathered to every rank, then added into `gradient`'s
// elements in `only`, in rank order, so that every rank computes the same sums.
void add_deferred_embedding_rows(const Model& model, WorkerGroup& workers, OverlapState& state,
                                 const Communicator& world, std::span<float> gradient, Range only) {
    LayerwiseReduction& reduction = workers.reduction();
    const std::size_t rows = rows_per_micro_batch(workers);
    const auto C = static_cast<std::size_t>(model.config.channels);
    const auto ranks = static_cast<std::size_t>(world.size());
    state.rows.resize(rows * C);
    state.tokens.resize(rows);
    state.all_rows.resize(ranks * rows * C);
    state.all_tokens.resize(ranks * rows);
    reduction.pack_embedding_rows(state.rows, state.tokens, workers.seq_len());
    world.allgather(std::span<const float>(state.rows), std::span<float>(state.all_rows));
    world.allgather(std::span<const std::int32_t>(state.tokens),
                    std::span<std::int32_t>(state.all_tokens));
    workers.pool().run([&](int w) {
        reduction.add_embedding_rows(state.all_rows, state.all_tokens, workers.seq_len(), w,
                                     gradient, only);
    });
}

// Backward with the gradient sent in buckets as its parts complete, the body of both overlapped
// passes: `on_part` runs first for each completed part (on worker 0's thread), then the part's
// elements within `only` go into buckets that `send` queues on the state's thread. When the last
// micro-batch's embedding rows are smaller than wte, they are left out of the buffers so that wte
// travels right after the LM head; every rank then gathers all ranks' rows and adds those in
// `only` into `gradient`, in rank order, so the ranks stay identical.
GradientPass overlap_with_backward(const Model& model, WorkerGroup& workers, OverlapState& state,
                                   const Communicator& world, const StepBatch& batch,
                                   std::size_t bucket_floats, std::span<float> gradient, Range only,
                                   const std::function<void()>& on_part,
                                   GradientBuckets::Send send) {
    LayerwiseReduction& reduction = workers.reduction();
    BackgroundAllreduce& allreduce = state.allreduce;
    const bool defer = defer_embeddings(model, workers, world);
    reduction.set_deferred_embeddings(defer);
    GradientPass pass;
    Clock::time_point backward_done;
    {
        GradientBuckets buckets(bucket_floats, std::move(send));
        const GradientReady ready = [&](const CompletedGradient& part) {
            if (on_part) on_part();
            for (const Range& r : part.ranges) {
                const Range in{std::max(r.begin, only.begin), std::min(r.end, only.end)};
                if (in.begin < in.end) buckets.add(std::span(&in, 1));
            }
        };
        // A worker's error propagates after the communication thread has finished what was
        // queued (it may still be reading the gradient). With shared memory a bucket may wait
        // for a rank of this machine that failed: every error ends the job (MPI_Abort), which
        // ends that wait too.
        try {
            pass = accumulate_gradients(model, workers, batch, ready);
        } catch (...) {
            reduction.set_deferred_embeddings(false);
            allreduce.wait();
            throw;
        }
        backward_done = Clock::now();
        buckets.flush();
        allreduce.wait();
    }
    reduction.set_deferred_embeddings(false);
    if (defer) add_deferred_embedding_rows(model, workers, state, world, gradient, only);
    pass.seconds_after_backward = seconds_since(backward_done);
    return pass;
}
}  // namespace

GradientPass overlapped_gradients(const Model& model, WorkerGroup& workers, OverlapState& state,
                                  const StepBatch& batch, std::size_t bucket_floats) {
    const std::span<float> gradient = workers.gradient();
    return overlap_with_backward(model, workers, state, state.allreduce.communicator(), batch,
                                 bucket_floats, gradient, Range{0, gradient.size()}, {},
                                 [&](std::vector<Range> ranges) {
                                     state.allreduce.enqueue(gradient.data(), std::move(ranges));
                                 });
}

BucketedBackward::BucketedBackward(const Communicator& comm, std::size_t bucket_floats,
                                   std::string_view exchange)
    : bucket_floats_(bucket_floats) {
    if (bucket_floats_ > 0) {
        if (comm.size() < 2) {
            throw std::invalid_argument(std::string(exchange) + ": buckets need several ranks");
        }
        overlap_ = std::make_unique<OverlapState>(comm);
    }
}

GradientPass BucketedBackward::run(const Model& model, WorkerGroup& workers, const StepBatch& batch,
                                   bool overlap) {
    sent_ = overlap && overlap_ != nullptr;
    return sent_ ? overlapped_gradients(model, workers, *overlap_, batch, bucket_floats_)
                 : accumulate_gradients(model, workers, batch);
}

// The progress counts live in memory other processes map: only a lock-free atomic works there.
static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free);

// Each part completed on this rank raises its count in the shared memory; a bucket's sum starts
// once every rank of the machine has counted that far. Every rank adds the world's deferred
// embedding rows that fall in its slice.
GradientPass overlapped_slices(const Model& model, WorkerGroup& workers, OverlapState& state,
                               const Communicator& world, const MachineGroups& machines,
                               const StepBatch& batch, Range owned, std::size_t bucket_floats,
                               std::span<float* const> rank_gradients,
                               std::span<std::uint64_t* const> rank_progress) {
    const std::span<float* const> all = rank_gradients;
    const std::span<std::uint64_t* const> progress = rank_progress;
    const std::atomic_ref<std::uint64_t> mine(
        *progress[static_cast<std::size_t>(machines.machine.rank())]);
    const std::uint64_t before = mine.load(std::memory_order_relaxed);
    std::uint64_t parts = 0;  // completed on this rank in this step
    const auto count_part = [&] { mine.store(before + ++parts, std::memory_order_release); };
    const auto send = [&](std::vector<Range> ranges) {
        const std::uint64_t needed = before + parts;
        auto every_rank_has_it = [progress, needed] {
            return std::all_of(progress.begin(), progress.end(), [&](std::uint64_t* count) {
                return std::atomic_ref<std::uint64_t>(*count).load(std::memory_order_acquire) >=
                       needed;
            });
        };
        auto sum_machine = [all, ranges] { sum_shared_ranges(all, ranges); };
        state.allreduce.enqueue(all[0], std::move(ranges), std::move(every_rank_has_it),
                                std::move(sum_machine));
    };
    return overlap_with_backward(model, workers, state, world, batch, bucket_floats,
                                 std::span<float>(all[0], model.layout.total()), owned, count_part,
                                 send);
}

}  // namespace gpt2
