// Faults a long run meets: the process killed (SIGKILL) at random moments while it writes
// checkpoints, a disk that fills up during a write, and one rank dying mid-run.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>

#include "core/file_io.hpp"
#include "formats/checkpoint.hpp"
#include "formats/resume_state.hpp"
#include "optim/adamw.hpp"
#include "process_support.hpp"
#include "train/log_lines.hpp"
#include "train_run_fixture.hpp"

namespace gpt2 {
namespace {

using test::TrainRun;

using test::run_command;
using test::ScratchDir;

std::string train(const ScratchDir& dir, const std::string& extra) {
    // `extra` replaces the flags it gives too (a flag given twice is refused).
    return test::build_path("train_gpt2") +
           test::without_given(
               " --n-layer 2 --n-head 4 --n-embd 128 --seq-len 32 --batch-size 4 --threads 2"
               " --val-every 0 --sample-every 0 --data " +
                   (dir / "corpus.txt") + " --out-dir " + (dir / "out"),
               extra) +
           " " + extra;
}

// The newest checkpoint listed must load and verify completely (model checksum and state).
void expect_newest_checkpoint_verifies(const std::filesystem::path& out, int round) {
    const std::vector<std::int64_t> steps = list_checkpoints(out);
    if (steps.empty()) return;  // killed before the first checkpoint completed
    const LoadedModel loaded = load_checkpoint(model_path(out, steps.front()));
    ASSERT_TRUE(loaded.extras.has_value()) << "round " << round;
    OptimizerState optimizer(loaded.model.layout.total());
    EXPECT_NO_THROW(
        (void)load_resume_state(state_path(out, steps.front()), loaded.model.config, optimizer))
        << "round " << round << ", step " << steps.front();
}

TEST(Faults, KilledAtRandomMomentsWhileCheckpointingTheNewestCheckpointAlwaysVerifies) {
    const ScratchDir dir("gpt2-kill9");
    test::write_corpus(dir.path() / "corpus.txt", 40000);
    std::mt19937 rng(2024);
    std::uniform_int_distribution<int> delay_ms(150, 1200);
    // A checkpoint after every step: most of the run is spent writing them.
    const std::string command =
        train(dir, "--max-steps 100000 --checkpoint-every 1 --keep-checkpoints 2 --resume auto");
    const std::string log = dir / "log.txt";
    for (int round = 0; round < 20; ++round) {
        const double delay = delay_ms(rng) / 1000.0;
        // The random delay counts from this process's first checkpoint, so that the kill lands
        // among checkpoint writes however slow the machine (or sanitizer build) is to start.
        const auto result =
            run_command("bash -c '" + command + " > " + log + " 2>&1 & pid=$!; " +
                        test::wait_for_log(log, "checkpoint ") + "sleep " + std::to_string(delay) +
                        "; kill -KILL $pid; wait $pid; echo exit=$?'");
        EXPECT_EQ(test::echoed_exit_code(result.output), 137) << result.output;
        expect_newest_checkpoint_verifies(dir.path() / "out", round);
    }
    const std::vector<std::int64_t> steps = list_checkpoints(dir.path() / "out");
    ASSERT_FALSE(steps.empty());
    // And a run resumes from what the kills left behind.
    const auto resumed =
        run_command(command + " --stop-at-step " + std::to_string(steps.front() + 1));
    EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find(std::string(log_lines::kResumingFrom) + " " +
                                  state_path(dir.path() / "out", steps.front()).string()),
              std::string::npos)
        << resumed.output;
}

TEST(Faults, AFullDiskDuringACheckpointKeepsThePreviousOneAndSaysWhy) {
    const ScratchDir dir("gpt2-fulldisk");
    test::write_corpus(dir.path() / "corpus.txt", 40000);
    // One checkpoint (1.7 MB model + 3.3 MB state) fits in 6 MB; the next one does not.
    const test::TinyFileSystem disk(dir.path() / "out", "6m");
    if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
    const auto out = dir.path() / "out";
    const auto result = run_command(train(dir, "--max-steps 8 --checkpoint-every 2"));
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("cannot write " + model_path(out, 4).string() +
                                 ": No space left on device"),
              std::string::npos)
        << result.output;
    ASSERT_EQ(list_checkpoints(out), std::vector<std::int64_t>{2});
    const LoadedModel kept = load_checkpoint(model_path(out, 2));
    OptimizerState optimizer(kept.model.layout.total());
    EXPECT_NO_THROW((void)load_resume_state(state_path(out, 2), kept.model.config, optimizer));
    // The failed write left nothing half-written behind.
    for (const auto& entry : std::filesystem::directory_iterator(out)) {
        EXPECT_EQ(entry.path().string().find(".tmp."), std::string::npos) << entry.path();
    }
}

TEST(Faults, OneRankKilledMidRunEndsTheWholeJob) {
    const ScratchDir dir("gpt2-rankdeath");
    test::write_corpus(dir.path() / "corpus.txt", 40000);
    const std::string log = dir / "log.txt";
    // The victim is found by its environment (this job's marker and rank 1), not its command
    // line, which the launching shell shares.
    const std::string marker = "GPT2_FAULT_MARKER=" + std::to_string(::getpid());
    const std::string command =
        "timeout 120 " + test::mpiexec(2, "-x " + marker) +
        train(dir, "--threads 1 --max-steps 100000 --checkpoint-every 0 --log-every 1");
    const auto result =
        run_command("bash -c '(" + command + ") > " + log + " 2>&1 & job=$!; " +
                    test::wait_for_log(log, "step 3/") +
                    test::signal_rank(marker, 1, "KILL", "killed") + "wait $job; echo exit=$?'");
    EXPECT_NE(result.output.find("killed"), std::string::npos) << result.output;
    // A job that loses a rank must fail, and not by hanging until `timeout` ends it.
    const int code = test::echoed_exit_code(result.output);
    EXPECT_GT(code, 0) << result.output;
    EXPECT_NE(code, 124) << "the job hung:\n" << result.output;
}

// ---- clean stops under mpiexec ----

TEST_F(TrainRun, Sigusr1ToMpiexecStopsTheJobCleanlyWithExitZero) {
    const std::string log = path("log.txt");
    const auto result = run_command(
        "bash -c '" +
        command("--max-steps 1000000 --log-every 1 --checkpoint-every 0 --out-dir " + path("out"),
                2) +
        " > " + log + " 2>&1 & job=$!; " + test::wait_for_log(log, "step 3/") +
        "kill -USR1 $job; wait $job; echo exit=$?'");
    const std::string text = read_text_file(log);
    EXPECT_EQ(test::echoed_exit_code(result.output), 0) << result.output << text;
    EXPECT_NE(text.find(log_lines::kStoppedBySignal), std::string::npos) << text;
    EXPECT_NE(text.find("(SIGUSR1)"), std::string::npos) << text;
    const auto steps = list_checkpoints(path("out"));
    ASSERT_EQ(steps.size(), 1u) << text;
    const auto resumed = train(
        "--resume auto --max-steps " + std::to_string(steps[0] + 1) + " --out-dir " + path("out"),
        2);
    EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
}

TEST_F(TrainRun, SigtermToOneRankStopsEveryRankWithExitZero) {
    const std::string log = path("log.txt");
    const std::string marker = "GPT2_TRUST_MARKER=" + std::to_string(::getpid());
    const std::string job =
        test::mpiexec(2, "-x GPT2_TRUST_MARKER") +
        command("--max-steps 1000000 --log-every 1 --checkpoint-every 0 --out-dir " + path("out"));
    const auto result =
        run_command("bash -c '" + marker + " " + job + " > " + log + " 2>&1 & job=$!; " +
                    test::wait_for_log(log, "step 3/") +
                    test::signal_rank(marker, 1, "TERM", "signalled") + "wait $job; echo exit=$?'");
    EXPECT_NE(result.output.find("signalled"), std::string::npos) << result.output;
    EXPECT_EQ(test::echoed_exit_code(result.output), 0) << result.output;
    EXPECT_EQ(list_checkpoints(path("out")).size(), 1u);
}

// Ctrl-C on a job started as README's first mpirun example does (scripts/mpirun.sh): the terminal
// sends SIGINT to the launcher's process group (a job of its own, `set -m`); every rank stops at
// a step boundary, the checkpoint is written, the job exits 0, and --resume auto continues it to
// the same weights and losses as a run never interrupted. The interrupted job has no end of its
// own (a fast machine did its 200 steps before the signal arrived: 0.1 s on a Sapphire Rapids
// core), and the straight run is as long as the resumed one, ten steps past where the signal
// stopped it; --lr-decay-steps keeps the schedule the same in all three.
TEST_F(TrainRun, CtrlCOnTheLauncherSavesAndTheResumedRunIsBitwiseTheStraightOne) {
    const std::string schedule = " --lr-decay-steps 1000 --checkpoint-every 0 --metrics-file ";
    const std::string launcher =
        std::string(GPT2_SOURCE_DIR) + "/scripts/mpirun.sh --oversubscribe --allow-run-as-root ";
    const std::string job = launcher + "-n 2 " + test::build_path("train_gpt2") +
                            test::train_run_flags() + " --data " + path("corpus.txt") +
                            " --max-steps 1000000" + schedule + path("resumed.jsonl") +
                            " --out-dir " + path("resumed");
    const std::string log = path("log.txt");
    const auto result = run_command("bash -c 'set -m; " + job + " > " + log + " 2>&1 & job=$!; " +
                                    test::wait_for_log(path("resumed.jsonl"), "step.:3,") +
                                    "kill -INT -$job; wait $job; echo exit=$?'");
    const std::string text = read_text_file(log);
    EXPECT_EQ(test::echoed_exit_code(result.output), 0) << result.output << text;
    EXPECT_NE(text.find("[mpirun.sh] stopping"), std::string::npos) << text;
    EXPECT_NE(text.find(log_lines::kStoppedBySignal), std::string::npos) << text;
    const auto steps = list_checkpoints(path("resumed"));
    ASSERT_EQ(steps.size(), 1u) << text;
    ASSERT_GE(steps[0], 3) << text;
    const std::string max_steps = " --max-steps " + std::to_string(steps[0] + 10);
    ASSERT_EQ(
        train(max_steps + schedule + path("straight.jsonl") + " --out-dir " + path("straight"), 2)
            .exit_code,
        0);
    const auto resumed = train(max_steps + schedule + path("resumed.jsonl") +
                                   " --resume auto --out-dir " + path("resumed"),
                               2);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    const std::vector<double> a = test::metrics_values(path("straight.jsonl"), "train", "loss");
    const std::vector<double> b = test::metrics_values(path("resumed.jsonl"), "train", "loss");
    ASSERT_EQ(a.size(), static_cast<std::size_t>(steps[0] + 10));
    EXPECT_EQ(a, b);  // bitwise: the metrics file prints doubles exactly
    const LoadedModel x = load_checkpoint(model_path(path("straight"), steps[0] + 10));
    const LoadedModel y = load_checkpoint(model_path(path("resumed"), steps[0] + 10));
    EXPECT_EQ(std::memcmp(x.model.params.data(), y.model.params.data(),
                          x.model.params.size() * sizeof(float)),
              0);
}

// Ctrl-C on scripts/mpirun.sh while the job is still starting (the signal reaches the ranks before
// their first step, some perhaps before they catch it): exit 0, never "exited on signal 10", and
// the only checkpoint, if any, one that verifies.
TEST_F(TrainRun, CtrlCOnTheLauncherDuringStartUpExitsZero) {
    const std::string launcher =
        std::string(GPT2_SOURCE_DIR) + "/scripts/mpirun.sh --oversubscribe --allow-run-as-root ";
    for (const char* delay : {"0.05", "0.1", "0.2", "0.4"}) {
        const std::string out = path(std::string("out-") + delay);
        const std::string job = launcher + "-n 2 " + test::build_path("train_gpt2") +
                                test::train_run_flags() + " --data " + path("corpus.txt") +
                                " --max-steps 1000000 --out-dir " + out;
        const std::string log = path("log.txt");
        const auto result =
            run_command("bash -c 'set -m; " + job + " > " + log + " 2>&1 & job=$!; sleep " + delay +
                        "; kill -INT -$job; wait $job; echo exit=$?'");
        const std::string text = read_text_file(log);
        EXPECT_EQ(test::echoed_exit_code(result.output), 0) << delay << "\n" << text;
        EXPECT_EQ(text.find("exited on signal"), std::string::npos) << text;
        for (const std::int64_t step : list_checkpoints(out))
            EXPECT_NO_THROW((void)load_checkpoint(model_path(out, step)));
    }
}

// A mistake under scripts/mpirun.sh is the program's own error line and exit code, without Open
// MPI's banners that repeat that a rank exited non-zero or called MPI_Abort; what only Open MPI
// can say (a program it cannot start) still passes through.
TEST_F(TrainRun, TheLauncherLeavesOnlyTheProgramsErrorLine) {
    const std::string launcher =
        std::string(GPT2_SOURCE_DIR) + "/scripts/mpirun.sh --allow-run-as-root --oversubscribe ";
    const auto flags =
        run_command(launcher + "-n 2 " + test::build_path("train_gpt2") + " --bogus-flag");
    EXPECT_EQ(flags.exit_code, 2) << flags.output;
    EXPECT_EQ(flags.output, "error: unknown flag --bogus-flag\n(--help lists every flag)\n");
    const auto run_time = run_command(launcher + "-n 2 " + test::build_path("train_gpt2") +
                                      " --data " + path("no-such.txt") + " --max-steps 1");
    EXPECT_EQ(run_time.exit_code, 1) << run_time.output;
    EXPECT_EQ(run_time.output, "error (rank 0 of 2): " + path("no-such.txt") +
                                   ": cannot open (No such file or directory)\n");
    const auto missing = run_command(launcher + "-n 1 " + path("no-such-program"));
    EXPECT_NE(missing.exit_code, 0) << missing.output;
    EXPECT_NE(missing.output.find("could not access\nor execute an executable"), std::string::npos)
        << missing.output;
}

// What README's fault table says of plain mpirun, as Open MPI 4.1 does it: the terminal's SIGINT
// to mpirun's process group reaches mpirun alone, which kills the ranks within two seconds and
// exits non-zero; what is left is the last checkpoint, which verifies.
TEST_F(TrainRun, CtrlCOnPlainMpirunLosesOnlyTheWorkSinceTheLastCheckpoint) {
    const std::string log = path("log.txt");
    const auto result = run_command(
        "bash -c 'set -m; " +
        command("--max-steps 1000000 --log-every 1 --checkpoint-every 4 --out-dir " + path("out"),
                2) +
        " > " + log + " 2>&1 & job=$!; " + test::wait_for_log(log, "step 9/") +
        "kill -INT -$job; wait $job; echo exit=$?'");
    const std::string text = read_text_file(log);
    EXPECT_NE(test::echoed_exit_code(result.output), 0) << result.output << text;
    // A model this small may still save in the second between SIGTERM and SIGKILL.
    const auto steps = list_checkpoints(path("out"));
    ASSERT_FALSE(steps.empty()) << text;
    EXPECT_TRUE(steps[0] % 4 == 0 || text.find(std::string(log_lines::kStoppedBySignal) + " " +
                                               std::to_string(steps[0])) != std::string::npos)
        << text;
    EXPECT_NO_THROW((void)load_checkpoint(model_path(path("out"), steps[0])));
}

// --checkpoint-minutes beside --checkpoint-every, on a test clock that advances 10 minutes per
// step: due after 25 minutes at steps 3 and 7 (the step-4 checkpoint restarts the clock), at
// every 4th step and at the end. Under ZeRO-1 every rank takes part in a checkpoint (it gathers
// the moments), so ranks that disagreed on the step would hang.
TEST_F(TrainRun, CheckpointsByTheClockAtTheSameStepOnEveryRank) {
    const auto result = train(
        "--max-steps 8 --checkpoint-every 4 --checkpoint-minutes 25 --test-minutes-per-step 10 "
        "--keep-checkpoints 0 --zero 1 --out-dir " +
            path("out"),
        2);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_EQ(list_checkpoints(path("out")),
              (std::vector<std::int64_t>{8, 7, 4, 3}))  // newest first
        << result.output;
    const auto off = train(
        "--max-steps 8 --checkpoint-every 0 --checkpoint-minutes 0 --test-minutes-per-step 10 "
        "--out-dir " +
        path("off"));
    ASSERT_EQ(off.exit_code, 0) << off.output;
    EXPECT_EQ(list_checkpoints(path("off")), (std::vector<std::int64_t>{8}));
}

}  // namespace
}  // namespace gpt2
