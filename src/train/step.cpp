#include "train/step.hpp"

#include <cmath>
#include <limits>

#include "core/clock.hpp"

namespace gpt2 {

StepMetrics train_step(const TrainState& state, const StepBatch& batch, const StepRules& rules,
                       const TestHooks& hooks) {
    StepMetrics metrics;
    const double targets = step_targets(batch, state.workers.seq_len());
    metrics.trained_targets = static_cast<std::int64_t>(targets);
    if (metrics.trained_targets == 0) {
        // Nothing to learn: no gradient (it stays zero, as the last update left it), no NaN.
        metrics.skipped = true;
        return metrics;
    }
    Stopwatch phase;

    // 1. Forward and backward on every worker. The exchange may send finished parts of the
    //    gradient while backward runs, except when a test changes the gradient first.
    const bool injecting = hooks.fault != InjectedFault::None;
    GradientPass pass = state.exchange.backward(state.model, state.workers, batch, !injecting);
    metrics.timings.forward_backward =
        phase.lap() - pass.seconds_summing - pass.seconds_after_backward;
    metrics.timings.thread_reduction = pass.seconds_summing;
    metrics.timings.barrier_wait = pass.seconds_at_barriers;
    if (hooks.fault == InjectedFault::NanGradient) {
        state.exchange.rank_gradient(state.workers)[0] = std::numeric_limits<float>::quiet_NaN();
    } else if (hooks.fault == InjectedFault::GradientSpike) {
        for (float& g : state.exchange.rank_gradient(state.workers))
            g *= 1e4f;
    }

    // 2. The rest of the exchange: the gradient summed over every rank, where this rank updates.
    const std::span<float> gradient = state.exchange.finish(state.workers);

    // 3. The step's loss over every token of every rank, and the gradient's global norm.
    state.exchange.world().allreduce_sum(std::span<double>(pass.sequence_losses));
    double loss_sum = 0.0;
    for (const double loss : pass.sequence_losses)  // in the step's sequence order: any split alike
        loss_sum += loss;
    metrics.loss = loss_sum / targets;
    metrics.grad_norm = std::sqrt(state.exchange.norm_squared(gradient, state.workers));
    metrics.timings.allreduce = phase.lap() + pass.seconds_after_backward;
    if (hooks.inspect_gradient) hooks.inspect_gradient(gradient, metrics.grad_norm);

    // 4. The verdict: a non-finite loss or norm, or (with a spike policy) a z-score above its
    //    threshold, skips the update.
    const bool finite = std::isfinite(metrics.loss) && std::isfinite(metrics.grad_norm);
    if (finite && rules.spikes != nullptr) {
        const SpikeGuard::Verdict verdict = rules.spikes->judge(metrics.loss, metrics.grad_norm);
        metrics.loss_z = verdict.loss_z;
        metrics.norm_z = verdict.norm_z;
        metrics.spike = verdict.skip;
    }
    if (!finite || metrics.spike) {
        metrics.skipped = true;
        state.exchange.discard(gradient, state.workers);
        return metrics;
    }

    // 5. Clip to the global norm and update the weights this rank owns (the optimizer's step).
    const TrainedParameters trained = state.exchange.trained(state.model);
    const StepRates rates{rules.adamw, rules.muon_lr,
                          clip_scale(metrics.grad_norm, rules.grad_clip)};
    state.optimizer.update(UpdateTarget{trained.params, trained.params_bf16, gradient,
                                        state.exchange.owned(), trained.layout},
                           rates, state.workers.pool());
    metrics.timings.optimizer = phase.lap();

    // 6. Publish: every rank holds the same updated weights.
    state.exchange.publish(state.model, state.workers);
    metrics.timings.allreduce += phase.lap();
    return metrics;
}

}  // namespace gpt2
