// How much memory this process may still allocate before the kernel's OOM killer or its cgroup
// stops it: the smaller of MemAvailable and the room under any cgroup memory limit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace gpt2 {

struct AvailableMemory {
    std::uint64_t bytes = 0;
    std::string source;  // what limited it: "MemAvailable", "cgroup memory.max", ...
};

// GPT2_MEMORY_AVAILABLE (bytes, or with a K/M/G suffix) replaces the measurement, for tests and
// for users who want to keep room for other jobs. Empty when nothing could be read.
[[nodiscard]] std::optional<AvailableMemory> available_memory();

}  // namespace gpt2
