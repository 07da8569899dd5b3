// prepare_data's one-line progress display, redrawn in place on a terminal (logs never see it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/clock.hpp"

namespace gpt2::prepare_data {

// The time left, from the rate since the first update (`bytes` now and `first_bytes` then, of
// `total`, `seconds` apart): none until two seconds of progress are behind it, so that neither a
// first batch nor the part a resumed preparation skips at once makes it "0 s".
[[nodiscard]] std::optional<double> seconds_left(std::uint64_t total, std::uint64_t first_bytes,
                                                 std::uint64_t bytes, double seconds);

class ProgressLine {
  public:
    // Draws only when standard error is a terminal; total_bytes is the corpus as stored.
    explicit ProgressLine(std::uint64_t total_bytes);
    ProgressLine(const ProgressLine&) = delete;
    ProgressLine& operator=(const ProgressLine&) = delete;
    ~ProgressLine();  // ends the line, if one was drawn

    void update(std::uint64_t bytes, std::uint64_t documents, std::uint64_t tokens);

  private:
    std::uint64_t total_;
    bool enabled_;
    bool drawn_ = false;
    std::uint64_t first_bytes_ = 0;  // at the first update
    Clock::time_point first_;
};

}  // namespace gpt2::prepare_data
