#include "optim/schedule.hpp"

#include <algorithm>
#include <cmath>

namespace gpt2 {

float learning_rate(const ScheduleConfig& c, std::int64_t step) {
    if (step < c.warmup_steps) {
        return c.max_lr * static_cast<float>(step + 1) / static_cast<float>(c.warmup_steps);
    }
    if (c.kind == LrSchedule::Constant) return c.max_lr;
    const std::int64_t decay_steps = std::max<std::int64_t>(1, c.total_steps - 1 - c.warmup_steps);
    const double progress = std::clamp(
        static_cast<double>(step - c.warmup_steps) / static_cast<double>(decay_steps), 0.0, 1.0);
    const double factor = c.kind == LrSchedule::Cosine
                              ? 0.5 * (1.0 + std::cos(3.141592653589793 * progress))
                              : 1.0 - progress;
    return static_cast<float>(c.min_lr + factor * (c.max_lr - c.min_lr));
}

}  // namespace gpt2
