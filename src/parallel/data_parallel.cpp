#include "parallel/data_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "core/clock.hpp"
#include "parallel/gradient_buckets.hpp"
#include "parallel/shared_replica.hpp"

namespace gpt2 {

std::string_view exchange_name(GradientExchange exchange) {
    switch (exchange) {
        case GradientExchange::Allreduce:
            return "allreduce";
        case GradientExchange::AllreduceBuckets:
            return "allreduce in buckets";
        case GradientExchange::ZeroReduceScatter:
            return "ZeRO-1 reduce-scatter";
        case GradientExchange::ZeroBuckets:
            return "ZeRO-1 in buckets";
        case GradientExchange::SharedMemory:
            return "shared memory";
        case GradientExchange::SharedMemoryBuckets:
            return "shared memory, slices in buckets";
    }
    return "?";
}

namespace {
// Seconds since `start`, restarting the clock.
double lap(Clock::time_point& start) {
    const auto now = Clock::now();
    const double seconds = std::chrono::duration<double>(now - start).count();
    start = now;
    return seconds;
}

bool is_shared(GradientExchange e) {
    return e == GradientExchange::SharedMemory || e == GradientExchange::SharedMemoryBuckets;
}
bool is_zero(GradientExchange e) {
    return e == GradientExchange::ZeroReduceScatter || e == GradientExchange::ZeroBuckets;
}
bool in_buckets(GradientExchange e) {
    return e == GradientExchange::AllreduceBuckets || e == GradientExchange::ZeroBuckets ||
           e == GradientExchange::SharedMemoryBuckets;
}

// The same exchange done after backward: the test hooks change the gradient before it travels.
GradientExchange after_backward(GradientExchange e) {
    switch (e) {
        case GradientExchange::AllreduceBuckets:
            return GradientExchange::Allreduce;
        case GradientExchange::ZeroBuckets:
            return GradientExchange::ZeroReduceScatter;
        case GradientExchange::SharedMemoryBuckets:
            return GradientExchange::SharedMemory;
        default:
            return e;
    }
}

// A step told to exchange in a way the group or the hyperparameters cannot: a caller's bug.
void check_exchange(const StepHyper& hyper, const WorkerGroup& workers, const Communicator& comm) {
    const GradientExchange e = hyper.exchange;
    const bool sliced = is_zero(e) || is_shared(e);
    const char* problem =
        sliced != !hyper.update_slices.empty() ? "update_slices given exactly for sliced updates"
        : sliced && hyper.update_slices.size() != static_cast<std::size_t>(comm.size())
            ? "one update slice per rank"
        : is_shared(e) == workers.rank_gradients().empty() ? "shared memory exactly when mapped"
        : in_buckets(e) && (hyper.bucket_floats == 0 || comm.size() < 2)
            ? "buckets of at least one float and several ranks"
        : e == GradientExchange::SharedMemoryBuckets && hyper.machines == nullptr
            ? "machine groups for slices in buckets"
            : nullptr;
    if (problem != nullptr) {
        throw std::invalid_argument(std::string("train_step: exchange ") +
                                    std::string(exchange_name(e)) + " needs " + problem);
    }
}

// The gradient's exchange that does not overlap backward (after it, or the rest after the
// overlapped part); returns where the summed gradient is (shared memory: rank 0's buffer).
std::span<float> finish_exchange(GradientExchange exchange, WorkerGroup& workers,
                                 const Communicator& comm, const StepHyper& hyper, Range owned,
                                 std::size_t P) {
    const Communicator& machine = hyper.machines != nullptr ? hyper.machines->machine : comm;
    switch (exchange) {
        case GradientExchange::Allreduce:
            comm.allreduce_sum(workers.gradient());
            break;
        case GradientExchange::ZeroReduceScatter:
            comm.reduce_scatter_sum(workers.gradient(), hyper.update_slices);
            break;
        case GradientExchange::AllreduceBuckets:
        case GradientExchange::ZeroBuckets:
            break;  // summed while backward ran
        case GradientExchange::SharedMemory:
        case GradientExchange::SharedMemoryBuckets: {
            // Every rank's gradient is complete (in buckets: the slices are summed), and no rank
            // updates the weights while another may still read them.
            machine.barrier();
            const std::span<float> sum(workers.rank_gradients()[0], P);
            if (exchange == GradientExchange::SharedMemory) {
                sum_shared_gradients(workers, owned);
                if (hyper.machines != nullptr) {
                    hyper.machines->across.allreduce_sum(
                        sum.subspan(owned.begin, owned.end - owned.begin));
                }
            }
            return sum;
        }
    }
    return workers.gradient();
}

// The squared norm of the global gradient from every rank's owned part. Under ZeRO-1 the rest of
// `grad` (this rank's partial sums) is cleared for the next step's accumulation.
double gradient_norm_squared(std::span<float> grad, GradientExchange exchange, Range owned,
                             WorkerGroup& workers, const Communicator& comm,
                             const StepHyper& hyper) {
    const int W = workers.size();
    const std::span<WorkerPartial> sums = workers.partials();
    const bool zero = is_zero(exchange);
    const std::size_t P = grad.size();
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
    if (hyper.update_slices.empty()) return norm_sq;
    // Across machines every machine holds every slice: the first machine's count, so that every
    // machine clips by the very same number whatever its ranks' thread counts.
    const bool counts = hyper.machines == nullptr || hyper.machines->on_first;
    return comm.allreduce_sum(counts ? norm_sq : 0.0);
}

// AdamW on this rank's owned part; under ZeRO-1 every rank's updated slice then goes to every
// rank, and the bf16 copy of the others' slices follows.
void update_weights(Model& model, AdamWState& optimizer, std::span<float> grad,
                    GradientExchange exchange, Range owned, float scale, WorkerGroup& workers,
                    const Communicator& comm, const StepHyper& hyper) {
    const int W = workers.size();
    const std::size_t P = model.layout.total();
    const std::int64_t t = ++optimizer.step;
    std::span<float> params = model.params.span();
    const std::span<Bf16> params_bf16 = model.params_bf16.span();  // empty in fp32
    workers.pool().run([&](int w) {
        const Range r = split_range(owned.end - owned.begin, w, W);
        adamw_update_range(model.layout, params, grad, optimizer, owned.begin + r.begin,
                           owned.begin + r.end, hyper.adamw, t, scale, params_bf16);
    });
    if (!is_zero(exchange)) return;
    comm.allgather_shards(params, hyper.update_slices);
    if (params_bf16.empty()) return;
    workers.pool().run([&](int w) {
        for (const Range other : {Range{0, owned.begin}, Range{owned.end, P}}) {
            const Range z = split_range(other.end - other.begin, w, W);
            convert_to_bf16(params_bf16.data() + other.begin + z.begin,
                            params.data() + other.begin + z.begin, z.end - z.begin);
        }
    });
}
}  // namespace

StepMetrics train_step(Model& model, AdamWState& optimizer, WorkerGroup& workers,
                       const Communicator& comm, const StepBatch& batch, const StepHyper& hyper,
                       const StepTestHooks& hooks, SpikeGuard* guard) {
    const InjectedFault fault = hooks.fault;
    check_exchange(hyper, workers, comm);
    const GradientExchange exchange =
        fault == InjectedFault::None ? hyper.exchange : after_backward(hyper.exchange);
    const int W = workers.size();
    const std::size_t P = model.layout.total();
    // The elements this rank updates: all of them, or its slice (ZeRO-1, shared memory).
    const Range owned = hyper.update_slices.empty()
                            ? Range{0, P}
                            : hyper.update_slices[static_cast<std::size_t>(comm.rank())];
    StepMetrics metrics;
    auto clock = Clock::now();

    // Under ZeRO-1 the buckets are allreduced too and each rank keeps its slice: Open MPI 4.1's
    // non-blocking reduce-scatter (a binomial reduce, then a linear scatter) measured slower over
    // a 1 Gbit/s link than ZeRO-1's blocking one, while the ring allreduce of buckets overlaps.
    const GradientPass pass =
        exchange == GradientExchange::AllreduceBuckets || exchange == GradientExchange::ZeroBuckets
            ? overlapped_gradients(model, workers, comm, batch, hyper.bucket_floats)
        : exchange == GradientExchange::SharedMemoryBuckets
            ? overlapped_slices(model, workers, comm, *hyper.machines, batch, owned,
                                hyper.bucket_floats)
            : accumulate_gradients(model, workers, batch);
    metrics.timings.forward_backward =
        lap(clock) - pass.seconds_summing - pass.seconds_after_backward;
    metrics.timings.thread_reduction = pass.seconds_summing;
    metrics.timings.barrier_wait = pass.seconds_at_barriers;

    if (fault == InjectedFault::NanGradient) {
        workers.gradient()[0] = std::numeric_limits<float>::quiet_NaN();
    } else if (fault == InjectedFault::GradientSpike) {
        for (float& g : workers.gradient())
            g *= 1e4f;
    }

    const std::span<float> grad = finish_exchange(exchange, workers, comm, hyper, owned, P);
    const double global_tokens = static_cast<double>(batch.global_sequences) * workers.seq_len();
    metrics.loss = comm.allreduce_sum(pass.loss_sum) / global_tokens;
    metrics.grad_norm =
        std::sqrt(gradient_norm_squared(grad, exchange, owned, workers, comm, hyper));
    metrics.timings.allreduce = lap(clock) + pass.seconds_after_backward;
    if (hooks.inspect_gradient) hooks.inspect_gradient(grad, metrics.grad_norm);

    const bool finite = std::isfinite(metrics.loss) && std::isfinite(metrics.grad_norm);
    if (finite && guard != nullptr) {
        const SpikeGuard::Verdict verdict = guard->judge(metrics.loss, metrics.grad_norm);
        metrics.loss_z = verdict.loss_z;
        metrics.norm_z = verdict.norm_z;
        metrics.spike = verdict.skip;
    }
    const Communicator& machine = hyper.machines != nullptr ? hyper.machines->machine : comm;
    if (!finite || metrics.spike) {
        metrics.skipped = true;
        workers.pool().run([&](int w) {
            const Range r = split_range(owned.end - owned.begin, w, W);
            std::fill(grad.begin() + static_cast<std::ptrdiff_t>(owned.begin + r.begin),
                      grad.begin() + static_cast<std::ptrdiff_t>(owned.begin + r.end), 0.0f);
        });
        // Nobody starts the next step on a shared buffer still in use.
        if (is_shared(exchange)) machine.barrier();
        return metrics;
    }
    const float scale = clip_scale(metrics.grad_norm, hyper.grad_clip);
    update_weights(model, optimizer, grad, exchange, owned, scale, workers, comm, hyper);
    // Shared memory: every slice of the weights is updated before anyone's next forward.
    if (is_shared(exchange)) machine.barrier();
    metrics.timings.optimizer = lap(clock);
    return metrics;
}

Evaluation evaluate(const Model& model, WorkerGroup& workers, const Communicator& comm,
                    std::uint64_t windows, const WindowReader& read_window) {
    const int T = workers.seq_len();
    const auto uT = static_cast<std::size_t>(T);
    // Workers beyond the batch size have no room for activations.
    const int W = workers.contributing_workers();
    const Range rank_windows = split_range(windows, comm.rank(), comm.size());
    std::vector<double> losses(windows, 0.0);
    workers.pool().run([&](int w) {
        if (w >= W) return;
        const Range mine = split_range(rank_windows.end - rank_windows.begin, w, W);
        std::vector<std::int32_t> inputs(uT), targets(uT);
        for (std::size_t i = rank_windows.begin + mine.begin; i < rank_windows.begin + mine.end;
             ++i) {
            read_window(i, inputs, targets);
            losses[i] = forward_loss(model, workers.context(w), TokenBatch{inputs, targets, 1, T});
        }
    });
    comm.allreduce_sum(std::span<double>(losses));
    double loss_sum = 0.0;
    for (const double loss : losses)
        loss_sum += loss;
    const auto tokens = static_cast<std::int64_t>(windows * uT);
    return Evaluation{tokens > 0 ? loss_sum / static_cast<double>(tokens) : 0.0, tokens};
}

}  // namespace gpt2
