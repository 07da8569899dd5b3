#include "apps/prepare_data/progress_line.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace gpt2::prepare_data {

std::optional<double> seconds_left(std::uint64_t total, std::uint64_t first_bytes,
                                   std::uint64_t bytes, double seconds) {
    if (seconds < 2.0 || bytes <= first_bytes) return std::nullopt;
    const double rate = static_cast<double>(bytes - first_bytes) / seconds;
    return static_cast<double>(total - std::min(total, bytes)) / rate;
}

ProgressLine::ProgressLine(std::uint64_t total_bytes)
    : total_(total_bytes), enabled_(::isatty(STDERR_FILENO) == 1) {}

ProgressLine::~ProgressLine() {
    if (enabled_ && drawn_) std::fputc('\n', stderr);
}

void ProgressLine::update(std::uint64_t bytes, std::uint64_t documents, std::uint64_t tokens) {
    if (!enabled_) return;
    if (!drawn_) {
        first_bytes_ = bytes;
        first_ = Clock::now();
    }
    const double seconds = seconds_since(first_);
    const double rate =
        seconds > 0 ? static_cast<double>(bytes - std::min(bytes, first_bytes_)) / 1e6 / seconds
                    : 0.0;
    const std::optional<double> left = seconds_left(total_, first_bytes_, bytes, seconds);
    const std::string eta =
        left ? std::to_string(static_cast<long long>(*left + 0.5)) + " s" : std::string("-");
    std::fprintf(
        stderr, "\r%.0f / %.0f MB (%.1f%%) | %llu documents | %llu tokens | %.1f MB/s | ETA %s   ",
        static_cast<double>(bytes) / 1e6, static_cast<double>(total_) / 1e6,
        total_ > 0 ? 100.0 * static_cast<double>(bytes) / static_cast<double>(total_) : 100.0,
        static_cast<unsigned long long>(documents), static_cast<unsigned long long>(tokens), rate,
        eta.c_str());
    std::fflush(stderr);
    drawn_ = true;
}

}  // namespace gpt2::prepare_data
