#include "train/replica.hpp"

#include <spdlog/fmt/fmt.h>
#include <spdlog/fmt/ranges.h>

#include <algorithm>
#include <array>
#include <bit>
#include <filesystem>

#include "core/error.hpp"
#include "formats/peft.hpp"
#include "formats/resume_state.hpp"
#include "model/lora.hpp"
#include "optim/muon.hpp"
#include "parallel/adapter_exchange.hpp"
#include "parallel/allreduce.hpp"
#include "parallel/model_broadcast.hpp"
#include "parallel/shared_replica.hpp"
#include "parallel/zero.hpp"
#include "threads/cpu_topology.hpp"
#include "threads/thread_pool.hpp"
#include "train/log_lines.hpp"
#include "train/text_format.hpp"

namespace gpt2 {

namespace {
// Floats per allreduce bucket for --bucket-mb (at least one when it is not 0).
std::size_t bucket_floats(double bucket_mb) {
    if (bucket_mb <= 0.0) return 0;
    return std::max<std::size_t>(1, static_cast<std::size_t>(bucket_mb * 1024.0 * 1024.0 / 4.0));
}

// LoRA's configuration on every rank: the flags', or those of the adapter the run continues
// (--lora-from, or the checkpoint's when resuming: rank 0 reads the directory, and flags given with
// it must agree). Rank 0's adapter weights from that directory in `from`; returns whether there
// is one (on every rank).
bool agree_on_lora(const TrainOptions& o, const Communicator& comm, const ModelConfig& config,
                   const StartPoint& start, LoraConfig& lora, std::unique_ptr<LoraAdapter>& from) {
    lora = LoraConfig{o.lora.rank, o.lora.alpha,
                      parse_lora_targets(o.lora.targets, "--lora-targets", lora_modules(config))};
    const std::filesystem::path dir =
        !o.lora.from.empty() ? std::filesystem::path(o.lora.from) : start.adapter_dir;
    const std::string named =
        !o.lora.from.empty() ? "--lora-from " + o.lora.from : "the resumed adapter " + dir.string();
    if (comm.is_root()) {
        if (!dir.empty()) {
            from = read_peft_adapter(dir, config);
            const LoraConfig& read = from->config;
            const auto conflict = [&](bool differs, const std::string& flag,
                                      const std::string& given, const std::string& its) {
                if (differs) {
                    throw UsageError(flag + " " + given + " contradicts " + named +
                                     ", whose adapter_config.json says " + its + ": drop " + flag);
                }
            };
            conflict(o.was_given("lora-rank") && o.lora.rank != read.rank, "--lora-rank",
                     std::to_string(o.lora.rank), "r " + std::to_string(read.rank));
            conflict(o.was_given("lora-alpha") && o.lora.alpha != read.alpha, "--lora-alpha",
                     fmt::format("{}", o.lora.alpha), fmt::format("lora_alpha {}", read.alpha));
            conflict(o.was_given("lora-targets") && lora.targets != read.targets, "--lora-targets",
                     o.lora.targets,
                     "target_modules " +
                         fmt::format("{}", fmt::join(lora_target_modules(read.targets), ",")));
            lora = read;
        }
        // A training choice, not the adapter's: the flag's, whatever adapter_config.json records.
        lora.dropout = o.lora.dropout;
        validate_lora(lora, dir.empty() ? "--lora-rank" : named);
    }
    std::array<std::int32_t, 3 + kLoraTargets> packed{};
    packed[0] = lora.rank;
    packed[1] = std::bit_cast<std::int32_t>(lora.alpha);
    packed[2] = from != nullptr ? 1 : 0;
    for (int i = 0; i < kLoraTargets; ++i)
        packed[static_cast<std::size_t>(3 + i)] = lora.targets[static_cast<std::size_t>(i)] ? 1 : 0;
    comm.broadcast(std::span<std::int32_t>(packed));
    lora.rank = packed[0];
    lora.alpha = std::bit_cast<float>(packed[1]);
    for (int i = 0; i < kLoraTargets; ++i)
        lora.targets[static_cast<std::size_t>(i)] = packed[static_cast<std::size_t>(3 + i)] != 0;
    lora.dropout = o.lora.dropout;
    return packed[2] != 0;
}

}  // namespace

ExchangePlan plan_exchange(const TrainOptions& o, const Communicator& comm) {
    ExchangePlan e;
    e.machines = std::make_shared<const MachineGroups>(comm, o.test.simulate_machines);
    const MachineGroups& m = *e.machines;
    // Several ranks on every machine (as many on each) can share each machine's memory; one rank
    // per machine has nothing to share and overlaps its allreduce with backward instead.
    const bool can_share =
        o.parallel.share_memory && m.machine.size() > 1 && m.uniform && o.parallel.zero == 0;
    // Under one allreduce every rank would orthogonalize every matrix; ZeRO-1's reduce-scatter and
    // allgather move the same bytes and divide the update (modded-nanogpt's distributed Muon).
    e.zero_for_muon = o.optimizer.kind == OptimizerKind::Muon && !o.was_given("zero") &&
                      comm.size() > 1 && !can_share;
    e.zero = o.parallel.zero == 1 || e.zero_for_muon;
    // Across machines the gradient (or, with shared memory, each rank's slice of it) travels in
    // 25 MiB buckets while backward runs. ZeRO-1's own default is one reduce-scatter after
    // backward: in 25 MiB buckets it measured within 1% of that over 1 Gbit/s (the parameters'
    // allgather after the update stays exposed).
    // Buckets need MPI calls from the communication thread: without that thread level, auto
    // keeps one allreduce after backward.
    // (ZeRO-1 chosen for Muon keeps them: its reduce-scatter then also overlaps backward.)
    const bool buckets = m.machines > 1 && o.parallel.zero == 0 && comm.serialized_threads();
    e.bucket_mb = o.parallel.bucket_mb >= 0.0 ? o.parallel.bucket_mb : buckets ? 25.0 : 0.0;
    // On one machine, buckets asked for replace sharing.
    e.share_memory = can_share && (e.bucket_mb == 0.0 || m.machines > 1);
    return e;
}

// The full moments on rank 0 (for a checkpoint) from every rank's slice; without slices the
// optimizer itself. Every rank calls it.
const OptimizerState& full_optimizer(const Replica& replica, const Communicator& comm,
                                     std::unique_ptr<OptimizerState>& gathered) {
    if (replica.update_slices.empty()) return replica.optimizer->state;
    const std::size_t P = replica.model.layout.total();
    gathered = std::make_unique<OptimizerState>(comm.is_root() ? P : 0);
    gathered->step = replica.optimizer->state.step;
    const Range given = replica.checkpoint_slice(comm);
    for (const auto& [mine, full] : {std::pair{&replica.optimizer->state.m, &gathered->m},
                                     std::pair{&replica.optimizer->state.v, &gathered->v}}) {
        comm.gather_slices(mine->span().first(given.end - given.begin), full->span(),
                           replica.checkpoint_slices);
    }
    return *gathered;
}

std::unique_ptr<Replica> build_replica(const TrainOptions& o, const Communicator& comm,
                                       const ModelConfig& config, StartPoint& start,
                                       ExchangePlan& exchange) {
    std::int32_t have_weights = comm.is_root() && start.model && !start.base_from_seed ? 1 : 0;
    comm.broadcast(std::span<std::int32_t>(&have_weights, 1));
    const int workers = o.parallel.threads > 0 ? o.parallel.threads
                                               : std::min(available_cores(), o.batch.batch_size);
    const MachineGroups& machines = *exchange.machines;
    // Who holds how much of the AdamW moments (a failed share falls back to the same slices).
    const int moment_parts = exchange.share_memory ? machines.machine.size()
                             : exchange.zero       ? comm.size()
                                                   : 1;
    std::unique_ptr<LoraAdapter> lora_from;
    std::shared_ptr<LoraAdapter> adapter;
    bool adapter_read = false;  // from --lora-from or the resumed checkpoint, else initialised
    if (o.lora.enabled()) {
        LoraConfig lora;
        adapter_read = agree_on_lora(o, comm, config, start, lora, lora_from);
        adapter = std::make_shared<LoraAdapter>(config, lora);
    }
    MemoryPlan memory = plan_memory(o, comm, machines.machine, config, workers, moment_parts,
                                    adapter ? std::optional(adapter->config) : std::nullopt);
    // Rank 0 trains the weights it loaded in place: the loaded model becomes the replica's.
    Model weights = have_weights && comm.is_root() ? std::move(start.model->model) : Model(config);
    start.model.reset();
    if (weights.config != config || weights.lora != nullptr) {
        throw std::logic_error("build_replica: the loaded weights are not of the run's model");
    }
    auto replica = std::make_unique<Replica>(std::move(weights), workers, o, std::move(memory));
    if (have_weights) {
        broadcast_weights(comm, replica->model);
    } else {
        init_parameters(replica->model, o.seed, &replica->workers.pool());
    }
    // The bf16 copy of the weights, if any (--lora-base bf16: once the base's fingerprint is
    // taken).
    if (!o.lora.bf16_base) set_precision(replica->model, o.compute.precision);
    if (adapter) {
        // LoRA: the base stays frozen; only the adapter trains, its gradient in one allreduce.
        if (lora_from) {
            const auto read = lora_from->params.span();
            std::copy(read.begin(), read.end(), adapter->params.data());
            lora_from.reset();
        }
        if (adapter_read) {
            comm.broadcast(adapter->params.span());
        } else {
            init_lora(*adapter, o.seed);
        }
        // What a resume checks the base it is given against (the state records it).
        if (comm.is_root()) {
            replica->base_fingerprint = lora_base_fingerprint(replica->model.params.span());
        }
        if (o.lora.bf16_base) {
            // --lora-base bf16: the base never changes, so its layer matrices' fp32 copies (what
            // a resume's fingerprint was just taken from) are dead weight beside their bf16 twin.
            (void)set_bf16_frozen_base(replica->model, o.test.poison_released_base
                                                           ? Fp32Release::PoisonForTests
                                                           : Fp32Release::Discard);
        }
        for (int w = 0; w < replica->workers.size(); ++w)
            replica->workers.context(w).reserve_adapter(
                adapter->config.rank, lora_dropout_channels(config, adapter->config.dropout));
        replica->model.lora = adapter;
        // No slices: every rank updates all of the adapter, with AdamW.
        replica->optimizer = make_optimizer(OptimizerKind::AdamW, adapter->layout.total());
        replica->exchange =
            std::make_unique<AdapterExchange>(comm, adapter->layout.total(), workers);
        exchange.share_memory = false;
        exchange.bucket_mb = 0.0;
        return replica;
    }
    const OptimizerKind kind = o.optimizer.kind;
    MuonSettings muon = muon_settings(o);
    muon.bf16_products = newton_schulz_in_bf16(o.compute.precision);
    SharedGradients shared;
    if (exchange.share_memory) {
        exchange.share_error =
            share_replica_memory(replica->model, replica->workers, machines.machine, shared);
        if (o.test.inject_share_failure && !machines.on_first && exchange.share_error.empty()) {
            exchange.share_error = "--inject-share-failure";
        }
        // A machine that could not share makes every machine train without sharing.
        if (comm.allreduce_max(exchange.share_error.empty() ? 0 : 1) != 0) {
            if (exchange.share_error.empty()) {
                exchange.share_error = "another machine could not map its shared memory";
            }
            unshare_replica_memory(replica->model, replica->workers);
            if (o.parallel.bucket_mb < 0.0) exchange.bucket_mb = 0.0;  // ZeRO-1's own default
        }
    }
    if (exchange.share_memory && exchange.share_error.empty()) {
        // Each rank updates its slice of its machine's weights; the checkpoint's moments come
        // from world rank 0's machine.
        replica->set_slices(comm, machines.machine.rank(), machines.machine.size(),
                            machines.on_first, kind, muon);
        if (machines.machines > 1) replica->copies_across = &machines.across;
    } else if (exchange.zero || exchange.share_memory) {
        // ZeRO-1 (asked for, or where sharing failed: the same slices, nothing shared).
        replica->set_slices(comm, comm.rank(), comm.size(), true, kind, muon);
    } else {
        replica->set_slices(comm, 0, 1, true, kind, muon);
    }
    // The one way this run's steps exchange the gradient, now that sharing has worked or not.
    const std::size_t buckets = comm.size() > 1 ? bucket_floats(exchange.bucket_mb) : 0;
    if (exchange.shared()) {
        replica->exchange =
            std::make_unique<SharedMemoryExchange>(comm, std::move(shared), replica->update_slices,
                                                   exchange.across_machines() ? &machines : nullptr,
                                                   exchange.across_machines() ? buckets : 0);
    } else if (!replica->update_slices.empty()) {
        replica->exchange = std::make_unique<ZeroExchange>(comm, replica->update_slices, buckets);
    } else {
        replica->exchange =
            std::make_unique<AllreduceExchange>(comm, replica->model.layout.total(), buckets);
    }
    return replica;
}

std::string describe_lora(const Model& model) {
    if (model.lora == nullptr) return {};
    const LoraConfig& c = model.lora->config;
    std::vector<std::string> names;
    for (int i = 0; i < kLoraTargets; ++i) {
        const auto t = static_cast<LoraTarget>(i);
        if (!c.adapts(t)) continue;
        // GPT-2's two c_proj keep their module's prefix; every other name is unambiguous.
        names.emplace_back(t == LoraTarget::AttnCProj || t == LoraTarget::MlpCProj
                               ? lora_target_module(t)
                               : lora_target_short_name(t));
    }
    const auto trained = static_cast<double>(model.lora->layout.total());
    const auto total = static_cast<double>(model.layout.total());
    const std::string dropout =
        c.dropout > 0.0f ? fmt::format(" dropout={} (on the adapters' inputs)", c.dropout) : "";
    return fmt::format(
        "LoRA r={} alpha={}{} on {}: {} trained parameters of {} ({:.2f}%), base frozen{}", c.rank,
        c.alpha, dropout, fmt::join(names, ", "), with_commas(trained), with_commas(total),
        100.0 * trained / total,
        model.layer_matrices_bf16_only ? " (its layer matrices in bf16 only: --lora-base bf16)"
                                       : "");
}

std::string describe_exchange(const ExchangePlan& plan, const Replica& replica,
                              const TrainOptions& o, const Communicator& comm) {
    if (comm.size() == 1) return {};
    if (replica.model.lora != nullptr) {
        return fmt::format("{} the adapter's, in {} (LoRA: the base is frozen)",
                           log_lines::kGradientAcrossRanks, log_lines::kOneAllreduce);
    }
    const bool buckets = plan.bucket_mb > 0.0;
    if (plan.shared()) {
        const int machine_ranks = plan.machines->machine.size();
        if (!plan.across_machines()) {
            return fmt::format(
                "gradient across ranks: shared memory, each rank sums and updates 1/{} of the "
                "weights (auto: ranks on one machine)",
                comm.size());
        }
        return fmt::format(
            "gradient across ranks: shared memory on each machine, each rank sums and updates 1/{} "
            "of the weights, and its slice is summed across the {} machines {} (auto: {} ranks on "
            "each machine)",
            machine_ranks, plan.machines->machines,
            buckets ? fmt::format("in buckets of {} MiB while backward runs", plan.bucket_mb)
                    : "in " + std::string(log_lines::kOneAllreduce),
            machine_ranks);
    }
    if (!replica.update_slices.empty()) {
        const std::string why =
            plan.zero_for_muon ? " (auto: Muon's update divided over the ranks)" : "";
        return buckets ? fmt::format(
                             "gradient across ranks: ZeRO-1, summed in buckets of {} MiB while "
                             "backward runs, each rank keeping its slice{}",
                             plan.bucket_mb, why)
                       : std::string(
                             "gradient across ranks: ZeRO-1, one reduce-scatter after backward") +
                             why;
    }
    if (buckets) {
        return fmt::format("{} buckets of {} MiB, {}{}", log_lines::kGradientAcrossRanks,
                           plan.bucket_mb, log_lines::kSummedWhileBackward,
                           o.parallel.bucket_mb < 0.0 ? " (auto: ranks on several machines)" : "");
    }
    return fmt::format("{} {}{}", log_lines::kGradientAcrossRanks, log_lines::kOneAllreduce,
                       !o.parallel.share_memory     ? " (--share-memory off)"
                       : o.parallel.bucket_mb < 0.0 ? " (auto: ranks on one machine)"
                                                    : " (--bucket-mb 0)");
}

}  // namespace gpt2
