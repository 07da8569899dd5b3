#include "core/system_memory.hpp"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.hpp"

namespace gpt2 {

namespace {
// A whole small file's first token as a number; empty when missing or not a number (cgroup v2
// writes "max" for no limit).
std::optional<std::uint64_t> read_number(const std::string& path) {
    std::ifstream in(path);
    std::string token;
    if (!(in >> token)) return std::nullopt;
    char* end = nullptr;
    const unsigned long long value = std::strtoull(token.c_str(), &end, 10);
    if (end == token.c_str() || *end != '\0') return std::nullopt;
    return static_cast<std::uint64_t>(value);
}

std::optional<std::uint64_t> mem_available() {
    std::ifstream in("/proc/meminfo");
    std::string key, unit;
    std::uint64_t kib = 0;
    while (in >> key >> kib) {
        std::getline(in, unit);
        if (key == "MemAvailable:") return kib * 1024;
    }
    return std::nullopt;
}

// This process's cgroup: the path after "0::" (v2) or after "memory:" (v1) in /proc/self/cgroup.
std::optional<AvailableMemory> cgroup_room() {
    std::ifstream in("/proc/self/cgroup");
    std::string line;
    while (std::getline(in, line)) {
        std::string dir, limit_file, usage_file, name;
        if (line.rfind("0::", 0) == 0) {
            dir = "/sys/fs/cgroup" + line.substr(3);
            limit_file = "/memory.max";
            usage_file = "/memory.current";
            name = "cgroup memory.max";
        } else if (const auto at = line.find(":memory:"); at != std::string::npos) {
            dir = "/sys/fs/cgroup/memory" + line.substr(at + 8);
            limit_file = "/memory.limit_in_bytes";
            usage_file = "/memory.usage_in_bytes";
            name = "cgroup memory.limit_in_bytes";
        } else {
            continue;
        }
        // The limit may sit on any ancestor: walk up and keep the tightest.
        std::optional<AvailableMemory> best;
        for (std::string d = dir; d.size() >= std::string("/sys/fs/cgroup").size();) {
            const auto limit = read_number(d + limit_file);
            const auto usage = read_number(d + usage_file);
            if (limit && usage && *limit < (std::uint64_t{1} << 60)) {
                const std::uint64_t room = *limit > *usage ? *limit - *usage : 0;
                if (!best || room < best->bytes) best = AvailableMemory{room, name};
            }
            const auto slash = d.find_last_of('/');
            if (slash == std::string::npos || slash == 0) break;
            d.resize(slash);
        }
        if (best) return best;
    }
    return std::nullopt;
}
}  // namespace

std::optional<AvailableMemory> available_memory() {
    if (const char* forced = std::getenv("GPT2_MEMORY_AVAILABLE"); forced != nullptr) {
        char* end = nullptr;
        const double value = std::strtod(forced, &end);
        double scale = 1.0;
        if (end != forced && *end != '\0') {
            switch (*end) {
                case 'K':
                    scale = 1024.0;
                    break;
                case 'M':
                    scale = 1024.0 * 1024.0;
                    break;
                case 'G':
                    scale = 1024.0 * 1024.0 * 1024.0;
                    break;
                default:
                    scale = 0.0;
            }
            if (scale != 0.0 && end[1] != '\0') scale = 0.0;
        }
        if (end == forced || scale == 0.0 || !(value >= 0.0)) {
            throw InputError(std::string("GPT2_MEMORY_AVAILABLE: '") + forced +
                             "' is not a size in bytes (a K, M or G suffix allowed)");
        }
        return AvailableMemory{static_cast<std::uint64_t>(value * scale), "GPT2_MEMORY_AVAILABLE"};
    }
    std::optional<AvailableMemory> result;
    if (const auto bytes = mem_available()) result = AvailableMemory{*bytes, "MemAvailable"};
    if (const auto room = cgroup_room(); room && (!result || room->bytes < result->bytes)) {
        result = room;
    }
    return result;
}

}  // namespace gpt2
