// The one clock the programs time phases with (monotonic) and the elapsed seconds since a point.
#pragma once

#include <chrono>

namespace gpt2 {

using Clock = std::chrono::steady_clock;

[[nodiscard]] inline double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace gpt2
