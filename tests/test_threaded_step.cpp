// The threaded step with the communication thread, as ThreadSanitizer runs it
// (dev/sanitizers.sh): two workers per rank summing layer by layer while the rank's
// communication thread allreduces buckets, the shared-memory step, and shared-memory slices
// summed and allreduced in buckets across simulated machines. In the ordinary build the same runs
// check that each path is taken and finishes.
#include <gtest/gtest.h>

#include <string>

#include "process_support.hpp"
#include "train/log_lines.hpp"

namespace gpt2 {
namespace {

using test::run_command;
using test::ScratchDir;

class ThreadedStep : public ::testing::Test {
  protected:
    void SetUp() override { test::write_corpus(dir_.path() / "corpus.txt", 20000); }
    // Three steps of the small model with two workers per rank.
    [[nodiscard]] test::ProcessResult train(int ranks, const std::string& flags) const {
        return run_command(test::mpiexec(ranks) + test::build_path("train_gpt2") +
                           test::small_model(16) +
                           " --batch-size 4 --threads 2 --max-steps 3 --val-every 0"
                           " --sample-every 0 --checkpoint-every 0 --data " +
                           (dir_ / "corpus.txt") + " --out-dir " + (dir_ / "out") + " " + flags);
    }
    // No report from ThreadSanitizer (with halt_on_error a report also ends the job non-zero).
    static void expect_clean(const test::ProcessResult& result, const std::string& path) {
        EXPECT_EQ(result.exit_code, 0) << result.output;
        EXPECT_EQ(result.output.find("ThreadSanitizer"), std::string::npos) << result.output;
        EXPECT_NE(result.output.find(path), std::string::npos) << result.output;
    }
    ScratchDir dir_{"gpt2-threaded-step"};
};

TEST_F(ThreadedStep, BucketsOnTheCommunicationThreadWhileWorkersSum) {
    expect_clean(train(2, "--bucket-mb 0.004"), std::string(log_lines::kGradientAcrossRanks) +
                                                    " buckets of 0.004 MiB, " +
                                                    std::string(log_lines::kSummedWhileBackward));
}

TEST_F(ThreadedStep, SharedMemoryStep) {
    expect_clean(train(2, ""), "gradient across ranks: shared memory, each rank sums and updates");
}

TEST_F(ThreadedStep, SharedMemorySlicesInBucketsAcrossMachines) {
    expect_clean(train(4, "--simulate-machines 2 --bucket-mb 0.004"),
                 "in buckets of 0.004 MiB while backward runs");
}

}  // namespace
}  // namespace gpt2
