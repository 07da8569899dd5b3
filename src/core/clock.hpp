// The one clock the programs time phases with (monotonic): seconds since a point, a stopwatch
// that takes laps, and a timer that adds its scope's seconds to a total.
#pragma once

#include <chrono>

namespace gpt2 {

using Clock = std::chrono::steady_clock;

[[nodiscard]] inline double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

// Seconds of consecutive phases: each lap() returns the time since the previous one (or since
// the stopwatch started).
class Stopwatch {
  public:
    [[nodiscard]] double lap() {
        const Clock::time_point now = Clock::now();
        const double seconds = std::chrono::duration<double>(now - last_).count();
        last_ = now;
        return seconds;
    }

  private:
    Clock::time_point last_ = Clock::now();
};

// Adds the seconds from its construction to its destruction to `total`.
class ScopedTimer {
  public:
    explicit ScopedTimer(double& total) : total_(total) {}
    ~ScopedTimer() { total_ += seconds_since(start_); }
    ScopedTimer(const ScopedTimer&) = delete;
    ScopedTimer& operator=(const ScopedTimer&) = delete;

  private:
    double& total_;
    Clock::time_point start_ = Clock::now();
};

}  // namespace gpt2
