// Learning-rate schedules: linear warmup, then cosine or linear decay to a floor, or constant.
#pragma once

#include <cstdint>
#include <string_view>

namespace gpt2 {

enum class LrSchedule { Cosine, Linear, Constant };

struct ScheduleConfig {
    LrSchedule kind = LrSchedule::Cosine;
    float max_lr = 1e-3f;
    float min_lr = 0.0f;
    std::int64_t warmup_steps = 0;
    std::int64_t total_steps = 1;
};

// The learning rate of 0-based step `step`: (step+1)/warmup * max_lr during warmup, then decays
// from max_lr at the end of warmup to min_lr at the last step.
[[nodiscard]] float learning_rate(const ScheduleConfig& config, std::int64_t step);

}  // namespace gpt2
