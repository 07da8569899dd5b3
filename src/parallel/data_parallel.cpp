#include "parallel/data_parallel.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>

namespace gpt2 {

namespace {
constexpr std::size_t kSumBlock = 4096;  // floats per block of the shared-memory sum

// Seconds since `start`, restarting the clock.
double lap(std::chrono::steady_clock::time_point& start) {
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - start).count();
    start = now;
    return seconds;
}

std::vector<ThreadLocalTrainingContext> make_contexts(const ModelConfig& config, int workers,
                                                      int batch_size, int seq_len,
                                                      Precision precision, Recompute recompute) {
    std::vector<ThreadLocalTrainingContext> contexts;
    contexts.reserve(static_cast<std::size_t>(workers));
    const int per_worker = (batch_size + workers - 1) / workers;
    for (int w = 0; w < workers; ++w)
        contexts.emplace_back(config, w < batch_size ? per_worker : 0, seq_len, precision,
                              recompute);
    return contexts;
}

// Worker w's sequences of a micro-batch starting at `offset` tokens.
TokenBatch worker_share(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets,
                        std::size_t offset, int B, int T, int w, int W) {
    const Range seqs = split_range(static_cast<std::size_t>(B), w, W);
    const std::size_t begin = offset + seqs.begin * static_cast<std::size_t>(T);
    const std::size_t count = (seqs.end - seqs.begin) * static_cast<std::size_t>(T);
    return TokenBatch{inputs.subspan(begin, count), targets.subspan(begin, count),
                      static_cast<int>(seqs.end - seqs.begin), T};
}
}  // namespace

WorkerGroup::WorkerGroup(const ModelConfig& config, int workers, int batch_size, int seq_len,
                         bool pin, Precision precision, Recompute recompute)
    : batch_size_(batch_size),
      seq_len_(seq_len),
      pool_(workers, pin),
      contexts_(make_contexts(config, workers, batch_size, seq_len, precision, recompute)),
      reduction_(config, contexts_, std::min(workers, batch_size)),
      partials_(static_cast<std::size_t>(workers)) {}

std::string share_replica_memory(Model& model, WorkerGroup& workers, const Communicator& comm) {
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
    workers.set_rank_gradients(std::move(gradients));
    workers.set_rank_progress(std::move(progress));
    return {};
}

void unshare_replica_memory(Model& model, WorkerGroup& workers) {
    if (workers.rank_gradients().empty()) return;
    AlignedBuffer<float> weights(model.params.size());
    std::copy(model.params.data(), model.params.data() + model.params.size(), weights.data());
    AlignedBuffer<Bf16> weights_bf16(model.params_bf16.size());
    std::copy(model.params_bf16.data(), model.params_bf16.data() + model.params_bf16.size(),
              weights_bf16.data());
    model.params = std::move(weights);
    model.params_bf16 = std::move(weights_bf16);
    workers.reduction().adopt_gradient(AlignedBuffer<float>(model.params.size()));  // zero
    workers.set_rank_gradients({});
    workers.set_rank_progress({});
}

GradientPass accumulate_gradients(const Model& model, WorkerGroup& workers, const StepBatch& batch,
                                  const GradientReady& ready) {
    const int W = workers.size();
    const int B = workers.batch_size();
    const int T = workers.seq_len();
    const std::size_t micro_tokens = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
    const float dloss = static_cast<float>(1.0 / (static_cast<double>(batch.global_sequences) * T));
    const std::span<WorkerPartial> sums = workers.partials();
    LayerwiseReduction& reduction = workers.reduction();
    double worker0_summing = 0.0;
    reduction.begin_run();
    workers.pool().run([&](int w) {
        double loss = 0.0;
        double summing = 0.0;
        double at_barriers = 0.0;
        try {
            for (int a = 0; a < batch.grad_accum; ++a) {
                LayerwiseReduction::WorkerSink sink(reduction, w,
                                                    a + 1 == batch.grad_accum ? &ready : nullptr);
                const TokenBatch share =
                    worker_share(batch.inputs, batch.targets, a * micro_tokens, B, T, w, W);
                if (share.B > 0) {
                    loss += forward_backward(model, workers.context(w), share, dloss, sink);
                } else {
                    sink.take_part_without_sequences(T);
                }
                summing += sink.seconds_waiting_and_summing();
                at_barriers += sink.seconds_at_barriers();
            }
        } catch (const BarrierAborted&) {
            return;  // another worker failed: the pool rethrows its error
        } catch (...) {
            reduction.abort();
            throw;
        }
        sums[static_cast<std::size_t>(w)].value = loss;
        sums[static_cast<std::size_t>(w)].seconds_at_barriers = at_barriers;
        if (w == 0) worker0_summing = summing;
    });
    GradientPass pass;
    for (const WorkerPartial& s : sums) {
        pass.loss_sum += s.value;
        pass.seconds_at_barriers.push_back(s.seconds_at_barriers);
    }
    pass.seconds_summing = worker0_summing;
    return pass;
}

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

// The rank's communication thread for `comm`, kept across steps.
BackgroundAllreduce& background_allreduce(WorkerGroup& workers, const Communicator& comm) {
    std::unique_ptr<BackgroundAllreduce>& thread = workers.background_allreduce;
    if (!thread || &thread->communicator() != &comm) {
        thread = std::make_unique<BackgroundAllreduce>(comm);
    }
    return *thread;
}

// Whether the last micro-batch's embedding rows of every rank in `world` are fewer floats than
// wte: then they are left out of the buffers so that wte is complete right after the LM head, and
// travel on their own (add_deferred_embedding_rows).
std::size_t rows_per_micro_batch(const WorkerGroup& workers) {
    return static_cast<std::size_t>(workers.batch_size()) *
           static_cast<std::size_t>(workers.seq_len());
}
bool defer_embeddings(const Model& model, const WorkerGroup& workers, const Communicator& world) {
    const auto C = static_cast<std::size_t>(model.config.channels);
    return static_cast<std::size_t>(world.size()) * rows_per_micro_batch(workers) * (C + 1) <
           model.layout.size(ParamTensor::wte);
}

// Every rank's deferred embedding rows gathered to every rank, then added into `gradient`'s
// elements in `only`, in rank order, so that every rank computes the same sums.
void add_deferred_embedding_rows(const Model& model, WorkerGroup& workers,
                                 const Communicator& world, std::span<float> gradient, Range only) {
    LayerwiseReduction& reduction = workers.reduction();
    const std::size_t rows = rows_per_micro_batch(workers);
    const auto C = static_cast<std::size_t>(model.config.channels);
    WorkerGroup::EmbeddingRows& e = workers.embedding_rows;
    const auto ranks = static_cast<std::size_t>(world.size());
    e.mine.resize(rows * C);
    e.tokens.resize(rows);
    e.all.resize(ranks * rows * C);
    e.all_tokens.resize(ranks * rows);
    reduction.pack_embedding_rows(e.mine, e.tokens, workers.seq_len());
    world.allgather(std::span<const float>(e.mine), std::span<float>(e.all));
    world.allgather(std::span<const std::int32_t>(e.tokens), std::span<std::int32_t>(e.all_tokens));
    workers.pool().run([&](int w) {
        reduction.add_embedding_rows(e.all, e.all_tokens, workers.seq_len(), w, gradient, only);
    });
}

// Backward with the gradient sent in buckets as its parts complete, the body of both overlapped
// passes: `on_part` runs first for each completed part (on worker 0's thread), then the part's
// elements within `only` go into buckets that `send` queues on `allreduce`. When the last
// micro-batch's embedding rows are smaller than wte, they are left out of the buffers so that wte
// travels right after the LM head; every rank then gathers all ranks' rows and adds those in
// `only` into `gradient`, in rank order, so the ranks stay identical.
GradientPass overlap_with_backward(const Model& model, WorkerGroup& workers,
                                   const Communicator& world, const StepBatch& batch,
                                   BackgroundAllreduce& allreduce, std::size_t bucket_floats,
                                   std::span<float> gradient, Range only,
                                   const std::function<void()>& on_part,
                                   GradientBuckets::Send send) {
    LayerwiseReduction& reduction = workers.reduction();
    const bool defer = defer_embeddings(model, workers, world);
    reduction.set_deferred_embeddings(defer);
    GradientPass pass;
    std::chrono::steady_clock::time_point backward_done;
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
        backward_done = std::chrono::steady_clock::now();
        buckets.flush();
        allreduce.wait();
    }
    reduction.set_deferred_embeddings(false);
    if (defer) add_deferred_embedding_rows(model, workers, world, gradient, only);
    pass.seconds_after_backward = lap(backward_done);
    return pass;
}

// The gradient summed across ranks while backward runs (see StepHyper::bucket_floats).
GradientPass overlapped_gradients(const Model& model, WorkerGroup& workers,
                                  const Communicator& comm, const StepBatch& batch,
                                  std::size_t bucket_floats) {
    BackgroundAllreduce& allreduce = background_allreduce(workers, comm);
    const std::span<float> gradient = workers.gradient();
    return overlap_with_backward(model, workers, comm, batch, allreduce, bucket_floats, gradient,
                                 Range{0, gradient.size()}, {}, [&](std::vector<Range> ranges) {
                                     allreduce.enqueue(gradient.data(), std::move(ranges));
                                 });
}

// Shared memory: `ranges` (within this rank's slice) of every rank's gradient summed into rank
// 0's buffer, in rank order (the same sum whichever rank computes it), clearing the others' for
// the next step.
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

// The progress counts live in memory other processes map: only a lock-free atomic works there.
static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free);

// Shared memory on several machines, overlapped with backward: as each part of the gradient is
// complete on this rank its count goes up in the shared memory; the communication thread waits
// until every rank of the machine has the part, sums this rank's slice of it over their buffers
// into the machine's sum (rank 0's buffer, as sum_shared_gradients does after backward) and
// allreduces it, in buckets, with the ranks that own the same slice on the other machines. Every
// rank adds the world's deferred embedding rows that fall in its slice.
GradientPass overlapped_slices(const Model& model, WorkerGroup& workers, const Communicator& comm,
                               const MachineGroups& machines, const StepBatch& batch, Range owned,
                               std::size_t bucket_floats) {
    BackgroundAllreduce& allreduce = background_allreduce(workers, machines.across);
    const std::span<float* const> all = workers.rank_gradients();
    const std::span<std::uint64_t* const> progress = workers.rank_progress();
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
        allreduce.enqueue(all[0], std::move(ranges), std::move(every_rank_has_it),
                          std::move(sum_machine));
    };
    return overlap_with_backward(model, workers, comm, batch, allreduce, bucket_floats,
                                 std::span<float>(all[0], model.layout.total()), owned, count_part,
                                 send);
}

// Shared memory after backward: this rank's slice of every rank's gradient summed into rank 0's
// buffer (sum_shared_ranges), divided among the workers.
void sum_shared_gradients(WorkerGroup& workers, Range owned) {
    workers.pool().run([&](int w) {
        const Range share = split_range(owned.end - owned.begin, w, workers.size());
        const Range mine{owned.begin + share.begin, owned.begin + share.end};
        sum_shared_ranges(workers.rank_gradients(), std::span(&mine, 1));
    });
}
}  // namespace

StepMetrics train_step(Model& model, AdamWState& optimizer, WorkerGroup& workers,
                       const Communicator& comm, const StepBatch& batch, const StepHyper& hyper,
                       InjectedFault fault, SpikeGuard* guard) {
    const int W = workers.size();
    const int T = workers.seq_len();
    const std::span<WorkerPartial> sums = workers.partials();
    StepMetrics metrics;
    auto clock = std::chrono::steady_clock::now();

    // The test hooks change the gradient before it travels, so they need the plain allreduce.
    // Under ZeRO-1 the buckets are allreduced too and each rank keeps its shard: Open MPI 4.1's
    // non-blocking reduce-scatter (a binomial reduce, then a linear scatter) measured slower over
    // a 1 Gbit/s link than ZeRO-1's blocking one, while the ring allreduce of buckets overlaps.
    // Shared memory across machines overlaps the slices' allreduce instead (overlapped_slices).
    const bool shared = !workers.rank_gradients().empty();
    const bool buckets = comm.size() > 1 && hyper.bucket_floats > 0 && fault == InjectedFault::none;
    const bool overlap = buckets && !shared;
    const bool overlap_slices = buckets && shared && hyper.machines != nullptr;
    // The elements this rank updates: all of them, or its shard (ZeRO-1, shared memory).
    const std::size_t P = model.layout.total();
    const bool sharded = !hyper.zero_shards.empty() && comm.size() > 1;
    const bool zero = sharded && !shared;
    const Range owned =
        sharded ? hyper.zero_shards[static_cast<std::size_t>(comm.rank())] : Range{0, P};

    const GradientPass pass =
        overlap          ? overlapped_gradients(model, workers, comm, batch, hyper.bucket_floats)
        : overlap_slices ? overlapped_slices(model, workers, comm, *hyper.machines, batch, owned,
                                             hyper.bucket_floats)
                         : accumulate_gradients(model, workers, batch);
    const double loss_sum = pass.loss_sum;
    metrics.timings.forward_backward =
        lap(clock) - pass.seconds_summing - pass.seconds_after_backward;
    metrics.timings.thread_reduction = pass.seconds_summing;
    metrics.timings.barrier_wait = pass.seconds_at_barriers;

    if (fault == InjectedFault::nan_gradient) {
        workers.gradient()[0] = std::numeric_limits<float>::quiet_NaN();
    } else if (fault == InjectedFault::gradient_spike) {
        for (float& g : workers.gradient())
            g *= 1e4f;
    }

    // Shared memory: every rank reads the sum in rank 0's buffer.
    const std::span<float> grad =
        shared ? std::span<float>(workers.rank_gradients()[0], P) : workers.gradient();
    // Shared memory: the ranks that share it (this machine's).
    const Communicator& machine = hyper.machines != nullptr ? hyper.machines->machine : comm;
    if (shared) {
        // Every rank's gradient is complete (overlapped: the slices are summed), and no rank
        // updates the weights while another may still read them.
        machine.barrier();
        if (!overlap_slices) {
            sum_shared_gradients(workers, owned);
            if (hyper.machines != nullptr) {
                hyper.machines->across.allreduce_sum(
                    grad.subspan(owned.begin, owned.end - owned.begin));
            }
        }
    } else if (zero && !overlap) {
        comm.reduce_scatter_sum(grad, hyper.zero_shards);
    } else if (!overlap) {
        comm.allreduce_sum(grad);
    }
    const double global_tokens = static_cast<double>(batch.global_sequences) * T;
    metrics.loss = comm.allreduce_sum(loss_sum) / global_tokens;
    // Squares of the owned part; under ZeRO the rest (this rank's partial sums) is cleared for
    // the next step's accumulation.
    workers.pool().run([&](int w) {
        const Range r = split_range(owned.end - owned.begin, w, W);
        sums[static_cast<std::size_t>(w)].value =
            sum_of_squares(grad.subspan(owned.begin + r.begin, r.end - r.begin));
        if (zero) {
            for (const Range other : {Range{0, owned.begin}, Range{owned.end, P}}) {
                const Range z = split_range(other.end - other.begin, w, W);
                std::fill(grad.begin() + static_cast<std::ptrdiff_t>(other.begin + z.begin),
                          grad.begin() + static_cast<std::ptrdiff_t>(other.begin + z.end), 0.0f);
            }
        }
    });
    double norm_sq = 0.0;
    for (const WorkerPartial& s : sums)
        norm_sq += s.value;
    // Across machines every machine holds every slice: the first machine's count, so that every
    // machine clips by the very same number whatever its ranks' thread counts.
    const bool counts = hyper.machines == nullptr || hyper.machines->on_first;
    if (sharded) norm_sq = comm.allreduce_sum(counts ? norm_sq : 0.0);
    metrics.grad_norm = std::sqrt(norm_sq);
    metrics.timings.allreduce = lap(clock) + pass.seconds_after_backward;

    const bool finite = std::isfinite(metrics.loss) && std::isfinite(metrics.grad_norm);
    if (finite && guard != nullptr) {
        const SpikeGuard::Verdict verdict = guard->judge(metrics.loss, metrics.grad_norm);
        metrics.loss_z = verdict.loss_z;
        metrics.norm_z = verdict.norm_z;
        metrics.spike = verdict.skip;
    }
    if (!finite || metrics.spike) {
        metrics.skipped = true;
        workers.pool().run([&](int w) {
            const Range r = split_range(owned.end - owned.begin, w, W);
            std::fill(grad.begin() + static_cast<std::ptrdiff_t>(owned.begin + r.begin),
                      grad.begin() + static_cast<std::ptrdiff_t>(owned.begin + r.end), 0.0f);
        });
        if (shared) machine.barrier();  // nobody starts the next step on a buffer still in use
        return metrics;
    }
    const float scale = clip_scale(metrics.grad_norm, hyper.grad_clip);
    const std::int64_t t = ++optimizer.step;
    std::span<float> params = model.params.span();
    const std::span<Bf16> params_bf16 = model.params_bf16.span();  // empty in fp32
    workers.pool().run([&](int w) {
        const Range r = split_range(owned.end - owned.begin, w, W);
        adamw_update_range(model.layout, params, grad, optimizer, owned.begin + r.begin,
                           owned.begin + r.end, hyper.adamw, t, scale, params_bf16);
    });
    if (zero) {
        // Every rank's updated shard to every rank; then the bf16 copy of the others' shards.
        comm.allgather_shards(params, hyper.zero_shards);
        if (!params_bf16.empty()) {
            workers.pool().run([&](int w) {
                for (const Range other : {Range{0, owned.begin}, Range{owned.end, P}}) {
                    const Range z = split_range(other.end - other.begin, w, W);
                    convert_to_bf16(params_bf16.data() + other.begin + z.begin,
                                    params.data() + other.begin + z.begin, z.end - z.begin);
                }
            });
        }
    }
    // Shared memory: every slice of the weights is updated before anyone's next forward.
    if (shared) machine.barrier();
    metrics.timings.optimizer = lap(clock);
    return metrics;
}

double evaluate(const Model& model, WorkerGroup& workers, const Communicator& comm,
                std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets,
                int num_batches) {
    const int W = workers.size();
    const int B = workers.batch_size();
    const int T = workers.seq_len();
    const std::size_t micro_tokens = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
    const std::span<WorkerPartial> sums = workers.partials();
    workers.pool().run([&](int w) {
        double loss = 0.0;
        for (int a = 0; a < num_batches; ++a) {
            const TokenBatch share = worker_share(inputs, targets, a * micro_tokens, B, T, w, W);
            if (share.B > 0) loss += forward_loss(model, workers.context(w), share);
        }
        sums[static_cast<std::size_t>(w)].value = loss;
    });
    double loss_sum = 0.0;
    for (const WorkerPartial& s : sums)
        loss_sum += s.value;
    const double tokens =
        static_cast<double>(micro_tokens) * num_batches * static_cast<double>(comm.size());
    return comm.allreduce_sum(loss_sum) / tokens;
}

}  // namespace gpt2
