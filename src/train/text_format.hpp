// Numbers as the training log prints them: 1,234,567 tokens, 1m05s, 1.21 GiB, 1 step.
#pragma once

#include <string>
#include <string_view>

namespace gpt2 {

[[nodiscard]] std::string with_commas(double value);
[[nodiscard]] std::string format_duration(double seconds);
// "1.5 MiB", "12.0 KiB", and below a KiB "512 bytes" (never "0.0 KiB").
[[nodiscard]] std::string human_bytes(double bytes);
// "1 step", "2 steps", "1,024 workers": a count and its noun, plural when it is not one.
[[nodiscard]] std::string counted(double count, std::string_view noun);

}  // namespace gpt2
