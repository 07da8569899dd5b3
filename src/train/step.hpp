// One optimizer step of data-parallel training, its phases written out in the order they run
// (train_step, as llm.c's train_gpt2 loop body shows them), and what a step measures.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "model/model.hpp"
#include "optim/optimizer.hpp"
#include "optim/spike_guard.hpp"
#include "parallel/gradient_exchange.hpp"
#include "parallel/worker_group.hpp"

namespace gpt2 {

// Where a step's time went on this rank (seconds), for --log-level debug.
struct StepTimings {
    double forward_backward = 0.0;
    double thread_reduction = 0.0;  // worker 0 waiting for and summing the workers' gradients
    double allreduce = 0.0;  // after backward: the gradient's (rest of the) exchange, the loss's
                             // and the norm
    double optimizer = 0.0;
    // Per worker: time spent at the reduction's barriers waiting for the others (imbalance).
    std::vector<double> barrier_wait;
};

struct StepMetrics {
    double loss = 0.0;       // mean over every token of the step, all ranks
    double grad_norm = 0.0;  // global norm before clipping
    bool skipped = false;    // non-finite loss or norm, or a spike: no update was made
    bool spike = false;      // skipped because a z-score exceeded its threshold (SpikeGuard)
    // The targets the loss covered, all ranks (with a loss mask, the trained ones); 0: the mask
    // trains none, so the step was skipped before any work (nothing to learn, no fault).
    std::int64_t trained_targets = 0;
    // z-scores against the last 128 kept steps, once there are 128 (with a SpikeGuard).
    std::optional<double> loss_z;
    std::optional<double> norm_z;
    StepTimings timings;
};

// What a step changes: the weights, this rank's optimizer (its state), the workers' buffers, and
// the exchange that sums the gradient across ranks.
struct TrainState {
    Model& model;
    Optimizer& optimizer;
    WorkerGroup& workers;
    GradientExchange& exchange;
};

// What the loop decides for a step: AdamW with this step's learning rate, the clipping norm
// (<= 0: none), the spike policy (null: no z-score skipping) and Muon's learning rate (for its
// matrices, when the optimizer is Muon).
struct StepRules {
    AdamWHyper adamw;
    float grad_clip = 1.0f;
    SpikeGuard* spikes = nullptr;
    float muon_lr = 0.0f;
};

// Faults tests inject into the gradient before it travels: a non-finite gradient, or one scaled
// by 10^4 (a norm spike).
enum class InjectedFault { None, NanGradient, GradientSpike };

// What tests may do inside a step (train_gpt2's hidden --inject-* flags set the fault).
struct TestHooks {
    InjectedFault fault = InjectedFault::None;
    // Called with the summed gradient the update is about to use, before clipping (the global sum
    // in the exchange's owned() elements), and the global norm.
    std::function<void(std::span<const float> gradient, double grad_norm)> inspect_gradient;
};

// Forward/backward on every worker, the gradient summed across ranks, its global norm, the
// verdict (a non-finite loss or norm, or a spike, skips the update and clears the gradient), then
// clipping, the optimizer's update of the weights this rank owns, and their publication. Every rank
// judges the same numbers, so all skip or all update. A step whose loss mask trains no target is
// skipped at once on every rank (each counts the same targets).
[[nodiscard]] StepMetrics train_step(const TrainState& state, const StepBatch& batch,
                                     const StepRules& rules, const TestHooks& hooks = {});

}  // namespace gpt2
