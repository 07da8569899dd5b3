#include "train/text_format.hpp"

#include <fmt/format.h>

namespace gpt2 {

std::string with_commas(double value) {
    const std::string digits = std::to_string(static_cast<long long>(value + 0.5));
    std::string out;
    for (std::size_t i = 0; i < digits.size(); ++i) {
        if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
        out += digits[i];
    }
    return out;
}

std::string format_duration(double seconds) {
    const auto s = static_cast<long long>(seconds + 0.5);
    if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
    if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
    return fmt::format("{}s", s);
}

std::string human_bytes(double bytes) {
    if (bytes >= 1 << 30) return fmt::format("{:.2f} GiB", bytes / (1 << 30));
    if (bytes >= 1 << 20) return fmt::format("{:.1f} MiB", bytes / (1 << 20));
    if (bytes >= 1024) return fmt::format("{:.1f} KiB", bytes / 1024);
    return fmt::format("{:.0f} bytes", bytes);
}

std::string counted(double count, std::string_view noun) {
    return with_commas(count) + " " + std::string(noun) + (count == 1.0 ? "" : "s");
}

}  // namespace gpt2
