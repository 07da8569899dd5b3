// Learning-rate schedules at chosen steps: linear warmup, cosine and linear decay to the floor,
// constant.
#include <gtest/gtest.h>

#include <cmath>

#include "optim/schedule.hpp"

namespace gpt2 {
namespace {

TEST(Schedule, WarmupRisesLinearlyToThePeak) {
    const ScheduleConfig c{LrSchedule::Cosine, 1e-3f, 1e-4f, 10, 110};
    EXPECT_FLOAT_EQ(learning_rate(c, 0), 1e-4f);
    EXPECT_FLOAT_EQ(learning_rate(c, 4), 5e-4f);
    EXPECT_FLOAT_EQ(learning_rate(c, 9), 1e-3f);
}

TEST(Schedule, CosineDecaysFromPeakThroughMidpointToTheFloor) {
    const ScheduleConfig c{LrSchedule::Cosine, 1e-3f, 1e-4f, 10, 111};
    EXPECT_FLOAT_EQ(learning_rate(c, 10), 1e-3f);      // decay starts at the peak
    EXPECT_NEAR(learning_rate(c, 60), 5.5e-4f, 1e-9);  // halfway: (max + min) / 2
    EXPECT_NEAR(learning_rate(c, 35), 1e-4f + 0.9e-3f * 0.5f * (1 + std::cos(M_PI * 0.25)), 1e-9);
    EXPECT_FLOAT_EQ(learning_rate(c, 110), 1e-4f);  // the last step is at the floor
    EXPECT_FLOAT_EQ(learning_rate(c, 500), 1e-4f);  // and stays there
}

TEST(Schedule, LinearDecay) {
    const ScheduleConfig c{LrSchedule::Linear, 1e-3f, 0.0f, 0, 101};
    EXPECT_FLOAT_EQ(learning_rate(c, 0), 1e-3f);
    EXPECT_NEAR(learning_rate(c, 25), 7.5e-4f, 1e-9);
    EXPECT_NEAR(learning_rate(c, 100), 0.0f, 1e-9);
}

TEST(Schedule, ConstantAfterWarmup) {
    const ScheduleConfig c{LrSchedule::Constant, 2e-3f, 0.0f, 4, 50};
    EXPECT_FLOAT_EQ(learning_rate(c, 1), 1e-3f);
    EXPECT_FLOAT_EQ(learning_rate(c, 4), 2e-3f);
    EXPECT_FLOAT_EQ(learning_rate(c, 49), 2e-3f);
}

}  // namespace
}  // namespace gpt2
