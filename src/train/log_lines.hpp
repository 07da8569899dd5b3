// The wordings of the run's log lines that tests, scripts and users look for, named once: the run
// prints them from here and the tests match these constants, so the two cannot drift apart.
#pragma once

#include <string_view>

namespace gpt2::log_lines {

// "stopped by signal at step N (SIGINT); resume with --resume auto"
inline constexpr std::string_view kStoppedBySignal = "stopped by signal at step";
// "resuming from STATE at step N"
inline constexpr std::string_view kResumingFrom = "resuming from";
// "not enough memory: ..." (the memory plan's refusal)
inline constexpr std::string_view kNotEnoughMemory = "not enough memory";
// How the gradient travels between ranks: "gradient across ranks: one allreduce after backward
// (...)" or "... buckets of N MiB, summed while backward runs".
inline constexpr std::string_view kGradientAcrossRanks = "gradient across ranks:";
inline constexpr std::string_view kOneAllreduce = "one allreduce after backward";
inline constexpr std::string_view kSummedWhileBackward = "summed while backward runs";

}  // namespace gpt2::log_lines
