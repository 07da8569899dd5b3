// Loss-spike skipping (llm.c's -sl / -sg): z-scores over a window like llm.c's, a step above
// either threshold skipped, training going on after an injected spike, and resume across the
// window bitwise exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "core/random.hpp"
#include "optim/spike_guard.hpp"
#include "process_support.hpp"
#include "train_run_fixture.hpp"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;
using test::run_command;
using test::ScratchDir;
using test::TrainRun;

TEST(SpikeWindow, ScoresLikeLlmcOnceFull) {
    SpikeWindow window;
    for (int i = 0; i < 128; ++i)
        EXPECT_FALSE(window.push(i).has_value());  // the first 128 values only fill the window
    // The 129th replaces the oldest (0) and is scored with itself in the window, as llm.c does.
    double sum = 200.0, squares = 200.0 * 200.0;
    for (int i = 1; i < 128; ++i) {
        sum += i;
        squares += static_cast<double>(i) * i;
    }
    const double mean = sum / 128.0;
    const double sd = std::sqrt(squares / 128.0 - mean * mean);
    const std::optional<double> z = window.push(200.0);
    ASSERT_TRUE(z.has_value());
    EXPECT_NEAR(*z, (200.0 - mean) / sd, 1e-9);
    EXPECT_EQ(window.count, 128u);
    EXPECT_EQ(window.next, 1u);
    SpikeWindow flat;
    for (int i = 0; i < 129; ++i)
        (void)flat.push(2.0);
    EXPECT_EQ(*flat.push(2.0), 0.0);                       // no spread: nothing is an outlier
    EXPECT_LT(*flat.push(1e12), std::sqrt(127.0) + 1e-9);  // z is bounded by sqrt(N - 1)
}

TEST(SpikeGuard, SkipsAboveEitherThreshold) {
    SpikeGuard guard;
    guard.max_loss_z = 3.0;
    guard.max_norm_z = 4.0;
    for (int i = 0; i < 130; ++i)
        EXPECT_FALSE(guard.judge(3.0 + 0.01 * (i % 5), 1.0 + 0.1 * (i % 3)).skip);
    const SpikeGuard::Verdict spike = guard.judge(9.0, 1.1);  // a loss spike
    EXPECT_TRUE(spike.skip);
    EXPECT_GT(*spike.loss_z, 3.0);
    EXPECT_LT(*spike.norm_z, 4.0);
    EXPECT_TRUE(guard.judge(3.02, 50.0).skip);  // a norm spike
    EXPECT_FALSE(guard.judge(3.02, 1.1).skip);
    SpikeGuard off;  // thresholds 0: z-scores, never a skip
    for (int i = 0; i < 129; ++i)
        (void)off.judge(3.0 + 0.01 * (i % 5), 1.0);
    const SpikeGuard::Verdict huge = off.judge(1e9, 1e9);
    EXPECT_FALSE(huge.skip);
    EXPECT_GT(*huge.loss_z, 11.0);
}

// A gradient-norm spike injected at step 151 is skipped (logged, recorded) and the losses go on
// exactly as when that update is skipped for a non-finite gradient; without --skip-norm-z the
// same spike is applied and the training differs.
TEST_F(TrainRun, AnInjectedSpikeIsSkippedAndTrainingContinues) {
    const std::string common = "--max-steps 160 --checkpoint-every 0 --out-dir ";
    const auto skipped = train("--skip-norm-z 6 --inject-spike-step 150 --metrics-file " +
                               path("spike.jsonl") + " " + common + path("spike"));
    ASSERT_EQ(skipped.exit_code, 0) << skipped.output;
    EXPECT_NE(skipped.output.find("step 151: gradient norm z-score +"), std::string::npos)
        << skipped.output;
    EXPECT_NE(skipped.output.find("above --skip-norm-z 6: update skipped (1 in a row)"),
              std::string::npos)
        << skipped.output;
    ASSERT_EQ(train("--skip-norm-z 6 --inject-nan-step 150 --metrics-file " + path("nan.jsonl") +
                    " " + common + path("nan"))
                  .exit_code,
              0);
    ASSERT_EQ(train("--inject-spike-step 150 --metrics-file " + path("applied.jsonl") + " " +
                    common + path("applied"))
                  .exit_code,
              0);
    const auto spike = test::metrics_records(path("spike.jsonl"), "train");
    const auto nan = test::metrics_records(path("nan.jsonl"), "train");
    const auto applied = test::metrics_records(path("applied.jsonl"), "train");
    ASSERT_EQ(spike.size(), 160u);
    EXPECT_EQ(spike[150]["skipped"], true);
    EXPECT_EQ(spike[150]["spike"], true);
    EXPECT_GT(spike[150]["norm_z"].get<double>(), 6.0);
    EXPECT_TRUE(spike[149]["norm_z"].is_number());
    EXPECT_TRUE(spike[100]["norm_z"].is_null());  // fewer than 128 steps before it
    for (std::size_t s = 151; s < 160; ++s)
        EXPECT_EQ(spike[s]["loss"], nan[s]["loss"]) << "step " << s + 1;
    EXPECT_NE(spike[159]["loss"], applied[159]["loss"]);
}

// The windows are part of the resume state: stopped at step 100 (before the window is full) and
// resumed, the run scores and skips exactly as an uninterrupted one.
TEST_F(TrainRun, ResumeAcrossTheSpikeWindowIsBitwiseExact) {
    const std::string common = "--skip-loss-z 2 --skip-norm-z 2 --max-steps 200 --out-dir ";
    ASSERT_EQ(
        train(common + path("straight") + " --metrics-file " + path("straight.jsonl")).exit_code,
        0);
    ASSERT_EQ(train(common + path("out") + " --stop-at-step 100").exit_code, 0);
    const auto resumed =
        train(common + path("out") + " --resume auto --metrics-file " + path("resumed.jsonl"));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    const auto straight = test::metrics_records(path("straight.jsonl"), "train");
    const auto after = test::metrics_records(path("resumed.jsonl"), "train");
    ASSERT_EQ(straight.size(), 200u);
    ASSERT_EQ(after.size(), 100u);
    int scored = 0;
    for (std::size_t s = 0; s < 100; ++s) {
        EXPECT_EQ(after[s]["loss"], straight[100 + s]["loss"]) << "step " << 101 + s;
        EXPECT_EQ(after[s]["loss_z"], straight[100 + s]["loss_z"]) << "step " << 101 + s;
        EXPECT_EQ(after[s]["norm_z"], straight[100 + s]["norm_z"]) << "step " << 101 + s;
        EXPECT_EQ(after[s]["skipped"], straight[100 + s]["skipped"]) << "step " << 101 + s;
        if (straight[100 + s]["loss_z"].is_number()) ++scored;
    }
    EXPECT_GT(scored, 50);
}

}  // namespace
}  // namespace gpt2
