// Checkpoints and resume as a user meets them: an interrupted run resumed with --resume auto is
// bitwise identical to an uninterrupted one (also under mpiexec); SIGTERM stops cleanly with a
// checkpoint; a crash mid-write never costs the previous checkpoint; non-finite steps are skipped.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "formats/checkpoint.hpp"
#include "process_support.hpp"
#include "train/resume_state.hpp"

namespace gpt2 {
namespace {

using test::run_command;
using test::ScratchDir;

std::string train_command(const ScratchDir& dir, const std::string& out, int ranks,
                          const std::string& extra) {
    const std::string launcher = ranks > 0 ? test::mpiexec(ranks) : "";
    return launcher + test::build_path("train_gpt2") +
           " --n-layer 2 --n-head 2 --n-embd 32 --seq-len 32 --batch-size 4 --lr 1e-3"
           " --warmup-steps 3 --val-every 5 --val-batches 2 --sample-every 0 --checkpoint-every 0"
           " --seed 11 --data " +
           (dir / "corpus.txt") + " --out-dir " + (dir / out) + " --metrics-file " +
           (dir / (out + ".jsonl")) + " " + extra;
}

bool same_params(const std::filesystem::path& a, const std::filesystem::path& b) {
    const LoadedModel x = load_checkpoint(a);
    const LoadedModel y = load_checkpoint(b);
    return x.model.config == y.model.config &&
           std::memcmp(x.model.params.data(), y.model.params.data(),
                       x.model.params.size() * sizeof(float)) == 0;
}

// Trains 20 steps straight, and 10 + 10 with a stop and --resume auto between: same losses and
// parameters, bit for bit.
void expect_bitwise_resume(int ranks, int threads, const std::string& precision) {
    const ScratchDir dir("gpt2-resume-" + std::to_string(ranks) + "-" + std::to_string(threads) +
                         "-" + precision);
    test::write_corpus(dir.path() / "corpus.txt", 40000);
    const std::string flags =
        "--max-steps 20 --threads " + std::to_string(threads) + " --precision " + precision;
    const auto straight = run_command(train_command(dir, "straight", ranks, flags));
    ASSERT_EQ(straight.exit_code, 0) << straight.output;
    EXPECT_NE(straight.output.find("precision " + precision), std::string::npos) << straight.output;
    const auto first =
        run_command(train_command(dir, "resumed", ranks, flags + " --stop-at-step 10"));
    ASSERT_EQ(first.exit_code, 0) << first.output;
    EXPECT_NE(first.output.find("stopped by signal at step 10"), std::string::npos) << first.output;
    const auto second = run_command(train_command(dir, "resumed", ranks, flags + " --resume auto"));
    ASSERT_EQ(second.exit_code, 0) << second.output;
    EXPECT_NE(second.output.find("at step 10"), std::string::npos) << second.output;

    const std::vector<double> a = test::metrics_values(dir / "straight.jsonl", "train", "loss");
    const std::vector<double> b = test::metrics_values(dir / "resumed.jsonl", "train", "loss");
    ASSERT_EQ(a.size(), 20u);
    EXPECT_EQ(a, b);  // bitwise: the metrics file prints doubles exactly
    EXPECT_TRUE(same_params(model_path(dir / "straight", 20), model_path(dir / "resumed", 20)));
}

class Resume : public ::testing::TestWithParam<std::pair<int, int>> {};  // (ranks, threads)

TEST_P(Resume, InterruptedAndResumedRunIsBitwiseIdenticalToAStraightRun) {
    const auto [ranks, threads] = GetParam();
    expect_bitwise_resume(ranks, threads, "fp32");
}

INSTANTIATE_TEST_SUITE_P(RanksThreads, Resume, ::testing::Values(std::pair{0, 2}, std::pair{2, 1}));

// Checkpoints hold the fp32 master weights; the bf16 copy is rebuilt from them on resume exactly
// as AdamW writes it, so bf16 training resumes bit for bit too.
TEST(Resume, Bf16RunResumesBitwiseIdenticalToAStraightRun) {
    expect_bitwise_resume(0, 2, "bf16");
}

TEST(Signals, SigtermStopsAtAStepBoundaryWithACheckpointThatResumes) {
    const ScratchDir dir("gpt2-sigterm");
    test::write_corpus(dir.path() / "corpus.txt", 40000);
    const std::string command = train_command(dir, "out", 0, "--max-steps 100000 --threads 2");
    const std::string log = dir / "log.txt";
    const auto result = run_command("bash -c '" + command + " > " + log + " 2>&1 & pid=$!; " +
                                    test::wait_for_log(log, "step 5/") +
                                    "kill -TERM $pid; wait $pid; echo exit=$?'");
    EXPECT_EQ(test::echoed_exit_code(result.output), 0) << result.output;
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("stopped by signal"), std::string::npos) << text;
    const std::vector<std::int64_t> steps = list_checkpoints(dir.path() / "out");
    ASSERT_EQ(steps.size(), 1u) << text;
    const auto resumed =
        run_command(train_command(dir, "out", 0,
                                  "--max-steps 100000 --threads 2 --resume auto --stop-at-step " +
                                      std::to_string(steps[0] + 2)));
    EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("at step " + std::to_string(steps[0])), std::string::npos)
        << resumed.output;
    EXPECT_EQ(list_checkpoints(dir.path() / "out").front(), steps[0] + 2);
}

TEST(CrashDuringWrite, ResumeUsesTheNewestCompleteCheckpoint) {
    const ScratchDir dir("gpt2-crash");
    test::write_corpus(dir.path() / "corpus.txt", 40000);
    const auto run = run_command(
        train_command(dir, "out", 0, "--max-steps 10 --checkpoint-every 5 --keep-checkpoints 0"));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const auto out = dir.path() / "out";
    ASSERT_EQ(list_checkpoints(out), (std::vector<std::int64_t>{10, 5}));
    // A writer killed mid-way leaves a temporary file, and one killed between the model and its
    // state leaves a model without state; neither may be taken for a checkpoint.
    std::filesystem::copy_file(model_path(out, 10), out / "model_000015.bin");
    std::ofstream(out / "state_000020.bin.tmp.4242") << "partial";
    // And the newest complete-looking checkpoint is corrupt (a flipped byte): skipped.
    {
        std::fstream f(model_path(out, 10), std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(4096);
        f.put('\x7f');
    }
    const auto resumed = run_command(train_command(dir, "out", 0, "--max-steps 10 --resume auto"));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("checksum mismatch"), std::string::npos) << resumed.output;
    EXPECT_NE(resumed.output.find("resuming from " + state_path(out, 5).string()),
              std::string::npos)
        << resumed.output;
}

TEST(NonFinite, AStepWithANanGradientIsSkippedAndTrainingContinues) {
    const ScratchDir dir("gpt2-nan");
    test::write_corpus(dir.path() / "corpus.txt", 40000);
    const auto result =
        run_command(train_command(dir, "out", 0, "--max-steps 6 --inject-nan-step 2"));
    EXPECT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("step 3: non-finite"), std::string::npos) << result.output;
    const std::vector<double> losses = test::metrics_values(dir / "out.jsonl", "train", "loss");
    ASSERT_EQ(losses.size(), 6u);
    EXPECT_TRUE(std::isfinite(losses.back()));
    EXPECT_LT(losses.back(), losses.front());
}

TEST(NonFinite, TooManyBadStepsStopTheRunAndKeepTheLastGoodCheckpoint) {
    const ScratchDir dir("gpt2-nan-stop");
    test::write_corpus(dir.path() / "corpus.txt", 40000);
    const auto result = run_command(train_command(
        dir, "out", 2,
        "--max-steps 8 --threads 1 --checkpoint-every 2 --inject-nan-step 4 --max-bad-steps 1"));
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("skipped steps in a row (non-finite or spikes, --max-bad-steps)"),
              std::string::npos)
        << result.output;
    const auto steps = list_checkpoints(dir.path() / "out");
    ASSERT_FALSE(steps.empty());
    EXPECT_EQ(steps.front(), 4);
    EXPECT_NO_THROW((void)load_checkpoint(model_path(dir.path() / "out", 4)));
}

}  // namespace
}  // namespace gpt2
