// The training run's step loop and what it does between steps, declared once so that its parts
// live in files by topic: run.cpp (the loop and the step), run_log.cpp (what it prints),
// evaluation.cpp (validation, HellaSwag, samples), checkpoint_save.cpp (checkpoints).
#pragma once

#include <spdlog/spdlog.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "data/multiple_choice.hpp"
#include "data/windows.hpp"
#include "optim/schedule.hpp"
#include "parallel/comm.hpp"
#include "train/checkpoint_clock.hpp"
#include "train/corpus.hpp"
#include "train/options.hpp"
#include "train/replica.hpp"
#include "train/run_plan.hpp"
#include "train/run_report.hpp"
#include "train/step.hpp"

namespace gpt2 {

// --hellaswag: rank 0 reads the file, every rank gets its bytes (only rank 0 needs the file).
// Collective; empty without --hellaswag.
[[nodiscard]] std::vector<MultipleChoiceExample> load_hellaswag(const TrainOptions& o,
                                                                const Communicator& comm,
                                                                int vocab_size);

// The step loop and what it does between steps (validate, sample, checkpoint, compare replicas),
// over state built once: the replica, the data, the batch buffers and the metrics file.
class TrainingLoop {
  public:
    TrainingLoop(const TrainOptions& o, const Communicator& comm, const Corpus& corpus,
                 Replica& replica, RunPlan& plan, const ExchangePlan& exchange,
                 double startup_seconds);
    void log_banner() const;
    [[nodiscard]] int run();

  private:
    // The loop (run.cpp).
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
    void check_replicas(std::int64_t completed) const;

    // What the run prints at the start and after a benchmark (run_log.cpp).
    void log_memory(spdlog::level::level_enum level) const;
    void log_precision() const;
    void log_validation_set() const;
    void report_benchmark();

    // Between steps (evaluation.cpp).
    void validate(std::int64_t completed);
    void evaluate_hellaswag(std::int64_t completed);
    void sample(std::int64_t completed);

    // Checkpoints (checkpoint_save.cpp).
    void save(std::int64_t completed);

    // What the run is given.
    const TrainOptions& o_;
    const Communicator& comm_;
    const Corpus& corpus_;
    Replica& replica_;
    RunPlan& plan_;

    // The step's shape and rules.
    const int B_, T_;
    const bool benchmark_;
    const std::int64_t last_step_;
    const std::int64_t tokens_per_step_;
    const ExchangePlan exchange_;
    const ScheduleConfig schedule_;
    const int log_every_;  // --log-every, or its choice for this run's steps

    // Throughput: the figures behind MFU and the benchmark's summary.
    const double flops_per_step_;
    const MfuYardstick yardstick_;
    const double peak_gflops_;
    const double startup_seconds_;
    std::vector<double> step_ms_;

    // What the run records: its configuration (stored in checkpoints) and the metrics file.
    const std::string run_config_;
    MetricsFile metrics_;

    // The data: the step's batch buffers and windows, the validation set (the first val_windows_
    // windows of the validation data; 0: too short for one window, no validation) and HellaSwag's
    // examples (--hellaswag, on every rank).
    std::vector<std::int32_t> inputs_, targets_;
    WindowSampler train_sampler_;
    const std::uint64_t val_windows_;
    std::vector<MultipleChoiceExample> hellaswag_;
    // Each token's length in bytes of text (0: end-of-text), for the bits per byte.
    const std::vector<std::int32_t> token_bytes_;
    // What --eval-only evaluates, for its lines: "--init-from X", a checkpoint, fresh weights.
    const std::string eval_source_;
    // "step N/M", or in --eval-only "eval of ...", the start of the evaluation lines.
    [[nodiscard]] std::string progress(std::int64_t completed) const;

    // Checkpoints: the last one written, and --checkpoint-minutes' clock.
    std::optional<std::filesystem::path> last_checkpoint_;
    CheckpointClock checkpoint_clock_;
};

}  // namespace gpt2
