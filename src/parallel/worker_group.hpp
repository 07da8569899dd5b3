// A rank's compute without MPI: the worker threads, one ThreadLocalTrainingContext each, and the
// forward/backward pass over a step's micro-batches that sums their gradients into the rank's
// one buffer layer by layer (LayerwiseReduction).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/range.hpp"
#include "model/forward_backward.hpp"
#include "model/model.hpp"
#include "parallel/layerwise_reduction.hpp"
#include "threads/thread_pool.hpp"

namespace gpt2 {

// One worker's figure of a step, alone on its cache line so workers never write the same line.
struct alignas(64) WorkerPartial {
    double seconds_at_barriers = 0.0;  // accumulate_gradients: waiting for the other workers
};

// A rank's compute: the thread pool, one ThreadLocalTrainingContext per worker and the rank's one
// full gradient buffer, which the workers sum into (and after the exchange holds the global
// gradient).
class WorkerGroup {
  public:
    // Each worker with sequences has a context for ceil(batch_size / workers) sequences of seq_len
    // tokens, with bf16 scratch when the model trains in bf16; workers beyond batch_size have no
    // sequences (their contexts hold no activations) and only help sum the gradient. `recompute`
    // sets what the contexts store (model.hpp). RankGradient::None: no rank gradient and no
    // gradient windows (LoRA: only an adapter trains, its exchange holds its gradient).
    WorkerGroup(const ModelConfig& config, int workers, int batch_size, int seq_len, bool pin,
                Precision precision = Precision::Fp32, Recompute recompute = Recompute::Cheap,
                RankGradient held = RankGradient::Full);
    WorkerGroup(const WorkerGroup&) = delete;
    WorkerGroup& operator=(const WorkerGroup&) = delete;

    [[nodiscard]] int size() const { return pool_.size(); }
    [[nodiscard]] int batch_size() const { return batch_size_; }
    [[nodiscard]] int seq_len() const { return seq_len_; }
    [[nodiscard]] ThreadPool& pool() { return pool_; }
    [[nodiscard]] ThreadLocalTrainingContext& context(int w) {
        return contexts_[static_cast<std::size_t>(w)];
    }
    [[nodiscard]] const ThreadLocalTrainingContext& context(int w) const {
        return contexts_[static_cast<std::size_t>(w)];
    }
    // Workers that get sequences: min(workers, batch_size).
    [[nodiscard]] int contributing_workers() const { return reduction_.contributors(); }
    [[nodiscard]] std::span<float> gradient() { return reduction_.gradient(); }
    [[nodiscard]] LayerwiseReduction& reduction() { return reduction_; }
    [[nodiscard]] std::size_t gradient_bytes() const {
        return reduction_.gradient().size() * sizeof(float);
    }
    // Per-worker scalars (loss sums, squared norms), allocated once.
    [[nodiscard]] std::span<WorkerPartial> partials() { return partials_; }

  private:
    int batch_size_;
    int seq_len_;
    ThreadPool pool_;
    std::vector<ThreadLocalTrainingContext> contexts_;
    LayerwiseReduction reduction_;  // after contexts_: it gives them their gradient windows
    std::vector<WorkerPartial> partials_;
};

// This rank's tokens for one optimizer step: grad_accum micro-batches of B x T, consecutive.
struct StepBatch {
    std::span<const std::int32_t> inputs;
    std::span<const std::int32_t> targets;
    int grad_accum = 1;
    // Sequences in the whole step over all ranks (B * grad_accum * world size).
    std::int64_t global_sequences = 0;
    // This rank among `ranks`: micro-step a's sequences are the step's (a * ranks + rank) * B ...,
    // as the window sampler lays the step out; they key dropout.
    int rank = 0;
    int ranks = 1;
    Dropout dropout{};
    // With a loss mask: the targets the step trains over all ranks (the others are
    // kIgnoredTarget); the loss is their mean. None: every target (global_sequences x T).
    std::optional<std::int64_t> trained_targets{};
    // Document masking in attention (TokenBatch::document_start); none: off.
    std::optional<std::int32_t> document_start{};
};

// The targets a step's loss averages over, all ranks (its gradient is scaled by 1 / that).
[[nodiscard]] double step_targets(const StepBatch& batch, int T);

// Worker w's sequences (of W workers) of micro-step `micro_step` (B x T tokens each) of the step:
// its first_sequence is the first one's index in the step (which keys dropout, the step's).
[[nodiscard]] TokenBatch worker_sequences(const StepBatch& batch, int micro_step, int B, int T,
                                          int w, int W);

// Forward/backward over the step's micro-batches, the workers' gradients summed into
// workers.gradient() (zero before the step, as AdamW leaves it) as backward goes. `ready`, if set,
// is called on the calling thread (worker 0) as each part of the rank's gradient becomes complete
// during the last micro-batch: the final LayerNorm, layers L-1 down to 0, the embeddings.
struct GradientPass {
    // Each of the step's sequences' loss (its tokens' losses added in double in order) at its
    // index in the step; zero for the other ranks' sequences. Summed across ranks and then in
    // sequence order, the step's loss is the same bits for any split of the batch.
    std::vector<double> sequence_losses;
    double seconds_summing = 0.0;             // worker 0's part of waiting at barriers and summing
    double seconds_after_backward = 0.0;      // overlapped exchange: the part left after backward
    std::vector<double> seconds_at_barriers;  // per worker: waiting for the others
};
// Worker batch `mine`'s sequences' losses (what forward_backward left in ctx.acts.losses) into
// `sequence_losses` at their indices in the step.
void record_sequence_losses(const ThreadLocalTrainingContext& ctx, const TokenBatch& mine,
                            std::span<double> sequence_losses);
[[nodiscard]] GradientPass accumulate_gradients(const Model& model, WorkerGroup& workers,
                                                const StepBatch& batch,
                                                const GradientReady& ready = {});

}  // namespace gpt2
