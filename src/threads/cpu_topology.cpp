#include "threads/cpu_topology.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

namespace gpt2 {

namespace {
constexpr int kMaxCpu = 1 << 20;  // far above any machine's CPU numbers; bounds a bad list

std::optional<int> parse_cpu(std::string_view text) {
    int cpu = -1;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), cpu);
    if (error != std::errc{} || end != text.data() + text.size() || cpu < 0 || cpu >= kMaxCpu)
        return std::nullopt;
    return cpu;
}

std::optional<std::string> read_text(const std::filesystem::path& path) {
    std::ifstream in(path);
    if (!in) return std::nullopt;
    std::ostringstream text;
    text << in.rdbuf();
    if (in.bad()) return std::nullopt;
    return std::move(text).str();
}
}  // namespace

std::optional<std::vector<int>> parse_cpu_list(std::string_view text) {
    while (!text.empty() && (text.back() == '\n' || text.back() == ' '))
        text.remove_suffix(1);
    std::vector<int> cpus;
    while (!text.empty()) {
        const std::size_t comma = text.find(',');
        const std::string_view item = text.substr(0, comma);
        text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
        if (comma != std::string_view::npos && text.empty()) return std::nullopt;  // "1,"
        const std::size_t dash = item.find('-');
        const auto first = parse_cpu(item.substr(0, dash));
        const auto last = dash == std::string_view::npos ? first : parse_cpu(item.substr(dash + 1));
        if (!first || !last || *last < *first) return std::nullopt;
        for (int cpu = *first; cpu <= *last; ++cpu)
            cpus.push_back(cpu);
    }
    std::sort(cpus.begin(), cpus.end());
    cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
    return cpus;
}

std::vector<int> affinity_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    std::vector<int> cpus;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
            if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
        }
    }
    return cpus;
}

std::vector<int> online_cpus() {
    if (const auto text = read_text("/sys/devices/system/cpu/online")) {
        if (auto cpus = parse_cpu_list(*text); cpus && !cpus->empty()) return *std::move(cpus);
    }
    const long count = ::sysconf(_SC_NPROCESSORS_ONLN);
    std::vector<int> cpus(static_cast<std::size_t>(std::max(count, 1L)));
    for (std::size_t i = 0; i < cpus.size(); ++i)
        cpus[i] = static_cast<int>(i);
    return cpus;
}

std::vector<int> parent_affinity_cpus() {
    const auto status = read_text("/proc/" + std::to_string(::getppid()) + "/status");
    if (!status) return {};
    constexpr std::string_view kKey = "Cpus_allowed_list:";
    const std::size_t at = status->find(kKey);
    if (at == std::string::npos) return {};
    const std::size_t begin = status->find_first_not_of(" \t", at + kKey.size());
    const std::size_t end = status->find('\n', at);
    if (begin == std::string::npos || begin >= end) return {};
    auto cpus = parse_cpu_list(std::string_view(*status).substr(begin, end - begin));
    return cpus ? *std::move(cpus) : std::vector<int>{};
}

CoresFirst cores_first(std::span<const int> cpus, const std::filesystem::path& cpu_root) {
    // A core is named by its lowest CPU; a CPU without a readable list names its own core.
    const auto core_of = [&](int cpu) {
        const std::filesystem::path topology =
            cpu_root / ("cpu" + std::to_string(cpu)) / "topology";
        for (const char* file : {"core_cpus_list", "thread_siblings_list"}) {
            const auto text = read_text(topology / file);
            if (!text) continue;
            const auto siblings = parse_cpu_list(*text);
            if (siblings && !siblings->empty() &&
                std::binary_search(siblings->begin(), siblings->end(), cpu))
                return siblings->front();
            break;  // there but not a list naming the CPU: a core of its own
        }
        return cpu;
    };
    std::map<int, int> seen;                  // core -> CPUs of it taken so far
    std::vector<std::pair<int, int>> ranked;  // (hardware thread index within its core, position)
    ranked.reserve(cpus.size());
    for (std::size_t i = 0; i < cpus.size(); ++i)
        ranked.emplace_back(seen[core_of(cpus[i])]++, static_cast<int>(i));
    std::stable_sort(ranked.begin(), ranked.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    CoresFirst result;
    result.cpus.reserve(cpus.size());
    for (const auto& [thread, position] : ranked)
        result.cpus.push_back(cpus[static_cast<std::size_t>(position)]);
    result.cores = static_cast<int>(seen.size());
    return result;
}

int available_cpus() {
    return std::max(1, static_cast<int>(affinity_cpus().size()));
}

int available_cores() {
    const auto cpus = affinity_cpus();
    return std::max(1, cores_first(cpus).cores);
}

}  // namespace gpt2
