// The training program's entry and its step loop: the start (tokenizer, tokens, model, replica,
// plan), then each step's batch, rules and phases, its log line, and what follows it.
#include "train/run.hpp"
#include "train/log_lines.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/clock.hpp"
#include "core/error.hpp"
#include "core/stop_signal.hpp"
#include "formats/checkpoint.hpp"
#include "formats/resume_state.hpp"
#include "model/lora.hpp"
#include "train/memory_plan.hpp"
#include "train/model_shape.hpp"
#include "train/out_dir.hpp"
#include "train/start_point.hpp"
#include "train/text_format.hpp"
#include "train/training_loop.hpp"

namespace gpt2 {

namespace {

constexpr int kBenchmarkWarmup = 2;

}  // namespace

TrainingLoop::TrainingLoop(const TrainOptions& o, const Communicator& comm, const Corpus& corpus,
                           Replica& replica, RunPlan& plan, const ExchangePlan& exchange,
                           double startup_seconds)
    : o_(o),
      comm_(comm),
      corpus_(corpus),
      replica_(replica),
      plan_(plan),
      B_(o.batch.batch_size),
      T_(o.batch.seq_len),
      benchmark_(o.compute.benchmark > 0),
      last_step_(benchmark_ ? plan.first_step + o.compute.benchmark + kBenchmarkWarmup
                            : o.optimizer.max_steps),
      tokens_per_step_(plan.global_sequences * o.batch.seq_len),
      exchange_(exchange),
      schedule_{o.optimizer.schedule, o.optimizer.lr, o.optimizer.min_lr, o.optimizer.warmup_steps,
                plan.decay_steps},
      log_every_(o.log_every > 0 ? o.log_every : log_every_for(last_step_ - plan.first_step)),
      flops_per_step_((replica.model.lora != nullptr
                           ? lora_training_flops_per_token(replica.model.config, o.batch.seq_len,
                                                           replica.model.lora->config)
                           : training_flops_per_token(replica.model.config, o.batch.seq_len)) *
                      static_cast<double>(tokens_per_step_)),
      yardstick_(mfu_yardstick(o, cores_in_use(comm, replica.workers.size()))),
      peak_gflops_(yardstick_.per_core * yardstick_.cores),
      startup_seconds_(startup_seconds),
      run_config_(config_json(o, replica.model.config, comm.size(), replica.workers.size())),
      metrics_(comm.is_root() ? o.metrics_file : ""),
      inputs_(static_cast<std::size_t>(plan.grad_accum) * B_ * T_),
      targets_(inputs_.size()),
      train_sampler_(corpus.train_store, T_, o.seed, !o.data.no_shuffle),
      val_windows_(std::min(static_cast<std::uint64_t>(o.eval.val_tokens / o.batch.seq_len),
                            corpus.val_store.num_windows(o.batch.seq_len))),
      hellaswag_(load_hellaswag(o, comm, replica.model.config.vocab_size)),
      token_bytes_(text_bytes_per_token(*corpus.tokenizer)),
      eval_source_(plan.resumed ? fmt::format("the checkpoint of step {} (--resume {})",
                                              plan.first_step, o.checkpoints.resume)
                   : !o.model.init_from.empty() ? "--init-from " + o.model.init_from
                                                : fmt::format("fresh weights (--seed {})", o.seed)),
      checkpoint_clock_(o.checkpoints.checkpoint_minutes, o.test.minutes_per_step) {
    if (comm.is_root() && !benchmark_ && !o.eval.eval_only) {
        std::error_code ec;
        std::filesystem::create_directories(o.checkpoints.out_dir, ec);
        if (ec || !std::filesystem::is_directory(o.checkpoints.out_dir)) {
            throw InputError("--out-dir " + o.checkpoints.out_dir + ": cannot create directory (" +
                             ec.message() + ")");
        }
        // Room for the first checkpoint, found now rather than when it is written.
        const std::shared_ptr<LoraAdapter>& adapter = replica.model.lora;
        const std::size_t moments = adapter != nullptr
                                        ? adapter->params.size()
                                        : ParameterLayout(replica.model.config).total();
        // The adapter directory: its weights, and tensor names and JSON well within 64 KiB.
        constexpr std::uintmax_t kAdapterMetadata = 64 << 10;
        check_out_dir_room(
            o.checkpoints.out_dir,
            CheckpointFootprint{
                checkpoint_file_bytes(replica.model.config, corpus.tokenizer->serialize().size(),
                                      run_config_.size()),
                resume_state_file_bytes(moments, adapter != nullptr, o.optimizer.kind,
                                        replica.model.config.is_gpt2()),
                adapter != nullptr ? adapter->params.size() * sizeof(float) + kAdapterMetadata
                                   : 0});
    }
    metrics_.write({{"type", "run"},
                    {"start_step", plan.first_step},
                    {"max_steps", last_step_},
                    {"time", iso_time_now()},
                    {"resumed", plan.resumed},
                    // The lineage a resumed run continues (hex: JSON readers keep 53-bit numbers).
                    {"run_id", fmt::format("{:016x}", plan.run_id)},
                    {"ranks", comm.size()},
                    {"threads", replica.workers.size()},
                    {"precision", precision_name(replica.model.precision)},
                    {"tokens_per_step", tokens_per_step_},
                    {"model", describe(replica.model.config)}});
}

int TrainingLoop::run() {
    // A stop during start-up (on any rank): nothing trained, nothing to save.
    if (const std::int64_t signal = comm_.allreduce_max(std::int64_t{stop_signal().load()})) {
        spdlog::info("stopped by signal before the first step ({}): nothing trained, nothing saved",
                     signal_name(static_cast<int>(signal)));
        return 0;
    }
    if (o_.eval.eval_only) {  // the weights as they are: no step, nothing saved
        validate(plan_.first_step);
        evaluate_hellaswag(plan_.first_step);
        return 0;
    }
    if (plan_.first_step == 0 && !benchmark_ && o_.eval.val_every > 0) {
        validate(0);
        if (o_.eval.eval_every == 0) evaluate_hellaswag(0);
    }
    double ema_seconds = 0.0;
    int bad_steps = 0;
    for (std::int64_t s = plan_.first_step; s < last_step_; ++s) {
        const StepOutcome outcome = step(s, bad_steps, ema_seconds);
        const std::int64_t completed = s + 1;
        if (benchmark_) {
            if (outcome.stop) return 130;  // interrupted: no figures, nothing saved
            continue;
        }
        const bool last = completed == last_step_;
        const bool validating =
            (o_.eval.val_every > 0 && completed % o_.eval.val_every == 0) || last;
        if (validating) validate(completed);
        if ((o_.eval.eval_every == 0 && validating) ||
            (o_.eval.eval_every > 0 && (completed % o_.eval.eval_every == 0 || last))) {
            evaluate_hellaswag(completed);
        }
        if (o_.eval.sample_every > 0 && (completed % o_.eval.sample_every == 0 || last))
            sample(completed);
        if ((o_.checkpoints.checkpoint_every > 0 &&
             completed % o_.checkpoints.checkpoint_every == 0) ||
            last || outcome.stop || outcome.checkpoint_due) {
            save(completed);
        }
        if (outcome.stop) {
            spdlog::info("{} {} ({}); resume with --resume auto", log_lines::kStoppedBySignal,
                         completed, signal_name(outcome.signal));
            return 0;
        }
    }
    if (benchmark_ && comm_.is_root()) report_benchmark();
    return 0;
}

TrainingLoop::StepOutcome TrainingLoop::step(std::int64_t step, int& bad_steps,
                                             double& ema_seconds) {
    const auto t0 = Clock::now();
    // The batch: this rank's windows of the step's global batch, the same for any split of it
    // over ranks, micro-steps and workers.
    train_sampler_.fill_step(static_cast<std::uint64_t>(step), comm_.rank(), comm_.size(), B_,
                             plan_.grad_accum, inputs_, targets_);
    const StepBatch batch{
        inputs_, targets_, plan_.grad_accum, plan_.global_sequences, comm_.rank(), comm_.size(),
        Dropout{o_.optimizer.dropout, o_.seed, static_cast<std::uint64_t>(step),
                replica_.model.lora != nullptr ? replica_.model.lora->config.dropout : 0.0f},
        // With a loss mask, every rank counts the step's trained targets alike
        // (the windows of every slot are known to all).
        corpus_.train_store.masked() ? std::optional(train_sampler_.step_trained_targets(
                                           static_cast<std::uint64_t>(step),
                                           static_cast<std::uint64_t>(plan_.global_sequences)))
                                     : std::nullopt,
        corpus_.document_start};
    // The step's rules: the schedule's learning rate (Muon's scaled alike), clipping, and the
    // spike policy.
    const float lr = learning_rate(schedule_, step);
    const StepRules rules{AdamWHyper{lr, o_.optimizer.beta1, o_.optimizer.beta2, o_.optimizer.eps,
                                     o_.optimizer.weight_decay},
                          o_.optimizer.grad_clip, &plan_.spikes,
                          o_.optimizer.muon_lr * (lr / o_.optimizer.lr)};
    // Forward/backward over the workers, the exchange, the norm, the verdict, clipping and the
    // update, in that order (train/step.cpp).
    const StepMetrics m = train_step(
        TrainState{replica_.model, *replica_.optimizer, replica_.workers, *replica_.exchange},
        batch, rules, test_hooks(step));
    const double seconds = seconds_since(t0);
    const std::int64_t completed = step + 1;
    count_skipped(m, completed, bad_steps);
    ema_seconds = step == plan_.first_step ? seconds : 0.9 * ema_seconds + 0.1 * seconds;
    if (benchmark_ && step >= plan_.first_step + kBenchmarkWarmup) {
        step_ms_.push_back(seconds * 1e3);
    }
    log_step(m, completed, rules.adamw.lr, seconds, ema_seconds);
    if (o_.safety.check_replicas > 0 && completed % o_.safety.check_replicas == 0)
        check_replicas(completed);
    // One collective per step: any rank's stop signal and rank 0's checkpoint clock, as
    // signal * 2 + due (a stop saves anyway, so the clock's bit may be outweighed).
    checkpoint_clock_.step_done();
    const std::int64_t mine = std::int64_t{stop_signal().load()} * 2 +
                              (comm_.is_root() && checkpoint_clock_.due() ? 1 : 0);
    const std::int64_t all = comm_.allreduce_max(mine);
    const int signal = static_cast<int>(all / 2);
    return StepOutcome{signal != 0 || completed == o_.test.stop_at_step, signal, all % 2 == 1};
}

// A skipped step is counted and reported; too many in a row end the run (keeping the last good
// checkpoint). A kept step resets the count.
void TrainingLoop::count_skipped(const StepMetrics& m, std::int64_t completed, int& bad_steps) {
    if (m.skipped && m.trained_targets == 0) {  // not a fault: said, and not counted
        spdlog::warn(
            "step {}: the loss mask trains no target in the step's {} sequences (all prompt): "
            "nothing to learn, update skipped",
            completed, plan_.global_sequences);
        return;
    }
    if (!m.skipped) {
        bad_steps = 0;
        return;
    }
    ++bad_steps;
    if (m.spike) {
        const bool loss_spike =
            o_.safety.skip_loss_z > 0 && m.loss_z && *m.loss_z > o_.safety.skip_loss_z;
        spdlog::warn("step {}: {} z-score {:+.1f} above {} {}: update skipped ({} in a row)",
                     completed, loss_spike ? "loss" : "gradient norm",
                     loss_spike ? *m.loss_z : m.norm_z.value_or(0.0),
                     loss_spike ? "--skip-loss-z" : "--skip-norm-z",
                     loss_spike ? o_.safety.skip_loss_z : o_.safety.skip_norm_z, bad_steps);
    } else {
        spdlog::warn(
            "step {}: non-finite loss {} or gradient norm {}: update skipped ({} in a row)",
            completed, m.loss, m.grad_norm, bad_steps);
    }
    if (bad_steps >= o_.safety.max_bad_steps) {
        throw InputError(
            "stopping: " + std::to_string(bad_steps) +
            " skipped steps in a row (non-finite or spikes, --max-bad-steps); " +
            (last_checkpoint_
                 ? "the last good checkpoint, " + last_checkpoint_->string() + ", is kept"
                 : std::string("this run has written no checkpoint yet")));
    }
}

// The step line, the debug line with the phases' times, and the metrics record.
void TrainingLoop::log_step(const StepMetrics& m, std::int64_t completed, float lr, double seconds,
                            double ema_seconds) {
    const double tok_s = static_cast<double>(tokens_per_step_) / seconds;
    const double mfu = flops_per_step_ / seconds / (peak_gflops_ * 1e9);
    // z-scores as llm.c prints them, once 128 steps make a window.
    const auto z = [](const std::optional<double>& value) {
        return value ? fmt::format(" ({:+.1f}z)", *value) : std::string();
    };
    // With a loss mask, the targets the loss covered.
    const std::string trained =
        corpus_.train_store.masked()
            ? fmt::format(" | trained {} of {} tok",
                          with_commas(static_cast<double>(m.trained_targets)),
                          with_commas(static_cast<double>(tokens_per_step_)))
            : std::string();
    // Every log_every_-th line, and the lines a reader looks for: the first of this start, the
    // last, and any step whose update was skipped.
    const bool shown = completed % log_every_ == 0 || completed == plan_.first_step + 1 ||
                       completed == last_step_ || m.skipped;
    spdlog::log(shown ? spdlog::level::info : spdlog::level::debug,
                "step {}/{} | loss {:.4f}{}{} | lr {:.1e} | norm {:.2f}{} | {:.0f} ms | {} tok/s | "
                "MFU {:.0f}% | ETA {}",
                completed, last_step_, m.loss, z(m.loss_z), trained, lr, m.grad_norm, z(m.norm_z),
                seconds * 1e3, with_commas(tok_s), mfu * 100,
                format_duration(ema_seconds * static_cast<double>(last_step_ - completed)));
    std::string barrier_wait;
    for (const double seconds : m.timings.barrier_wait)
        barrier_wait += fmt::format("{}{:.0f}", barrier_wait.empty() ? "" : "/", seconds * 1e3);
    spdlog::debug(
        "rank {} step {}: forward/backward {:.1f} ms | thread reduction {:.1f} ms | "
        "allreduce {:.1f} ms | optimizer {:.1f} ms | barrier wait per worker {} ms",
        comm_.rank(), completed, m.timings.forward_backward * 1e3, m.timings.thread_reduction * 1e3,
        m.timings.allreduce * 1e3, m.timings.optimizer * 1e3, barrier_wait);
    nlohmann::json record = {{"type", "train"},
                             {"step", completed},
                             {"loss", m.loss},
                             {"lr", lr},
                             {"grad_norm", m.grad_norm},
                             {"ms", seconds * 1e3},
                             {"tokens_per_s", tok_s},
                             {"mfu", mfu},
                             {"skipped", m.skipped},
                             {"spike", m.spike},
                             {"loss_z", m.loss_z ? nlohmann::json(*m.loss_z) : nlohmann::json()},
                             {"norm_z", m.norm_z ? nlohmann::json(*m.norm_z) : nlohmann::json()}};
    if (corpus_.train_store.masked()) record["trained_tokens"] = m.trained_targets;
    metrics_.write(record);
}

void TrainingLoop::check_replicas(std::int64_t completed) const {
    const Model& model = replica_.model;
    // A bf16-only base's fp32 layer matrices are released: its twin is what the products read.
    std::uint64_t sum =
        model.layer_matrices_bf16_only
            ? checksum64(std::span(reinterpret_cast<const std::uint8_t*>(model.params_bf16.data()),
                                   model.params_bf16.size() * sizeof(Bf16)))
            : checksum64(std::span(reinterpret_cast<const std::uint8_t*>(model.params.data()),
                                   model.params.size() * 4));
    if (const auto& adapter = replica_.model.lora) {  // LoRA: what trains is the adapter
        sum ^= checksum64(std::span(reinterpret_cast<const std::uint8_t*>(adapter->params.data()),
                                    adapter->params.size() * 4)) *
               0x9E3779B97F4A7C15ULL;
    }
    const auto all = comm_.allgather(sum);
    for (std::size_t r = 0; r < all.size(); ++r) {
        if (all[r] != all[0]) {
            comm_.abort(
                fmt::format("step {}: parameters of rank {} differ from rank 0 "
                            "(replicas diverged; checksums {:016x} vs {:016x})",
                            completed, r, all[r], all[0]));
        }
    }
    spdlog::debug("step {}: replicas identical (checksum {:016x})", completed, sum);
}

namespace {
// Why --optimizer auto chose what it chose, by the code rank 0 sends (a run from scratch: by
// Muon's cost, below).
constexpr std::array<std::string_view, 4> kAutoReasons = {"", "the resumed state's optimizer",
                                                          "LoRA trains its adapters with AdamW",
                                                          "fine-tuning --init-from weights"};

// Muon pays where its Newton-Schulz iterations cost little beside forward and backward: it needs
// 0.41-0.60x AdamW's steps to the same loss (docs/performance.md), so at a cost ratio r a step
// it takes (1 + r) x 0.6 of the time or less. Measured: r = 0.13 (the default run) and 0.28 (d6
// BPE, T=256) gave 1.9x less time, r = 0.7 (nanoGPT's shakespeare_char) 1.02x, r = 8.5 (124M at
// 256 tokens a step) 7x the time a step. Muon from scratch up to r = 0.5.
constexpr double kMuonCostRatioThatPays = 0.5;

// Newton-Schulz's flops a step against forward and backward's (6 per parameter per token).
double muon_cost_ratio(const TrainOptions& o, const Communicator& comm, const ModelConfig& config) {
    const ParameterLayout layout(config);
    const std::int64_t tokens = o.batch.total_batch_tokens > 0
                                    ? o.batch.total_batch_tokens
                                    : static_cast<std::int64_t>(o.batch.batch_size) *
                                          o.batch.seq_len * comm.size() *
                                          std::max(1, o.batch.grad_accum);
    return muon_update_flops(layout) /
           (6.0 * static_cast<double>(layout.total()) * static_cast<double>(tokens));
}

// The options with --optimizer auto settled: the same optimizer on every rank (collective).
TrainOptions settle_optimizer(const TrainOptions& o, const Communicator& comm,
                              const StartPoint& start, const ModelConfig& config) {
    TrainOptions settled = o;
    if (!o.optimizer.automatic) return settled;
    std::array<std::int32_t, 2> choice{};  // kind, reason
    if (comm.is_root()) {
        const auto pick = [&](OptimizerKind kind, int reason) {
            choice = {static_cast<std::int32_t>(kind), reason};
        };
        if (start.state_optimizer) {
            pick(*start.state_optimizer, 1);
        } else if (o.lora.enabled()) {
            pick(OptimizerKind::AdamW, 2);
        } else if (!o.model.init_from.empty()) {
            pick(OptimizerKind::AdamW, 3);
        } else {
            pick(OptimizerKind::Muon, 0);
        }
    }
    comm.broadcast(std::span<std::int32_t>(choice));
    settled.optimizer.kind = static_cast<OptimizerKind>(choice[0]);
    settled.optimizer.chosen_because = kAutoReasons[static_cast<std::size_t>(choice[1])];
    if (choice[1] == 0) {
        const double ratio = muon_cost_ratio(o, comm, config);
        const bool pays = ratio <= kMuonCostRatioThatPays;
        settled.optimizer.kind = pays ? OptimizerKind::Muon : OptimizerKind::AdamW;
        settled.optimizer.chosen_because =
            pays ? fmt::format("a run from scratch, Newton-Schulz {:.0f}% of forward and backward",
                               ratio * 100.0)
                 : fmt::format(
                       "Muon's Newton-Schulz would cost {:.1f}x forward and backward at this "
                       "batch; it pays up to {}x",
                       ratio, kMuonCostRatioThatPays);
    }
    if (comm.is_root()) require_muon_flags_apply(settled);
    return settled;
}
}  // namespace

int run_training(const TrainOptions& o, const Communicator& comm) {
    const auto program_start = Clock::now();
    install_signal_handlers();
    if (!o.config_file.empty()) spdlog::info("config file {} applied", o.config_file);
    for (const std::string& warning : unused_flag_warnings(o, comm.size()))
        spdlog::warn("{}", warning);

    StartPoint start;
    TokenizerChoice tokenizer_choice;
    // A mistyped --hellaswag is found before the corpus is read and tokenized, not after.
    if (comm.is_root() && !o.eval.hellaswag.empty() &&
        !std::filesystem::is_regular_file(o.eval.hellaswag)) {
        throw InputError("--hellaswag " + o.eval.hellaswag + ": no such file");
    }
    // A mistyped --lora-from too (the directory is read in full once the model's shape is known).
    if (comm.is_root() && !o.lora.from.empty() &&
        !std::filesystem::is_regular_file(std::filesystem::path(o.lora.from) /
                                          "adapter_config.json")) {
        throw InputError("--lora-from " + o.lora.from +
                         ": no adapter_config.json there (expected a PEFT adapter directory)");
    }
    // Checkpoints must be writable: found before the corpus is read, not at the first one.
    if (comm.is_root() && o.compute.benchmark == 0 && !o.eval.eval_only) {
        check_out_dir_writable(o.checkpoints.out_dir);
    }
    if (comm.is_root() && !o.metrics_file.empty()) (void)MetricsFile(o.metrics_file);
    if (comm.is_root()) {
        choose_start(o, start, tokenizer_choice);
        check_flags_against_start(o, start);
    }
    Corpus corpus;
    prepare_corpus(o, comm, tokenizer_choice, corpus);
    const ModelConfig config = agree_on_model(o, comm, start, *corpus.tokenizer);
    // --optimizer auto settled once the model's shape is known (rank 0 alone knows a resumed
    // state's), the same on every rank; the rest of the run reads `settled`.
    const TrainOptions settled = settle_optimizer(o, comm, start, config);
    if (corpus.train_store.max_token() >= config.vocab_size) {
        throw InputError("token id " + std::to_string(corpus.train_store.max_token()) +
                         " is out of range for the model's vocabulary of " +
                         std::to_string(config.vocab_size));
    }

    const auto build_start = Clock::now();
    ExchangePlan exchange = plan_exchange(settled, comm);
    const std::unique_ptr<Replica> replica = build_replica(settled, comm, config, start, exchange);
    RunPlan plan = plan_run(settled, comm, start, *replica);
    if (plan.resumed && plan.first_step >= settled.optimizer.max_steps &&
        settled.compute.benchmark == 0 && !settled.eval.eval_only) {
        spdlog::warn(
            "nothing to do: the checkpoint is at step {} and --max-steps is {} (raise "
            "--max-steps to train further)",
            plan.first_step, settled.optimizer.max_steps);
        return 0;
    }
    if (comm.is_root()) warn_about_schedule(settled, plan);
    const double startup_seconds = seconds_since(build_start);

    TrainingLoop loop(settled, comm, corpus, *replica, plan, exchange, startup_seconds);
    loop.log_banner();
    const int code = loop.run();
    // Every rank's own peak, so that a job of many ranks on one node can be added up.
    spdlog::debug("rank {} done after {:.1f} s | peak RSS {}", comm.rank(),
                  seconds_since(program_start), human_bytes(peak_rss_bytes()));
    return code;
}

}  // namespace gpt2
