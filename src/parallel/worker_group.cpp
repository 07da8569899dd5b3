#include "parallel/worker_group.hpp"

#include <algorithm>

#include "ops/gemm.hpp"

namespace gpt2 {

namespace {
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
}  // namespace

WorkerGroup::WorkerGroup(const ModelConfig& config, int workers, int batch_size, int seq_len,
                         bool pin, Precision precision, Recompute recompute, RankGradient held)
    : batch_size_(batch_size),
      seq_len_(seq_len),
      pool_(workers, pin),
      contexts_(make_contexts(config, workers, batch_size, seq_len, precision, recompute)),
      reduction_(config, contexts_, std::min(workers, batch_size), held),
      partials_(static_cast<std::size_t>(workers)) {
    // Every worker calls the fp32 products at once: more than OpenBLAS takes moves them to oneDNN.
    choose_gemm_library(workers);
}

double step_targets(const StepBatch& batch, int T) {
    return batch.trained_targets ? static_cast<double>(*batch.trained_targets)
                                 : static_cast<double>(batch.global_sequences) * T;
}

TokenBatch worker_sequences(const StepBatch& batch, int micro_step, int B, int T, int w, int W) {
    const Range seqs = split_range(static_cast<std::size_t>(B), w, W);
    const std::size_t micro_tokens = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
    const std::size_t begin = static_cast<std::size_t>(micro_step) * micro_tokens +
                              seqs.begin * static_cast<std::size_t>(T);
    const std::size_t count = (seqs.end - seqs.begin) * static_cast<std::size_t>(T);
    // The micro-batch's first sequence in the step, as the window sampler lays it out, plus the
    // worker's place in the micro-batch.
    const std::uint64_t first = static_cast<std::uint64_t>(micro_step * batch.ranks + batch.rank) *
                                    static_cast<std::uint64_t>(B) +
                                seqs.begin;
    return TokenBatch{batch.inputs.subspan(begin, count),
                      batch.targets.subspan(begin, count),
                      static_cast<int>(seqs.end - seqs.begin),
                      T,
                      batch.dropout,
                      first,
                      batch.document_start};
}

void record_sequence_losses(const ThreadLocalTrainingContext& ctx, const TokenBatch& mine,
                            std::span<double> sequence_losses) {
    const auto T = static_cast<std::size_t>(mine.T);
    for (std::size_t s = 0; s < static_cast<std::size_t>(mine.B); ++s) {
        double loss = 0.0;
        for (std::size_t t = 0; t < T; ++t)
            loss += ctx.acts.losses[s * T + t];
        sequence_losses[mine.first_sequence + s] = loss;
    }
}

GradientPass accumulate_gradients(const Model& model, WorkerGroup& workers, const StepBatch& batch,
                                  const GradientReady& ready) {
    const int W = workers.size();
    const int B = workers.batch_size();
    const int T = workers.seq_len();
    // PyTorch's mean over the targets that count (ignore_index): each trained one weighs alike.
    const float dloss = static_cast<float>(1.0 / step_targets(batch, T));
    const std::span<WorkerPartial> sums = workers.partials();
    LayerwiseReduction& reduction = workers.reduction();
    GradientPass pass;
    pass.sequence_losses.assign(static_cast<std::size_t>(batch.global_sequences), 0.0);
    double worker0_summing = 0.0;
    reduction.begin_run();
    workers.pool().run([&](int w) {
        double summing = 0.0;
        double at_barriers = 0.0;
        try {
            for (int a = 0; a < batch.grad_accum; ++a) {
                LayerwiseReduction::WorkerSink sink(reduction, w,
                                                    a + 1 == batch.grad_accum ? &ready : nullptr);
                const TokenBatch mine = worker_sequences(batch, a, B, T, w, W);
                if (mine.B > 0) {
                    (void)forward_backward(model, workers.context(w), mine, dloss, sink);
                    record_sequence_losses(workers.context(w), mine, pass.sequence_losses);
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
        sums[static_cast<std::size_t>(w)].seconds_at_barriers = at_barriers;
        if (w == 0) worker0_summing = summing;
    });
    for (const WorkerPartial& s : sums)
        pass.seconds_at_barriers.push_back(s.seconds_at_barriers);
    pass.seconds_summing = worker0_summing;
    return pass;
}

}  // namespace gpt2
