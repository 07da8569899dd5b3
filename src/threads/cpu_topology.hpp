// Which CPUs this process may run on and how they group into cores. Workers default to one per
// core: a core's second hardware thread (SMT) shares its FMA and AMX units, so it adds no product
// throughput, while each worker's activations cost memory (PyTorch's default is the same).
#pragma once

#include <filesystem>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace gpt2 {

// A Linux CPU list ("0-3,8,10-11\n", as sysfs and /proc/<pid>/status write them): the CPUs in
// ascending order, each once; nullopt when it is not one.
[[nodiscard]] std::optional<std::vector<int>> parse_cpu_list(std::string_view text);

// CPUs this process may run on (sched_getaffinity), ascending: under mpirun --bind-to core, the
// hardware threads of one core.
[[nodiscard]] std::vector<int> affinity_cpus();

// The CPUs the kernel has online (/sys/devices/system/cpu/online; 0..sysconf - 1 without it).
[[nodiscard]] std::vector<int> online_cpus();

// The CPUs the parent process may run on (Cpus_allowed_list of /proc/<ppid>/status): for a rank
// started by mpirun or orted, the set mpirun binds ranks within. Empty when unreadable.
[[nodiscard]] std::vector<int> parent_affinity_cpus();

// `cpus` reordered so that the first of each core's CPUs comes before any core's second hardware
// thread (cores in the order of their first CPU); `cores` counts them. A core's CPUs are read from
// <cpu_root>/cpuN/topology/core_cpus_list (thread_siblings_list on kernels before 5.7); a CPU
// whose list is missing or unreadable is a core of its own.
struct CoresFirst {
    std::vector<int> cpus;
    int cores = 0;
};
[[nodiscard]] CoresFirst cores_first(
    std::span<const int> cpus, const std::filesystem::path& cpu_root = "/sys/devices/system/cpu");

// CPUs in the affinity mask (at least 1).
[[nodiscard]] int available_cpus();
// Cores in the affinity mask (at least 1): the default number of workers.
[[nodiscard]] int available_cores();

}  // namespace gpt2
