#include "train/checkpoint_clock.hpp"

namespace gpt2 {

CheckpointClock::CheckpointClock(double every_minutes, double test_minutes_per_step)
    : every_minutes_(every_minutes), test_minutes_per_step_(test_minutes_per_step) {}

void CheckpointClock::step_done() {
    test_minutes_ += test_minutes_per_step_;
}

bool CheckpointClock::due() const {
    return every_minutes_ > 0.0 && minutes_since_save() >= every_minutes_;
}

void CheckpointClock::saved() {
    test_minutes_ = 0.0;
    last_save_ = Clock::now();
}

double CheckpointClock::minutes_since_save() const {
    return test_minutes_per_step_ > 0.0 ? test_minutes_ : seconds_since(last_save_) / 60.0;
}

}  // namespace gpt2
