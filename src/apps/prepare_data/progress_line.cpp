#include "apps/prepare_data/progress_line.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace gpt2::prepare_data {

ProgressLine::ProgressLine(std::uint64_t total_bytes)
    : total_(total_bytes), enabled_(::isatty(STDERR_FILENO) == 1), start_(Clock::now()) {}

ProgressLine::~ProgressLine() {
    if (enabled_ && drawn_) std::fputc('\n', stderr);
}

void ProgressLine::update(std::uint64_t bytes, std::uint64_t documents, std::uint64_t tokens) {
    if (!enabled_) return;
    const double seconds = seconds_since(start_);
    const double rate = seconds > 0 ? static_cast<double>(bytes) / 1e6 / seconds : 0.0;
    const double left =
        rate > 0 ? static_cast<double>(total_ - std::min(total_, bytes)) / 1e6 / rate : 0.0;
    std::fprintf(
        stderr,
        "\r%.0f / %.0f MB (%.1f%%) | %llu documents | %llu tokens | %.1f MB/s | ETA %.0f s   ",
        static_cast<double>(bytes) / 1e6, static_cast<double>(total_) / 1e6,
        total_ > 0 ? 100.0 * static_cast<double>(bytes) / static_cast<double>(total_) : 100.0,
        static_cast<unsigned long long>(documents), static_cast<unsigned long long>(tokens), rate,
        left);
    std::fflush(stderr);
    drawn_ = true;
}

}  // namespace gpt2::prepare_data
