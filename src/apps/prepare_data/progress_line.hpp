// prepare_data's one-line progress display, redrawn in place on a terminal (logs never see it).
#pragma once

#include <cstdint>

#include "core/clock.hpp"

namespace gpt2::prepare_data {

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
    Clock::time_point start_;
};

}  // namespace gpt2::prepare_data
