// Checkpoints by the clock (--checkpoint-minutes): how long since the run started or last saved,
// so that a fault costs at most that much work whatever the step time.
#pragma once

#include "core/clock.hpp"

namespace gpt2 {

class CheckpointClock {
  public:
    // `every_minutes` 0: never due. `test_minutes_per_step` > 0 (a test hook): the clock advances
    // that much at each step_done() instead of reading the time.
    CheckpointClock(double every_minutes, double test_minutes_per_step);

    void step_done();
    // Whether a checkpoint is due now.
    [[nodiscard]] bool due() const;
    void saved();

  private:
    [[nodiscard]] double minutes_since_save() const;

    double every_minutes_;
    double test_minutes_per_step_;
    double test_minutes_ = 0.0;  // the test clock's minutes since the last save
    Clock::time_point last_save_ = Clock::now();
};

}  // namespace gpt2
