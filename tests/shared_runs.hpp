// Program runs that several TESTs check, made once. ctest starts every TEST in a process of its
// own, so a run made in a static fixture would be made again for each TEST: here the first
// process of one ctest invocation to need a run makes it under a lock, in a directory of that
// invocation, and the others read its exit status and output from there (ctest's cleanup test
// mpi_training.SharedRuns.Remove deletes the directory). A test program run by hand keeps its
// runs in a directory of its own, removed at exit.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "core/file_io.hpp"
#include "process_support.hpp"
#include "scratch_files.hpp"

namespace gpt2::test {

namespace shared_runs_detail {

// The start time of process `pid` (field 22 of /proc/pid/stat), or "" if it is gone: with the
// pid it names one process, whatever pids the system reuses.
inline std::string start_time(long pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::size_t after_name = stat.rfind(')');
    if (after_name == std::string::npos) return "";
    std::istringstream fields(stat.substr(after_name + 2));  // from field 3 (state) on
    std::string field;
    for (int i = 3; i <= 22 && fields >> field; ++i) {
    }
    return field;
}

inline bool parent_is_ctest() {
    std::ifstream in("/proc/" + std::to_string(static_cast<long>(::getppid())) + "/comm");
    std::string name;
    std::getline(in, name);
    return name == "ctest";
}

inline std::filesystem::path temp_dir() {
    std::error_code ec;
    std::filesystem::path dir = std::filesystem::temp_directory_path(ec);
    return ec ? std::filesystem::path("/tmp") : dir;
}

inline constexpr std::string_view kPrefix = "gpt2-shared-runs-";

// Removes the directories of ctest invocations that have ended (one killed before its cleanup).
inline void remove_abandoned() {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(temp_dir(), ec)) {
        const std::string name = entry.path().filename().string();
        if (!name.starts_with(kPrefix)) continue;
        const std::string rest = name.substr(kPrefix.size());
        const std::size_t dash = rest.find('-');
        if (dash == std::string::npos) continue;
        const long pid = std::strtol(rest.substr(0, dash).c_str(), nullptr, 10);
        if (start_time(pid) != rest.substr(dash + 1)) std::filesystem::remove_all(entry.path(), ec);
    }
}

// The directory every process of this ctest invocation shares, or this process's own.
inline const std::filesystem::path& root() {
    static const std::filesystem::path path = [] {
        if (!parent_is_ctest()) {
            static const ScratchDir own("gpt2-own-runs");
            return own.path();
        }
        remove_abandoned();
        const long ctest = ::getppid();
        std::filesystem::path shared =
            temp_dir() / (std::string(kPrefix) + std::to_string(ctest) + "-" + start_time(ctest));
        std::filesystem::create_directories(shared);
        return shared;
    }();
    return path;
}

// An exclusive lock on a file, held for the object's life.
class FileLock {
  public:
    explicit FileLock(const std::filesystem::path& path)
        : fd_(::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644)) {
        if (fd_ < 0 || ::flock(fd_, LOCK_EX) != 0)
            throw std::runtime_error("cannot lock " + path.string());
    }
    ~FileLock() {
        if (fd_ >= 0) ::close(fd_);  // closing releases the lock
    }
    FileLock(const FileLock&) = delete;
    FileLock& operator=(const FileLock&) = delete;

  private:
    int fd_;
};

}  // namespace shared_runs_detail

// The runs of one group (a directory of their own, with their own inputs).
class SharedRuns {
  public:
    explicit SharedRuns(const std::string& group) : path_(shared_runs_detail::root() / group) {
        std::filesystem::create_directories(path_);
    }
    [[nodiscard]] const std::filesystem::path& path() const { return path_; }
    [[nodiscard]] std::string operator/(const std::string& name) const {
        return (path_ / name).string();
    }

    // Calls `make` (which writes an input) once; the other processes wait until it is done.
    void once(const std::string& name, const std::function<void()>& make) const {
        const shared_runs_detail::FileLock lock(path_ / (name + ".lock"));
        const std::filesystem::path done = path_ / (name + ".done");
        if (std::filesystem::exists(done)) return;
        make();
        write_bytes(done, "");
    }

    // `commands` in order (each, whatever the one before did), made once: their results.
    [[nodiscard]] std::vector<ProcessResult> run(const std::string& name,
                                                 const std::vector<std::string>& commands) const {
        const shared_runs_detail::FileLock lock(path_ / (name + ".lock"));
        const std::filesystem::path saved = path_ / (name + ".results.json");
        std::vector<ProcessResult> results;
        if (std::filesystem::exists(saved)) {
            for (const nlohmann::json& r : nlohmann::json::parse(read_text_file(saved)))
                results.push_back(
                    {r.at("exit_code").get<int>(), r.at("output").get<std::string>()});
            return results;
        }
        nlohmann::json record = nlohmann::json::array();
        for (const std::string& command : commands) {
            results.push_back(run_command(command));
            record.push_back(
                {{"exit_code", results.back().exit_code}, {"output", results.back().output}});
        }
        write_bytes(path_ / (name + ".results.json.tmp"),
                    record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
        std::filesystem::rename(path_ / (name + ".results.json.tmp"), saved);
        return results;
    }

  private:
    std::filesystem::path path_;
};

}  // namespace gpt2::test
