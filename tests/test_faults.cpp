// Faults a long run meets: the process killed (SIGKILL) at random moments while it writes
// checkpoints, a disk that fills up during a write, and one rank dying mid-run.
#include <gtest/gtest.h>

#include <random>

#include "formats/checkpoint.hpp"
#include "model/optimizer.hpp"
#include "process_support.hpp"
#include "train/resume_state.hpp"
#include "train_run_fixture.hpp"

namespace gpt2 {
namespace {

using test::TrainRun;

using test::run_command;
using test::ScratchDir;

std::string train(const ScratchDir& dir, const std::string& extra) {
    return test::build_path("train_gpt2") +
           " --n-layer 2 --n-head 4 --n-embd 128 --seq-len 32 --batch-size 4 --threads 2"
           " --val-every 0 --sample-every 0 --data " +
           (dir / "corpus.txt") + " --out-dir " + (dir / "out") + " " + extra;
}

// The newest checkpoint listed must load and verify completely (model checksum and state).
void expect_newest_checkpoint_verifies(const std::filesystem::path& out, int round) {
    const std::vector<std::int64_t> steps = list_checkpoints(out);
    if (steps.empty()) return;  // killed before the first checkpoint completed
    const LoadedModel loaded = load_checkpoint(model_path(out, steps.front()));
    ASSERT_TRUE(loaded.extras.has_value()) << "round " << round;
    AdamWState optimizer(loaded.model.layout.total());
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
    EXPECT_NE(resumed.output.find("resuming from " +
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
    AdamWState optimizer(kept.model.layout.total());
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
    const std::string command = "timeout 120 " + test::mpiexec(2, "-x " + marker) +
                                train(dir, "--threads 1 --max-steps 100000 --checkpoint-every 0");
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
        command("--max-steps 1000000 --checkpoint-every 0 --out-dir " + path("out"), 2) + " > " +
        log + " 2>&1 & job=$!; " + test::wait_for_log(log, "step 3/") +
        "kill -USR1 $job; wait $job; echo exit=$?'");
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(test::echoed_exit_code(result.output), 0) << result.output << text;
    EXPECT_NE(text.find("stopped by signal at step"), std::string::npos) << text;
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
        command("--max-steps 1000000 --checkpoint-every 0 --out-dir " + path("out"));
    const auto result =
        run_command("bash -c '" + marker + " " + job + " > " + log + " 2>&1 & job=$!; " +
                    test::wait_for_log(log, "step 3/") +
                    test::signal_rank(marker, 1, "TERM", "signalled") + "wait $job; echo exit=$?'");
    EXPECT_NE(result.output.find("signalled"), std::string::npos) << result.output;
    EXPECT_EQ(test::echoed_exit_code(result.output), 0) << result.output;
    EXPECT_EQ(list_checkpoints(path("out")).size(), 1u);
}

}  // namespace
}  // namespace gpt2
