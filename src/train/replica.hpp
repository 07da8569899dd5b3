// This rank's replica for a run: the model (loaded weights received from rank 0, or initialised),
// the worker threads, the optimizer's slice, and the gradient exchange the run builds from the
// flags and where the ranks run (the one place that chooses among the strategies).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/range.hpp"
#include "model/model.hpp"
#include "optim/optimizer.hpp"
#include "parallel/comm.hpp"
#include "parallel/gradient_exchange.hpp"
#include "parallel/worker_group.hpp"
#include "train/memory_plan.hpp"
#include "train/options.hpp"
#include "train/start_point.hpp"

namespace gpt2 {

// How the ranks will sum the gradient, decided once from the flags and where the ranks run
// (plan_exchange), and settled when the replica is built (sharing memory may fail).
struct ExchangePlan {
    double bucket_mb = 0.0;     // --bucket-mb with auto resolved
    bool share_memory = false;  // the ranks of each machine train one copy of the weights
    // ZeRO-1: --zero 1, or Muon on ranks that share nothing (unless --zero 0 was given), whose
    // Newton-Schulz iterations then divide over the ranks instead of every rank running them all.
    bool zero = false;
    bool zero_for_muon = false;  // chosen for Muon, not asked for
    std::string share_error;     // why sharing failed (the run goes on as ZeRO-1)
    // Where the ranks run; the exchange points at its communicators.
    std::shared_ptr<const MachineGroups> machines;
    // The ranks of each machine share their memory (asked for, and it worked).
    [[nodiscard]] bool shared() const { return share_memory && share_error.empty(); }
    // Shared memory on several machines: slices also travel between machines.
    [[nodiscard]] bool across_machines() const { return shared() && machines->machines > 1; }
};

// Collective: where the ranks run, and what the flags ask for.
[[nodiscard]] ExchangePlan plan_exchange(const TrainOptions& o, const Communicator& comm);

// This rank's replica: the model, its optimizer state and the worker threads with their contexts.
// Under --zero 1 or shared memory the optimizer holds only this rank's slice of the moments.
struct Replica {
    // With LoRA (plan.need.adapter_floats > 0) the workers hold no model gradient. `weights`:
    // the model the replica trains, taken over as it is (rank 0's loaded weights: never a second
    // copy of a large model in memory), or a fresh one of `config`.
    Replica(Model weights, int num_workers, const TrainOptions& o, MemoryPlan plan)
        : memory(std::move(plan)),
          workers(weights.config, num_workers, o.batch.batch_size, o.batch.seq_len,
                  o.parallel.pin_threads, o.compute.precision, memory.need.recompute,
                  memory.need.adapter_floats > 0 ? RankGradient::None : RankGradient::Full),
          model(std::move(weights)) {}
    MemoryPlan memory;  // decided before the workers' contexts were allocated
    WorkerGroup workers;
    Model model;
    // One per world rank under --zero 1 or shared memory (the slice each updates), else empty.
    std::vector<Range> update_slices;
    // The slices a checkpoint gathers the moments from: update_slices, except that with shared
    // memory on several machines every machine holds them all, so only world rank 0's machine
    // gives them (the other ranks' slices are empty here).
    std::vector<Range> checkpoint_slices;
    // This rank's optimizer, sized to its part (set_slices).
    std::unique_ptr<Optimizer> optimizer;
    // LoRA, rank 0: lora_base_fingerprint of the frozen base, which the resume state records.
    std::uint64_t base_fingerprint = 0;
    // How a step sums the gradient across ranks (built last: it may own the shared memory).
    std::unique_ptr<GradientExchange> exchange;
    // Shared memory on several machines: the ranks on other machines that hold this rank's slice,
    // world rank 0's machine first. Null otherwise.
    const Communicator* copies_across = nullptr;

    [[nodiscard]] Range owned(const Communicator& comm, std::size_t P) const {
        return update_slices.empty() ? Range{0, P}
                                     : update_slices[static_cast<std::size_t>(comm.rank())];
    }
    [[nodiscard]] Range checkpoint_slice(const Communicator& comm) const {
        return checkpoint_slices[static_cast<std::size_t>(comm.rank())];
    }
    // Makes the optimizer for this rank's part: `slice` of `parts` slices of near-equal update cost
    // (one part: all), on norm blocks' boundaries and never through a range the optimizer updates
    // whole.
    void set_slices(const Communicator& comm, int slice, int parts, bool gives_checkpoint,
                    OptimizerKind kind, const MuonSettings& muon) {
        const std::size_t P = model.layout.total();
        update_slices.clear();
        checkpoint_slices.clear();
        if (parts > 1) {
            // Every rank's slice index, and whether it gives the checkpoint, in one value.
            const std::vector<std::uint64_t> all =
                comm.allgather(static_cast<std::uint64_t>(slice) * 2 + (gives_checkpoint ? 1 : 0));
            // On norm blocks' boundaries: the gradient's norm is the same for any split.
            const std::vector<Range> whole = indivisible_ranges(kind, model.layout);
            const std::vector<double> costs = indivisible_costs(kind, model.layout);
            const std::vector<Range> slices = slices_between(P, parts, kNormBlock, whole, costs);
            for (const std::uint64_t value : all) {
                const Range r = slices[static_cast<std::size_t>(value / 2)];
                update_slices.push_back(r);
                checkpoint_slices.push_back(value % 2 != 0 ? r : Range{r.begin, r.begin});
            }
        }
        const Range mine = owned(comm, P);
        optimizer = make_optimizer(kind, mine.end - mine.begin, mine.begin, muon);
    }
};

// Collective: the replica with the start point's weights (rank 0's, broadcast) or fresh ones,
// memory shared where `plan` says so (falling back to ZeRO-1 slices when any machine cannot share,
// recorded in plan.share_error), and its gradient exchange. With LoRA (o.lora) the model also
// gets its adapter (--lora-from's, read by rank 0 and broadcast, or init_lora from --seed), the
// optimizer is sized to the adapter and the exchange is AdapterExchange.
[[nodiscard]] std::unique_ptr<Replica> build_replica(const TrainOptions& o,
                                                     const Communicator& comm,
                                                     const ModelConfig& config, StartPoint& start,
                                                     ExchangePlan& plan);

// The full moments on rank 0 (for a checkpoint) from every rank's slice; without slices the
// optimizer itself. Every rank calls it.
[[nodiscard]] const OptimizerState& full_optimizer(const Replica& replica, const Communicator& comm,
                                                   std::unique_ptr<OptimizerState>& gathered);

// LoRA's start-up line: rank, alpha, targets and the parameters trained (empty without LoRA).
[[nodiscard]] std::string describe_lora(const Model& model);

// The log line saying how the gradient travels between ranks (empty for one rank).
[[nodiscard]] std::string describe_exchange(const ExchangePlan& plan, const Replica& replica,
                                            const TrainOptions& o, const Communicator& comm);

}  // namespace gpt2
