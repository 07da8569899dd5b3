#include "train/memory_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>

#include "core/error.hpp"
#include "optim/muon.hpp"
#include "parallel/comm.hpp"
#include "train/log_lines.hpp"
#include "train/options.hpp"
#include "train/text_format.hpp"

namespace gpt2 {

MemoryNeed memory_need(const ModelConfig& config, int workers, int batch_size, int seq_len,
                       Precision precision, Recompute recompute, int moment_parts,
                       const std::optional<LoraConfig>& lora, bool layer_matrices_bf16_only,
                       OptimizerKind optimizer) {
    MemoryNeed need;
    need.recompute = recompute;
    need.workers = workers;
    need.with_sequences = std::min(workers, batch_size);
    need.sequences_per_worker = (batch_size + workers - 1) / workers;
    need.seq_len = seq_len;
    need.worker_parts =
        context_parts(config, need.sequences_per_worker, seq_len, precision, recompute);
    for (const ContextPart& part : need.worker_parts)
        need.worker_bytes += part.bytes;
    const std::size_t P = ParameterLayout(config).total();
    const std::size_t weights = P * sizeof(float) + (precision == Precision::Bf16 ? P * 2 : 0);
    if (lora) {
        // LoRA: the base is frozen; each worker sums its own adapter gradient and keeps the
        // adapter's products' scratch (training_context.hpp).
        const std::size_t adapter_floats = LoraLayout(config, *lora).total();
        need.adapter_floats = adapter_floats;
        // --lora-base bf16: the layer matrices' fp32 pages are handed back after the start.
        need.frozen_bytes =
            weights -
            (layer_matrices_bf16_only ? releasable_fp32_bytes(ParameterLayout(config)) : 0);
        need.adapter_bytes =
            adapter_floats * sizeof(float) * (1 + static_cast<std::size_t>(workers)) +
            static_cast<std::size_t>(need.with_sequences) *
                ThreadLocalTrainingContext::adapter_scratch_floats(
                    need.sequences_per_worker, seq_len, lora->rank,
                    lora_dropout_channels(config, lora->dropout)) *
                sizeof(float);
        need.adapter_moment_bytes = 2 * adapter_floats * sizeof(float);
        // A checkpoint merges the adapter into one matrix at a time as it writes the weights.
        need.merge_buffer_bytes =
            merge_buffer_floats(config, lora, layer_matrices_bf16_only) * sizeof(float);
        need.rank_bytes = need.frozen_bytes + need.adapter_bytes + need.adapter_moment_bytes +
                          need.merge_buffer_bytes;
        return need;
    }
    // Every worker with sequences but the first writes through a gradient window
    // (parallel/layerwise_reduction.hpp).
    need.windows_bytes = static_cast<std::size_t>(std::max(need.with_sequences - 1, 0)) *
                         gradient_window_floats(config) * sizeof(float);
    const std::size_t gradient = P * sizeof(float);
    // The optimizer's state (this rank's part of it) and each worker's scratch for its update.
    const ParameterLayout layout(config);
    const std::size_t moments =
        optimizer_state_bytes(optimizer, layout) / static_cast<std::size_t>(moment_parts) +
        static_cast<std::size_t>(workers) *
            optimizer_scratch_bytes(optimizer, layout, newton_schulz_in_bf16(precision));
    need.rank_bytes = weights + gradient + moments;
    return need;
}

namespace {
bool fits(const MemoryNeed& need, int ranks_on_machine,
          const std::optional<AvailableMemory>& available) {
    return !available ||
           need.total() * static_cast<std::size_t>(ranks_on_machine) <= available->bytes;
}

// Flags that would make this rank's machine fit, tried from the least change in results' cost:
// --recompute layers, the largest --batch-size, fewer --threads.
std::string what_would_fit(const TrainOptions& o, const ModelConfig& config, const MemoryNeed& need,
                           int moment_parts, const std::optional<LoraConfig>& lora, int ranks,
                           const std::optional<AvailableMemory>& available) {
    const auto need_for = [&](int workers, int batch, Recompute level) {
        return memory_need(config, workers, batch, o.batch.seq_len, o.compute.precision, level,
                           moment_parts, lora, o.lora.bf16_base, o.optimizer.kind);
    };
    std::vector<std::string> options;
    if (need.recompute == Recompute::Cheap &&
        fits(need_for(need.workers, o.batch.batch_size, Recompute::Layers), ranks, available)) {
        options.push_back("--recompute layers");
    }
    for (int batch = o.batch.batch_size - 1; batch >= 1; --batch) {
        if (fits(need_for(need.workers, batch, need.recompute), ranks, available)) {
            options.push_back(
                fmt::format("--batch-size {} (with --grad-accum to keep the tokens "
                            "per step)",
                            batch));
            break;
        }
    }
    for (int workers = need.workers - 1; workers >= 1; --workers) {
        if (fits(need_for(workers, o.batch.batch_size, need.recompute), ranks, available)) {
            options.push_back(fmt::format("--threads {}", workers));
            break;
        }
    }
    if (options.empty()) {
        return fmt::format(
            "nothing fits, not even --recompute layers --batch-size 1 ({} a rank)",
            human_bytes(static_cast<double>(need_for(1, 1, Recompute::Layers).total())));
    }
    std::string joined;
    for (std::size_t i = 0; i < options.size(); ++i)
        joined += (i == 0 ? "" : i + 1 == options.size() ? " or " : ", ") + options[i];
    return "would fit: " + joined;
}
}  // namespace

MemoryPlan plan_memory(const TrainOptions& o, const Communicator& comm, const Communicator& machine,
                       const ModelConfig& config, int workers, int moment_parts,
                       const std::optional<LoraConfig>& lora) {
    MemoryPlan plan;
    plan.ranks_on_machine = machine.size();
    plan.available = available_memory();
    const auto need_for = [&](Recompute level) {
        return memory_need(config, workers, o.batch.batch_size, o.batch.seq_len,
                           o.compute.precision, level, moment_parts, lora, o.lora.bf16_base,
                           o.optimizer.kind);
    };
    Recompute level = o.compute.recompute.value_or(Recompute::Cheap);
    if (!o.compute.recompute) {
        // The least recomputation that fits on every machine.
        plan.chosen_automatically = true;
        const bool cheap_fits =
            fits(need_for(Recompute::Cheap), plan.ranks_on_machine, plan.available);
        if (comm.allreduce_min(cheap_fits ? 1 : 0) == 0) level = Recompute::Layers;
    }
    plan.need = need_for(level);
    const bool ok = fits(plan.need, plan.ranks_on_machine, plan.available);
    const std::int64_t first_short = comm.allreduce_min(ok ? INT_MAX : comm.rank());
    if (first_short == INT_MAX) return plan;
    if (comm.rank() == first_short) {
        const std::string per_machine =
            plan.ranks_on_machine > 1
                ? fmt::format(" x {} ranks on this machine", plan.ranks_on_machine)
                : std::string();
        const MemoryNeed& n = plan.need;
        const std::string for_rank =
            n.adapter_floats > 0
                ? fmt::format(
                      "{} for the rank (LoRA: frozen weights {}, adapter {}, adapter moments {}, "
                      "checkpoint merge buffer {})",
                      human_bytes(static_cast<double>(n.rank_bytes)),
                      human_bytes(static_cast<double>(n.frozen_bytes)),
                      human_bytes(static_cast<double>(n.adapter_bytes)),
                      human_bytes(static_cast<double>(n.adapter_moment_bytes)),
                      human_bytes(static_cast<double>(n.merge_buffer_bytes)))
                : fmt::format("{} for the rank",
                              human_bytes(static_cast<double>(n.windows_bytes + n.rank_bytes)));
        throw InputError(fmt::format(
            "{}: {} x {} (--recompute {}{}) + {}{} = {}, but {} is available ({}); {}",
            log_lines::kNotEnoughMemory, counted(plan.need.with_sequences, "worker"),
            human_bytes(static_cast<double>(plan.need.worker_bytes)), recompute_name(level),
            plan.chosen_automatically ? ", the least there is" : "", for_rank, per_machine,
            human_bytes(static_cast<double>(plan.need.total()) * plan.ranks_on_machine),
            human_bytes(static_cast<double>(plan.available->bytes)), plan.available->source,
            what_would_fit(o, config, plan.need, moment_parts, lora, plan.ranks_on_machine,
                           plan.available)));
    }
    // Ended by the failing rank's abort; never returns.
    (void)comm.allreduce_min(0);
    throw InputError(std::string(log_lines::kNotEnoughMemory) + " on another rank");
}

std::vector<std::string> describe_memory(const MemoryPlan& plan) {
    const MemoryNeed& n = plan.need;
    std::vector<std::string> lines;
    lines.push_back(fmt::format(
        "memory per worker ({} x {} tokens, --recompute {}{}):", n.sequences_per_worker, n.seq_len,
        recompute_name(n.recompute), plan.chosen_automatically ? " chosen by auto" : ""));
    for (const ContextPart& part : n.worker_parts)
        lines.push_back(fmt::format("  {:<38} {:>10}", part.name,
                                    human_bytes(static_cast<double>(part.bytes))));
    lines.push_back(
        fmt::format("  {:<38} {:>10}", "total", human_bytes(static_cast<double>(n.worker_bytes))));
    const std::string available =
        plan.available ? fmt::format("{} available ({})",
                                     human_bytes(static_cast<double>(plan.available->bytes)),
                                     plan.available->source)
                       : std::string("available memory unknown");
    if (n.adapter_floats > 0) {
        lines.push_back(fmt::format(
            "memory per rank (LoRA): {} x {} (--recompute {}{}) + frozen weights {} + adapter {} "
            "(weights, each worker's gradient, scratch) + adapter moments {} + checkpoint merge "
            "buffer {} = {}{} | {}",
            counted(n.with_sequences, "worker"), human_bytes(static_cast<double>(n.worker_bytes)),
            recompute_name(n.recompute), plan.chosen_automatically ? " chosen by auto" : "",
            human_bytes(static_cast<double>(n.frozen_bytes)),
            human_bytes(static_cast<double>(n.adapter_bytes)),
            human_bytes(static_cast<double>(n.adapter_moment_bytes)),
            human_bytes(static_cast<double>(n.merge_buffer_bytes)),
            human_bytes(static_cast<double>(n.total())),
            plan.ranks_on_machine > 1
                ? fmt::format(" ({} ranks on this machine)", plan.ranks_on_machine)
                : std::string(),
            available));
        return lines;
    }
    lines.push_back(fmt::format(
        "memory per rank: {} x {} (--recompute {}{}){} + weights, gradient and moments {} = {}{} "
        "| {}",
        counted(n.with_sequences, "worker"), human_bytes(static_cast<double>(n.worker_bytes)),
        recompute_name(n.recompute), plan.chosen_automatically ? " chosen by auto" : "",
        n.windows_bytes > 0
            ? " + gradient windows " + human_bytes(static_cast<double>(n.windows_bytes))
            : std::string(),
        human_bytes(static_cast<double>(n.rank_bytes)), human_bytes(static_cast<double>(n.total())),
        plan.ranks_on_machine > 1
            ? fmt::format(" ({} ranks on this machine)", plan.ranks_on_machine)
            : std::string(),
        available));
    return lines;
}

}  // namespace gpt2
