#include "train/run.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/clock.hpp"
#include "core/error.hpp"
#include "core/utf8.hpp"
#include "data/windows.hpp"
#include "formats/checkpoint.hpp"
#include "formats/peft.hpp"
#include "formats/resume_state.hpp"
#include "model/generate.hpp"
#include "model/lora.hpp"
#include "ops/gemm.hpp"
#include "parallel/validation_loss.hpp"
#include "tokenizer/tokenizer.hpp"
#include "train/checkpoint_clock.hpp"
#include "train/corpus.hpp"
#include "train/memory_plan.hpp"
#include "train/model_shape.hpp"
#include "train/multiple_choice_eval.hpp"
#include "train/replica.hpp"
#include "train/run_plan.hpp"
#include "train/run_report.hpp"
#include "train/start_point.hpp"
#include "train/step.hpp"
#include "train/stop_signal.hpp"
#include "train/text_format.hpp"

namespace gpt2 {

namespace {

// --hellaswag: rank 0 reads the file, every rank gets its bytes (only rank 0 needs the file).
std::vector<MultipleChoiceExample> load_hellaswag(const TrainOptions& o, const Communicator& comm,
                                                  int vocab_size) {
    if (o.eval.hellaswag.empty()) return {};
    std::vector<std::uint8_t> bytes;
    if (comm.is_root()) bytes = read_file_bytes(o.eval.hellaswag);
    comm.broadcast_vector(bytes);
    std::vector<MultipleChoiceExample> examples = parse_multiple_choice(bytes, o.eval.hellaswag);
    if (const std::int32_t top = max_token(examples); top >= vocab_size) {
        throw InputError("--hellaswag " + o.eval.hellaswag + ": token " + std::to_string(top) +
                         " is outside the model's vocabulary of " + std::to_string(vocab_size) +
                         " (the file was made with another tokenizer; llm.c's is for GPT-2's)");
    }
    if (comm.is_root()) {
        spdlog::info("hellaswag: {} examples from {}, {}", examples.size(), o.eval.hellaswag,
                     o.eval.eval_every > 0 ? fmt::format("every {} steps", o.eval.eval_every)
                                           : std::string("with each validation"));
    }
    return examples;
}

// The step loop and what it does between steps (validate, sample, checkpoint, compare replicas),
// over state built once: the replica, the data, the batch buffers and the metrics file.
class TrainingLoop {
  public:
    TrainingLoop(const TrainOptions& o, const Communicator& comm, const Corpus& corpus,
                 Replica& replica, RunPlan& plan, const ExchangePlan& exchange,
                 double startup_seconds);
    void log_banner() const;
    void log_memory() const;
    void log_precision() const;
    [[nodiscard]] int run();

  private:
    struct StepOutcome {
        bool stop = false;
        int signal = 0;
        bool checkpoint_due = false;  // --checkpoint-minutes
    };
    [[nodiscard]] StepOutcome step(std::int64_t step, int& bad_steps, double& ema_seconds);
    // The hidden --inject-* flags' fault for `step`, if any.
    [[nodiscard]] TestHooks test_hooks(std::int64_t step) const {
        return TestHooks{.fault = step == o_.test.inject_nan_step     ? InjectedFault::NanGradient
                                  : step == o_.test.inject_spike_step ? InjectedFault::GradientSpike
                                                                      : InjectedFault::None,
                         .inspect_gradient = {}};
    }
    void count_skipped(const StepMetrics& m, std::int64_t completed, int& bad_steps);
    void log_step(const StepMetrics& m, std::int64_t completed, float lr, double seconds,
                  double ema_seconds);
    void log_validation_set() const;
    void validate(std::int64_t completed);
    void evaluate_hellaswag(std::int64_t completed);
    void sample(std::int64_t completed);
    void save(std::int64_t completed);
    void check_replicas(std::int64_t completed) const;
    void report_benchmark();

    const TrainOptions& o_;
    const Communicator& comm_;
    const Corpus& corpus_;
    Replica& replica_;
    RunPlan& plan_;
    const int B_, T_;
    const bool benchmark_;
    const std::int64_t last_step_;
    const std::int64_t tokens_per_step_;
    const ExchangePlan exchange_;
    const double flops_per_step_;
    const MfuYardstick yardstick_;
    const double peak_gflops_;
    const ScheduleConfig schedule_;
    const std::string run_config_;
    const double startup_seconds_;
    std::vector<std::int32_t> inputs_, targets_;
    WindowSampler train_sampler_;
    // The validation set: the first val_windows_ windows of the validation data (0: too short for
    // one window, no validation).
    const std::uint64_t val_windows_;
    MetricsFile metrics_;
    std::vector<MultipleChoiceExample> hellaswag_;  // --hellaswag, on every rank
    std::optional<std::filesystem::path> last_checkpoint_;
    std::vector<double> step_ms_;
    CheckpointClock checkpoint_clock_;
};

constexpr int kBenchmarkWarmup = 2;

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
      flops_per_step_((replica.model.lora != nullptr
                           ? lora_training_flops_per_token(replica.model.config, o.batch.seq_len,
                                                           replica.model.lora->config)
                           : training_flops_per_token(replica.model.config, o.batch.seq_len)) *
                      static_cast<double>(tokens_per_step_)),
      yardstick_(mfu_yardstick(o, cores_in_use(comm, replica.workers.size()))),
      peak_gflops_(yardstick_.per_core * yardstick_.cores),
      schedule_{o.optimizer.schedule, o.optimizer.lr, o.optimizer.min_lr, o.optimizer.warmup_steps,
                plan.decay_steps},
      run_config_(config_json(o, replica.model.config, comm.size(), replica.workers.size())),
      startup_seconds_(startup_seconds),
      inputs_(static_cast<std::size_t>(plan.grad_accum) * B_ * T_),
      targets_(inputs_.size()),
      train_sampler_(corpus.train_store, T_, o.seed, !o.data.no_shuffle),
      val_windows_(std::min(static_cast<std::uint64_t>(o.eval.val_tokens / o.batch.seq_len),
                            corpus.val_store.num_windows(o.batch.seq_len))),
      metrics_(comm.is_root() ? o.metrics_file : ""),
      hellaswag_(load_hellaswag(o, comm, replica.model.config.vocab_size)),
      checkpoint_clock_(o.checkpoints.checkpoint_minutes, o.test.minutes_per_step) {
    if (comm.is_root() && !benchmark_) {
        std::error_code ec;
        std::filesystem::create_directories(o.checkpoints.out_dir, ec);
        if (ec || !std::filesystem::is_directory(o.checkpoints.out_dir)) {
            throw InputError("--out-dir " + o.checkpoints.out_dir + ": cannot create directory (" +
                             ec.message() + ")");
        }
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

// The memory line: activations and gradient windows per worker, the rank's gradient, weights
// and moments, and the start-up time.
void TrainingLoop::log_memory() const {
    const WorkerGroup& workers = replica_.workers;
    const int W = workers.size();
    const Model& model = replica_.model;
    if (model.lora != nullptr) {
        // LoRA: no model gradient and no windows; the adapter and its moments instead.
        spdlog::info(
            "memory: {} activations per worker | rank: {} frozen weights, {} adapter, {} adapter "
            "AdamW moments | startup {:.0f} ms",
            human_bytes(static_cast<double>(workers.context(0).activation_bytes())),
            human_bytes(
                static_cast<double>(model.params.size() * 4 + model.params_bf16.size() * 2)),
            human_bytes(static_cast<double>(model.lora->params.size() * 4)),
            human_bytes(static_cast<double>(replica_.optimizer.m.size() * 8)),
            startup_seconds_ * 1e3);
        return;
    }
    const bool shared = exchange_.shared();
    const int machine_ranks = exchange_.machines->machine.size();
    const int with_window = workers.contributing_workers() - 1;
    const std::string windows =
        with_window == 0
            ? std::string("no gradient windows")
            : fmt::format(
                  "gradient window {} on {} of {} workers",
                  human_bytes(static_cast<double>(workers.context(1).gradient_window.size() * 4)),
                  with_window, W);
    spdlog::info(
        "memory: {} activations per worker, {} | rank: {} gradient, {} weights{}, {} AdamW "
        "moments{} "
        "| startup {:.0f} ms",
        human_bytes(static_cast<double>(workers.context(0).activation_bytes())), windows,
        human_bytes(static_cast<double>(workers.gradient_bytes())),
        human_bytes(static_cast<double>(model.params.size() * 4 + model.params_bf16.size() * 2)),
        shared ? fmt::format(" (one copy for the {} ranks of this machine)", machine_ranks)
               : std::string(),
        human_bytes(static_cast<double>(replica_.optimizer.m.size() * 8)),
        replica_.update_slices.empty() ? std::string()
        : shared                       ? fmt::format(" (this rank's slice of {})", machine_ranks)
                 : fmt::format(" (ZeRO-1: this rank's slice of {})", comm_.size()),
        startup_seconds_ * 1e3);
}

// The precision line with the GEMM backend and the MFU yardstick.
void TrainingLoop::log_precision() const {
    if (replica_.model.precision == Precision::Bf16) {
        spdlog::info(
            "precision bf16: products on {}, fp32 weights, gradients and AdamW | MFU against "
            "the fp32 peak {:.0f} GFLOP/s ({})",
            bf16_backend_name(bf16_backend()), peak_gflops_, yardstick_.describe());
        if (bf16_backend() == Bf16Backend::Avx512Bf16) {
            // oneDNN 2.6's bf16 kernels without AMX measured slower than OpenBLAS's fp32
            // (docs/performance.md); other CPUs may differ.
            spdlog::warn(
                "bf16 without AMX can be slower than fp32: compare the two with build/bench_gemm "
                "or --benchmark before a long run");
        }
    } else {
        spdlog::info("precision fp32: GEMM kernels {} | MFU peak {:.0f} GFLOP/s ({})",
                     gemm_kernel_name(), peak_gflops_, yardstick_.describe());
    }
}

void TrainingLoop::log_banner() const {
    const ModelConfig& config = replica_.model.config;
    const WorkerGroup& workers = replica_.workers;
    const int W = workers.size();
    spdlog::info("model {} | {} parameters ({})", describe(config),
                 with_commas(static_cast<double>(replica_.model.layout.total())),
                 human_bytes(static_cast<double>(replica_.model.layout.total()) * 4));
    spdlog::info("ranks x workers {} x {} | batch {} x {} per rank, grad accum {} | {} tokens/step",
                 comm_.size(), W, B_, T_, plan_.grad_accum,
                 with_commas(static_cast<double>(tokens_per_step_)));
    if (const std::string lora = describe_lora(replica_.model); !lora.empty()) {
        spdlog::info("{}", lora);
    }
    if (o_.optimizer.dropout > 0.0f) {
        spdlog::info(
            "dropout {} on the embeddings, the attention probabilities and the attention "
            "and MLP outputs (training steps only)",
            o_.optimizer.dropout);
    }
    log_memory();
    for (const std::string& line : describe_memory(replica_.memory))
        spdlog::info("{}", line);
    if (B_ % W != 0) {
        const int fewer = W - B_ % W;
        spdlog::warn(
            "batch {} per rank does not divide over {} workers: {} of them take {} sequences, the "
            "others {}, and wait for the rest at every layer; a --batch-size that is a multiple of "
            "{} keeps them all busy",
            B_, W, fewer, B_ / W, B_ / W + 1, W);
    }
    if (comm_.size() == 1 && o_.parallel.zero == 1) {
        spdlog::warn("--zero 1 with one rank: there is nothing to slice, the optimizer is whole");
    }
    if (!exchange_.share_error.empty()) {
        spdlog::warn(
            "shared memory is off for this run ({}): each rank keeps its own weights and a "
            "slice of the optimizer instead (ZeRO-1)",
            exchange_.share_error);
    }
    if (const std::string line = describe_exchange(exchange_, replica_, o_, comm_); !line.empty()) {
        spdlog::info("{}", line);
    }
    spdlog::info("data: {} train windows, {} val windows of {} tokens",
                 with_commas(static_cast<double>(corpus_.train_store.num_windows(T_))),
                 with_commas(static_cast<double>(corpus_.val_store.num_windows(T_))), T_);
    log_validation_set();
    log_precision();
    for (int w = 0; w < W; ++w) {
        const Range sequences = split_range(static_cast<std::size_t>(B_), w, W);
        spdlog::debug("rank {} worker {}: {} sequences, context {}", comm_.rank(), w,
                      sequences.end - sequences.begin,
                      human_bytes(static_cast<double>(workers.context(w).total_bytes())));
    }
}

int TrainingLoop::run() {
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
            spdlog::info("stopped by signal at step {} ({}); resume with --resume auto", completed,
                         signal_name(outcome.signal));
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
        Dropout{o_.optimizer.dropout, o_.seed, static_cast<std::uint64_t>(step)},
        // With a loss mask, every rank counts the step's trained targets alike
        // (the windows of every slot are known to all).
        corpus_.train_store.masked() ? std::optional(train_sampler_.step_trained_targets(
                                           static_cast<std::uint64_t>(step),
                                           static_cast<std::uint64_t>(plan_.global_sequences)))
                                     : std::nullopt};
    // The step's rules: the schedule's learning rate, clipping, and the spike policy.
    const StepRules rules{
        AdamWHyper{learning_rate(schedule_, step), o_.optimizer.beta1, o_.optimizer.beta2,
                   o_.optimizer.eps, o_.optimizer.weight_decay},
        o_.optimizer.grad_clip, &plan_.spikes};
    // Forward/backward over the workers, the exchange, the norm, the verdict, clipping and the
    // update, in that order (train/step.cpp).
    const StepMetrics m = train_step(
        TrainState{replica_.model, replica_.optimizer, replica_.workers, *replica_.exchange}, batch,
        rules, test_hooks(step));
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
    spdlog::info(
        "step {}/{} | loss {:.4f}{}{} | lr {:.1e} | norm {:.2f}{} | {:.0f} ms | {} tok/s | MFU "
        "{:.0f}% | ETA {}",
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

// What validation covers, once: the tokens, or why there is none.
void TrainingLoop::log_validation_set() const {
    if (!comm_.is_root()) return;
    const std::string split = o_.data.train_data.empty()
                                  ? fmt::format("--data {}'s validation split (--val-fraction {})",
                                                o_.data.data, o_.data.val_fraction)
                                  : "--val-data " + o_.data.val_data;
    if (val_windows_ == 0) {
        spdlog::warn(
            "no validation: {} holds {} tokens, fewer than one window of --seq-len {} + 1; the "
            "validation loss is left out",
            split, with_commas(static_cast<double>(corpus_.val_store.num_tokens())), T_);
        return;
    }
    const std::uint64_t tokens = val_windows_ * static_cast<std::uint64_t>(T_);
    spdlog::info("validation: the first {} tokens of {}, {} windows of {}{}",
                 with_commas(static_cast<double>(tokens)), split,
                 with_commas(static_cast<double>(val_windows_)), T_,
                 tokens < static_cast<std::uint64_t>(o_.eval.val_tokens)
                     ? fmt::format(" (--val-tokens {}: {})",
                                   with_commas(static_cast<double>(o_.eval.val_tokens)),
                                   val_windows_ < corpus_.val_store.num_windows(T_)
                                       ? "rounded down to whole windows"
                                       : "more than the validation data holds")
                     : std::string());
}

void TrainingLoop::validate(std::int64_t completed) {
    if (val_windows_ == 0) return;  // said once at the start
    const auto t0 = Clock::now();
    const TokenStore& store = corpus_.val_store;
    const int T = T_;
    const ValidationLoss val =
        validation_loss(replica_.model, replica_.workers, comm_, val_windows_,
                        [&store, T](std::uint64_t window, std::span<std::int32_t> inputs,
                                    std::span<std::int32_t> targets) {
                            store.copy_window(window, T, inputs, targets);
                        });
    if (val.tokens == 0) {
        spdlog::warn(
            "step {}/{} | val loss: none, the loss mask trains no target in the {} "
            "validation windows",
            completed, o_.optimizer.max_steps, val_windows_);
        return;
    }
    spdlog::info("step {}/{} | val loss {:.4f} ({} {}tokens) | {:.0f} ms", completed,
                 o_.optimizer.max_steps, val.loss, with_commas(static_cast<double>(val.tokens)),
                 store.masked() ? "trained " : "", seconds_since(t0) * 1e3);
    metrics_.write(
        {{"type", "val"}, {"step", completed}, {"val_loss", val.loss}, {"val_tokens", val.tokens}});
}

void TrainingLoop::evaluate_hellaswag(std::int64_t completed) {
    if (hellaswag_.empty()) return;
    const auto t0 = Clock::now();
    const MultipleChoiceScore score =
        evaluate_multiple_choice(replica_.model, replica_.workers, comm_, hellaswag_);
    spdlog::info("step {}/{} | hellaswag acc_norm {:.4f} ({}/{}{}) | {:.0f} ms", completed,
                 o_.optimizer.max_steps, score.accuracy(), score.correct, score.scored,
                 score.too_long > 0
                     ? fmt::format(", {} longer than --seq-len {} left out", score.too_long, T_)
                     : std::string(),
                 seconds_since(t0) * 1e3);
    metrics_.write({{"type", "eval"},
                    {"step", completed},
                    {"hellaswag_acc_norm", score.accuracy()},
                    {"hellaswag_correct", score.correct},
                    {"hellaswag_scored", score.scored}});
}

void TrainingLoop::sample(std::int64_t completed) {
    if (!comm_.is_root() || o_.eval.sample_tokens == 0) return;
    std::vector<std::int32_t> tokens;
    if (const auto eot = corpus_.tokenizer->eot_id()) {
        tokens.push_back(*eot);
    } else {
        // No end-of-text token to start from: the first token of the validation data (of the
        // training data when validation has none).
        const TokenStore& store =
            corpus_.val_store.num_windows(1) > 0 ? corpus_.val_store : corpus_.train_store;
        std::array<std::int32_t, 1> input{}, target{};
        store.copy_window(0, 1, input, target);
        tokens.push_back(input[0]);
    }
    const std::size_t prompt = tokens.size();
    generate_recompute(replica_.model, tokens, o_.eval.sample_tokens, SamplingParams{},
                       plan_.sample_rng);
    const std::string text =
        corpus_.tokenizer->decode(std::span<const std::int32_t>(tokens).subspan(prompt));
    // Token bytes may split or break characters; the log only ever holds valid UTF-8.
    spdlog::info("sample at step {}:\n{}\n---", completed, sanitize_utf8(text));
}

void TrainingLoop::save(std::int64_t completed) {
    std::unique_ptr<AdamWState> gathered;
    const AdamWState& optimizer = full_optimizer(replica_, comm_, gathered);
    if (!comm_.is_root()) return;
    const auto t0 = Clock::now();
    const std::filesystem::path out_dir = o_.checkpoints.out_dir;
    const CheckpointExtras extras{corpus_.tokenizer->serialize(), run_config_};
    std::filesystem::path path;
    if (const std::shared_ptr<LoraAdapter>& adapter = replica_.model.lora) {
        // LoRA: the adapter as PEFT saves it, and beside it the merged weights, which every
        // reader of a checkpoint takes as they are (no adapter needed).
        write_peft_adapter(
            adapter_path(out_dir, completed), *adapter,
            o_.model.init_from.empty() ? std::string("gpt2-mpi random base") : o_.model.init_from);
        Model merged(replica_.model.config);
        const auto base = replica_.model.params.span();
        std::copy(base.begin(), base.end(), merged.params.data());
        merge_lora(merged, *adapter);
        path = save_checkpoint(model_path(out_dir, completed), merged, extras);
    } else {
        path = save_checkpoint(model_path(out_dir, completed), replica_.model, extras);
    }
    ResumeState state;
    state.step = completed;
    state.seed = o_.seed;
    state.sequences_per_step = plan_.global_sequences;
    state.seq_len = T_;
    state.sample_rng = plan_.sample_rng.state();
    state.run_id = plan_.run_id;
    state.lr_decay_steps = plan_.decay_steps;
    state.loss_window = plan_.spikes.loss;
    state.norm_window = plan_.spikes.norm;
    save_resume_state(state_path(out_dir, completed), state, replica_.model.config, optimizer);
    last_checkpoint_ = path;
    checkpoint_clock_.saved();
    prune_checkpoints(out_dir, o_.checkpoints.keep_checkpoints, plan_.run_id);
    metrics_.sync();
    spdlog::info("checkpoint {}{} ({:.2f} s)", path.string(),
                 replica_.model.lora != nullptr
                     ? fmt::format(" (merged weights) and LoRA adapter {}",
                                   adapter_path(out_dir, completed).string())
                     : std::string(),
                 seconds_since(t0));
}

void TrainingLoop::check_replicas(std::int64_t completed) const {
    std::uint64_t sum =
        checksum64(std::span(reinterpret_cast<const std::uint8_t*>(replica_.model.params.data()),
                             replica_.model.params.size() * 4));
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

void TrainingLoop::report_benchmark() {
    std::sort(step_ms_.begin(), step_ms_.end());
    const double median_ms = step_ms_[step_ms_.size() / 2];
    const double tok_s = static_cast<double>(tokens_per_step_) / (median_ms / 1e3);
    const double gflops = flops_per_step_ / (median_ms / 1e3) / 1e9;
    fmt::print(
        "benchmark: median {:.1f} ms/step | {:.1f} tok/s | {:.1f} GFLOP/s | MFU {:.1f}% "
        "| peak RSS {} | startup {:.0f} ms | {} steps, ranks {} x workers {}\n",
        median_ms, tok_s, gflops, 100.0 * gflops / peak_gflops_, human_bytes(peak_rss_bytes()),
        startup_seconds_ * 1e3, step_ms_.size(), comm_.size(), replica_.workers.size());
    std::fflush(stdout);
}

}  // namespace

int run_training(const TrainOptions& o, const Communicator& comm) {
    const auto program_start = Clock::now();
    install_signal_handlers();
    if (!o.config_file.empty()) spdlog::info("config file {} applied", o.config_file);

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
    if (comm.is_root()) {
        choose_start(o, start, tokenizer_choice);
        check_flags_against_start(o, start);
    }
    Corpus corpus;
    prepare_corpus(o, comm, tokenizer_choice, corpus);
    const ModelConfig config = agree_on_model(o, comm, start, *corpus.tokenizer);
    if (corpus.train_store.max_token() >= config.vocab_size) {
        throw InputError("token id " + std::to_string(corpus.train_store.max_token()) +
                         " is out of range for the model's vocabulary of " +
                         std::to_string(config.vocab_size));
    }

    const auto build_start = Clock::now();
    ExchangePlan exchange = plan_exchange(o, comm);
    const std::unique_ptr<Replica> replica = build_replica(o, comm, config, start, exchange);
    RunPlan plan = plan_run(o, comm, start, *replica);
    if (plan.resumed && plan.first_step >= o.optimizer.max_steps && o.compute.benchmark == 0) {
        spdlog::warn(
            "nothing to do: the checkpoint is at step {} and --max-steps is {} (raise "
            "--max-steps to train further)",
            plan.first_step, o.optimizer.max_steps);
        return 0;
    }
    if (comm.is_root()) warn_about_schedule(o, plan);
    const double startup_seconds = seconds_since(build_start);

    TrainingLoop loop(o, comm, corpus, *replica, plan, exchange, startup_seconds);
    loop.log_banner();
    const int code = loop.run();
    // Every rank's own peak, so that a job of many ranks on one node can be added up.
    spdlog::debug("rank {} done after {:.1f} s | peak RSS {}", comm.rank(),
                  seconds_since(program_start), human_bytes(peak_rss_bytes()));
    return code;
}

}  // namespace gpt2
