// Threaded training: any number of workers gives the same training as one (up to float
// summation order), repeated runs are bitwise identical, and the pool itself behaves.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "core/random.hpp"
#include "parallel/comm.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/thread_pool.hpp"
#include "test_support.hpp"

namespace gpt2 {
namespace {

struct TrainResult {
    std::vector<double> losses;
    std::vector<float> params;
};

const ModelConfig kConfig{32, 97, 128, 2, 4, 32};
constexpr float kLr = 1e-3f;
// Large enough that gradients which are zero up to rounding (about 1e-9) cannot drive Adam to
// lr-sized steps, small against every real gradient: the test checks the threading, not that.
constexpr float kEps = 1e-5f;

// Ten steps of a small model on random tokens with W workers and a batch of B sequences.
TrainResult train_ten_steps(int workers, int B, Precision precision = Precision::fp32) {
    const ModelConfig config = kConfig;
    const int T = 32;
    Model model(config);
    init_parameters(model, 7);
    set_precision(model, precision);
    AdamWState optimizer(model.layout.total());
    WorkerGroup group(config, workers, B, T, false, precision);
    const Communicator comm = Communicator::single_process();
    Rng rng(99);
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(B) * T + 1);
    TrainResult result;
    for (int step = 0; step < 10; ++step) {
        for (auto& t : tokens)
            t = static_cast<std::int32_t>(rng.below(97));
        const std::span<const std::int32_t> all(tokens);
        const StepBatch batch{all.first(tokens.size() - 1), all.subspan(1), 1, B};
        const StepHyper hyper{AdamWHyper{kLr, 0.9f, 0.95f, kEps, 0.1f}, 1.0f};
        const StepMetrics m = train_step(model, optimizer, group, comm, batch, hyper);
        EXPECT_FALSE(m.skipped);
        result.losses.push_back(m.loss);
    }
    result.params.assign(model.params.data(), model.params.data() + model.params.size());
    return result;
}

class ThreadedTraining : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(ThreadedTraining, MatchesOneWorker) {
    const auto [workers, B] = GetParam();
    const TrainResult reference = train_ten_steps(1, B);
    const TrainResult threaded = train_ten_steps(workers, B);
    ASSERT_EQ(threaded.losses.size(), reference.losses.size());
    for (std::size_t i = 0; i < reference.losses.size(); ++i) {
        EXPECT_NEAR(threaded.losses[i], reference.losses[i], 1e-5 * reference.losses[i])
            << "step " << i;
    }
    EXPECT_TRUE(test::same_training(kConfig, threaded.params, reference.params, 1e-5, 10 * kLr));
}

TEST_P(ThreadedTraining, RepeatedRunsAreBitwiseEqual) {
    const auto [workers, B] = GetParam();
    const TrainResult a = train_ten_steps(workers, B);
    const TrainResult b = train_ten_steps(workers, B);
    EXPECT_EQ(a.losses, b.losses);
    ASSERT_EQ(a.params.size(), b.params.size());
    EXPECT_EQ(std::memcmp(a.params.data(), b.params.data(), a.params.size() * sizeof(float)), 0);
}

// bf16 products: the workers change the fp32 summation order, and a last-bit difference can flip
// a bf16 rounding, which Adam then amplifies (most in the biases, which start at zero); so the
// issue's bf16 tolerance for parameters (2e-2 in norm per tensor; measured up to 1.1e-3) and
// 1e-4 for losses (measured below 1e-5), bitwise repeatability, and the bf16 run measurably not
// the fp32 one.
TEST_P(ThreadedTraining, Bf16MatchesOneWorkerAndRepeatsBitwise) {
    const auto [workers, B] = GetParam();
    const TrainResult reference = train_ten_steps(1, B, Precision::bf16);
    const TrainResult threaded = train_ten_steps(workers, B, Precision::bf16);
    const TrainResult again = train_ten_steps(workers, B, Precision::bf16);
    const TrainResult fp32 = train_ten_steps(1, B, Precision::fp32);
    ASSERT_EQ(threaded.losses.size(), reference.losses.size());
    for (std::size_t i = 0; i < reference.losses.size(); ++i) {
        EXPECT_NEAR(threaded.losses[i], reference.losses[i], 1e-4 * reference.losses[i])
            << "step " << i;
    }
    EXPECT_TRUE(test::same_training(kConfig, threaded.params, reference.params, 2e-2, 10 * kLr));
    EXPECT_EQ(threaded.losses, again.losses);
    EXPECT_EQ(std::memcmp(threaded.params.data(), again.params.data(),
                          again.params.size() * sizeof(float)),
              0);
    EXPECT_NE(reference.losses.back(), fp32.losses.back()) << "bf16 ran as fp32";
    EXPECT_NEAR(reference.losses.back(), fp32.losses.back(), 1e-2 * fp32.losses.back());
}

INSTANTIATE_TEST_SUITE_P(WorkersAndBatch, ThreadedTraining,
                         ::testing::Values(std::tuple{2, 4}, std::tuple{3, 5}, std::tuple{4, 6},
                                           std::tuple{2, 5}));

TEST(ThreadPool, RunsEveryWorkerOnceWithItsIndex) {
    ThreadPool pool(4);
    for (int round = 0; round < 100; ++round) {
        std::vector<int> seen(4, 0);
        pool.run([&](int w) { seen[static_cast<std::size_t>(w)] += 1; });
        EXPECT_EQ(seen, std::vector<int>(4, 1));
    }
}

TEST(ThreadPool, RethrowsAWorkersException) {
    ThreadPool pool(3);
    EXPECT_THROW(pool.run([](int w) {
        if (w == 2) throw std::runtime_error("worker 2 failed");
    }),
                 std::runtime_error);
    // The pool is still usable afterwards.
    std::atomic<int> count{0};
    pool.run([&](int) { count.fetch_add(1); });
    EXPECT_EQ(count.load(), 3);
}

TEST(SplitRange, CoversEverythingWithNearEqualShares) {
    for (std::size_t n : {0u, 1u, 5u, 7u, 1000u}) {
        for (int W = 1; W <= 5; ++W) {
            std::size_t next = 0;
            for (int w = 0; w < W; ++w) {
                const Range r = split_range(n, w, W);
                EXPECT_EQ(r.begin, next);
                EXPECT_LE(r.end - r.begin, n / W + 1);
                next = r.end;
            }
            EXPECT_EQ(next, n);
        }
    }
    // B = 5 over W = 2 is 3 + 2.
    EXPECT_EQ(split_range(5, 0, 2).end, 3u);
}

}  // namespace
}  // namespace gpt2
