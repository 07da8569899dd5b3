#include "train/run_plan.hpp"
#include "train/text_format.hpp"

#include <spdlog/spdlog.h>

#include <array>
#include <memory>
#include <random>
#include <string>

#include "core/error.hpp"
#include "formats/resume_state.hpp"
#include "train/log_lines.hpp"

namespace gpt2 {

namespace {
int derived_grad_accum(const TrainOptions& o, int world) {
    if (o.batch.grad_accum > 0) return o.batch.grad_accum;
    if (o.batch.total_batch_tokens > 0) {
        return static_cast<int>(
            o.batch.total_batch_tokens /
            (static_cast<std::int64_t>(o.batch.batch_size) * o.batch.seq_len * world));
    }
    return 1;
}

// Rank 0: the checkpoint's moments into the optimizer (or, with slices, into `full_moments`),
// its step, schedule, lineage, sample generator and spike windows into `plan` and `header`
// (first step, optimizer step, schedule length, micro-steps per step); another number of ranks
// keeps the checkpoint's global batch (elastic resume).
void read_resume_on_root(const TrainOptions& o, const Communicator& comm, const StartPoint& start,
                         Replica& replica, RunPlan& plan, std::array<std::int64_t, 4>& header,
                         std::unique_ptr<OptimizerState>& full_moments) {
    if (!replica.update_slices.empty()) {
        full_moments = std::make_unique<OptimizerState>(replica.model.layout.total());
    }
    OptimizerState& loaded = full_moments ? *full_moments : replica.optimizer->state;
    const ResumeState resume = load_resume_state(start.state_file, replica.model.config, loaded);
    replica.optimizer->state.step = loaded.step;
    // A LoRA run's base was checked against the state when it came from --init-from; a random
    // base is checked here, now that it is built again from --seed.
    if (resume.lora.config.rank > 0 && resume.lora.base_fingerprint != replica.base_fingerprint) {
        throw UsageError(fmt::format(
            "--resume {}: the base weights built for this run are not the ones the LoRA run "
            "adapted (base fingerprint {:016x}, the state's {:016x}): give the --seed it was "
            "trained with",
            start.state_file.string(), replica.base_fingerprint, resume.lora.base_fingerprint));
    }
    // Elastic resume: another number of ranks (or --batch-size) keeps the checkpoint's
    // global batch through the number of micro-steps, unless the user fixed that.
    const std::int64_t per_micro_step = static_cast<std::int64_t>(o.batch.batch_size) * comm.size();
    const bool accum_is_free = o.batch.grad_accum == 0 && o.batch.total_batch_tokens == 0;
    if (accum_is_free && resume.seq_len == o.batch.seq_len &&
        resume.sequences_per_step != plan.global_sequences) {
        if (resume.sequences_per_step % per_micro_step != 0) {
            throw UsageError(
                "--resume " + start.state_file.string() + ": the checkpoint's global " +
                "batch is " + std::to_string(resume.sequences_per_step) +
                " sequences per step, which " + std::to_string(comm.size()) +
                " ranks x --batch-size " + std::to_string(o.batch.batch_size) + " = " +
                std::to_string(per_micro_step) +
                " per micro-step does not divide; choose ranks x --batch-size dividing " +
                std::to_string(resume.sequences_per_step));
        }
        header[3] = resume.sequences_per_step / per_micro_step;
        spdlog::info(
            "elastic resume: {} ranks x batch {} x grad accum {} keeps the checkpoint's "
            "{} sequences per step",
            comm.size(), o.batch.batch_size, header[3], resume.sequences_per_step);
    }
    const std::int64_t global = per_micro_step * header[3];
    if (resume.sequences_per_step != global || resume.seq_len != o.batch.seq_len) {
        throw UsageError("--resume " + start.state_file.string() + ": the checkpoint used " +
                         std::to_string(resume.sequences_per_step) + " sequences of " +
                         std::to_string(resume.seq_len) + " tokens per step; this run uses " +
                         std::to_string(global) + " of " + std::to_string(o.batch.seq_len) +
                         " (keep the global batch to resume)");
    }
    if (resume.lr_decay_steps > 0 && !o.was_given("lr-decay-steps")) {
        header[2] = resume.lr_decay_steps;
        if (header[2] != o.optimizer.max_steps) {
            spdlog::info(
                "schedule: {} steps, as the run started with (--lr-decay-steps "
                "changes it)",
                header[2]);
        }
    }
    header[0] = resume.step;
    header[1] = replica.optimizer->state.step;
    if (resume.run_id != 0) plan.run_id = resume.run_id;
    plan.sample_rng.set_state(resume.sample_rng);
    plan.spikes.loss = resume.loss_window;
    plan.spikes.norm = resume.norm_window;
    spdlog::info("{} {} at step {}", log_lines::kResumingFrom, start.state_file.string(),
                 resume.step);
}

// Every rank receives the checkpoint's moments that it keeps: all of them, or its slice.
void distribute_moments(const Communicator& comm, Replica& replica,
                        const std::unique_ptr<OptimizerState>& full_moments) {
    if (replica.update_slices.empty()) {
        comm.broadcast(replica.optimizer->state.m.span());
        comm.broadcast(replica.optimizer->state.v.span());
    } else {  // each rank receives only its slice of the moments
        const std::span<const float> no_moments;
        const Range given = replica.checkpoint_slice(comm);
        for (const auto& [full, mine] :
             {std::pair{full_moments ? full_moments->m.span() : no_moments,
                        replica.optimizer->state.m.span()},
              std::pair{full_moments ? full_moments->v.span() : no_moments,
                        replica.optimizer->state.v.span()}}) {
            comm.scatter_slices(full, mine.first(given.end - given.begin),
                                replica.checkpoint_slices);
            // Shared memory on several machines: world rank 0's machine received the
            // slices; each passes its own to the ranks holding it elsewhere.
            if (replica.copies_across != nullptr) replica.copies_across->broadcast(mine);
        }
    }
}
}  // namespace

RunPlan plan_run(const TrainOptions& o, const Communicator& comm, const StartPoint& start,
                 Replica& replica) {
    RunPlan plan;
    plan.grad_accum = derived_grad_accum(o, comm.size());
    plan.global_sequences =
        static_cast<std::int64_t>(o.batch.batch_size) * comm.size() * plan.grad_accum;
    plan.sample_rng = Rng::derived(o.seed, 0x5a3e);
    plan.spikes.max_loss_z = o.safety.skip_loss_z;
    plan.spikes.max_norm_z = o.safety.skip_norm_z;
    std::int32_t resuming = comm.is_root() && !start.state_file.empty() ? 1 : 0;
    comm.broadcast(std::span<std::int32_t>(&resuming, 1));
    plan.resumed = resuming != 0;
    std::unique_ptr<OptimizerState> full_moments;  // rank 0, --zero 1: the checkpoint's moments
    // first step, optimizer step, schedule length, micro-steps per step
    std::array<std::int64_t, 4> header{
        0, 0, o.optimizer.lr_decay_steps > 0 ? o.optimizer.lr_decay_steps : o.optimizer.max_steps,
        plan.grad_accum};
    if (comm.is_root()) {
        std::random_device entropy;
        plan.run_id = (static_cast<std::uint64_t>(entropy()) << 32) ^ entropy() ^ 1;
    }
    if (plan.resumed) {
        if (comm.is_root())
            read_resume_on_root(o, comm, start, replica, plan, header, full_moments);
        distribute_moments(comm, replica, full_moments);
    }
    comm.broadcast(std::span<std::int64_t>(header));
    // Every rank judges spikes against the same windows (plain data: sent as bytes).
    for (SpikeWindow* window : {&plan.spikes.loss, &plan.spikes.norm}) {
        comm.broadcast(std::span(reinterpret_cast<std::uint8_t*>(window), sizeof(SpikeWindow)));
    }
    plan.first_step = header[0];
    replica.optimizer->state.step = header[1];
    plan.decay_steps = header[2];
    plan.grad_accum = static_cast<int>(header[3]);
    plan.global_sequences =
        static_cast<std::int64_t>(o.batch.batch_size) * comm.size() * plan.grad_accum;
    return plan;
}

void warn_about_schedule(const TrainOptions& o, const RunPlan& plan) {
    if (o.optimizer.warmup_steps > o.optimizer.max_steps ||
        o.optimizer.warmup_steps >= plan.decay_steps) {
        spdlog::warn(
            "--warmup-steps {} is not shorter than the run ({}, schedule over {}): "
            "the learning rate {} --lr before the end",
            o.optimizer.warmup_steps, counted(o.optimizer.max_steps, "step"), plan.decay_steps,
            o.optimizer.warmup_steps > o.optimizer.max_steps ? "never reaches" : "only reaches");
    }
}

}  // namespace gpt2
