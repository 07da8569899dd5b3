// LayerwiseReduction: the workers of a rank sum their gradients into the rank's one full buffer
// section by section while backward runs, so a worker only ever holds a window of the gradient
// (the LM head's dwte, or two layers), not a copy of all of it.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "model/forward_backward.hpp"
#include "model/model.hpp"
#include "threads/barrier.hpp"
#include "threads/thread_pool.hpp"

namespace gpt2 {

// A part of the rank's gradient that has received every worker's contribution for the step.
// Without deferred embeddings: final_layernorm, layers L-1..0, embeddings (wte, wpe). With them:
// lm_head (lnf, and wte, wpe without the last micro-batch's embedding rows), layers L-1..0.
struct CompletedGradient {
    enum class Part { FinalLayerNorm, LmHead, Layer, Embeddings };
    Part part;
    int layer;                      // for Part::Layer
    std::span<const Range> ranges;  // [begin, end) of the rank's gradient
};
using GradientReady = std::function<void(const CompletedGradient&)>;

// Whether a rank holds the full model's gradient: None when only an adapter trains (LoRA, with
// its own buffers), so neither the rank's gradient nor the workers' windows are allocated.
enum class RankGradient { Full, None };

// How it works. Worker 0 accumulates straight into the rank's buffer; every other worker that has
// sequences writes into its context's gradient window. After each section every worker meets at
// a barrier, then sums a disjoint part of that section over the windows in worker order into the
// rank's buffer (deterministic, no lock), clearing them, and goes on with the next layer in the
// window's other slot: when layer l is complete, every part of layer l+1 has been summed. The
// encoder's token rows are summed from every worker's dresidual, each worker owning a range of
// the vocabulary and of the positions. Gradient accumulation over micro-batches accumulates in the
// rank's buffer.
class LayerwiseReduction {
  public:
    // One worker per context; the first `contributors` have sequences. Gives the contexts of
    // workers 1..contributors-1 their gradient window (RankGradient::None: neither windows nor
    // the rank's gradient, which then stays empty and no sink may be used).
    LayerwiseReduction(const ModelConfig& config, std::span<ThreadLocalTrainingContext> contexts,
                       int contributors, RankGradient held = RankGradient::Full);

    [[nodiscard]] std::span<float> gradient() { return gradient_.span(); }
    [[nodiscard]] std::span<const float> gradient() const { return gradient_.span(); }
    [[nodiscard]] int contributors() const { return contributors_; }
    // Moves the rank's buffer into `buffer` (the same size, all zero): memory other ranks read.
    void adopt_gradient(AlignedBuffer<float> buffer);

    // Before a pool run that goes through the sinks. After an aborted run it also clears the
    // windows and the rank's gradient, which hold partial sums.
    void begin_run();
    // A failing worker calls this so the others stop waiting for it.
    void abort() { barrier_.abort(); }

    // Deferred embeddings: in the micro-batch whose sinks have a `ready` callback, the embeddings'
    // token rows (each worker's dresidual) are left out of the rank's buffer, so that wte and wpe
    // are complete right after the LM head and can travel early; the rows travel separately
    // (pack_embedding_rows, then add_embedding_rows on every rank's rows).
    void set_deferred_embeddings(bool deferred) { deferred_embeddings_ = deferred; }
    // The left-out rows in sequence order (worker by worker): (rows, C) and their tokens, where
    // rows = batch_size * seq_len. Valid until the workers' next forward_backward.
    void pack_embedding_rows(std::span<float> rows, std::span<std::int32_t> tokens,
                             int seq_len) const;
    // Adds rows (rows, C) of dresidual with their tokens (consecutive sequences of seq_len) into
    // dwte and dwpe of `gradient` (the rank's buffer, or the machine's sum in shared memory), only
    // its elements in `only` (all, or a rank's slice): worker w's part of vocabulary rows and
    // positions.
    void add_embedding_rows(std::span<const float> rows, std::span<const std::int32_t> tokens,
                            int seq_len, int w, std::span<float> gradient, Range only);

    // Worker w's sink for one micro-batch. When `ready` is set, worker 0 calls it (on its own
    // thread) as each part of the gradient becomes complete; pass it on the step's last
    // micro-batch. seconds_waiting_and_summing is the time this worker spent at barriers and
    // summing.
    class WorkerSink final : public GradientSink {
      public:
        WorkerSink(LayerwiseReduction& reduction, int worker, const GradientReady* ready);
        [[nodiscard]] Head head() override;
        void head_done() override;
        [[nodiscard]] LayerView<float> layer(int l) override;
        void layer_done(int l) override;
        void embeddings(const float* dresidual, const TokenBatch& batch) override;
        // For a worker without sequences in this micro-batch: meets the others at every section
        // and sums its parts.
        void take_part_without_sequences(int seq_len);
        [[nodiscard]] double seconds_waiting_and_summing() const { return seconds_; }
        // The part of it spent at barriers, waiting for the other workers.
        [[nodiscard]] double seconds_at_barriers() const { return seconds_at_barriers_; }

      private:
        void wait();
        [[nodiscard]] bool deferring() const {
            return ready_ != nullptr && r_.deferred_embeddings_;
        }
        void announce(CompletedGradient::Part part, int layer) const;
        LayerwiseReduction& r_;
        int w_;
        const GradientReady* ready_;
        double seconds_ = 0.0;
        double seconds_at_barriers_ = 0.0;
    };

  private:
    // A piece of a section: `count` floats at `window_offset` in a window, `rank_offset` in the
    // rank's buffer.
    struct Piece {
        std::size_t window_offset;
        std::size_t rank_offset;
        std::size_t count;
    };
    void sum_part(std::span<const Piece> pieces, std::size_t window_base, int w);
    struct WorkerRows;
    // Into `gradient`'s elements in `only`.
    void sum_embedding_rows_part(std::span<const WorkerRows> workers, int seq_len, int w,
                                 std::span<float> gradient, Range only);

    ModelConfig config_;
    ParameterLayout layout_;
    int workers_;
    int contributors_;
    std::size_t layer_slot_floats_;
    AlignedBuffer<float> gradient_;
    WorkerBarrier barrier_;
    std::vector<Piece> head_pieces_;
    std::vector<std::vector<Piece>> layer_pieces_;  // [l]
    bool deferred_embeddings_ = false;
    std::vector<Range> final_layernorm_ranges_;
    std::vector<Range> lm_head_ranges_;
    std::vector<std::vector<Range>> layer_ranges_;  // [l]
    std::vector<Range> embedding_ranges_;
    // Set by each worker before the embeddings barrier, read by all after it.
    struct WorkerRows {
        const float* dresidual = nullptr;
        const std::int32_t* inputs = nullptr;
        int sequences = 0;
    };
    std::vector<WorkerRows> worker_rows_;
    std::vector<float*> windows_;  // [w]: null for worker 0 and workers without sequences
};

}  // namespace gpt2
