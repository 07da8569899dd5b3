// Numbers as the training log prints them: 1,234,567 tokens, 1m05s, 1.21 GiB.
#pragma once

#include <string>

namespace gpt2 {

[[nodiscard]] std::string with_commas(double value);
[[nodiscard]] std::string format_duration(double seconds);
[[nodiscard]] std::string human_bytes(double bytes);

}  // namespace gpt2
