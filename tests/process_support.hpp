// Helpers for tests that run the programs (train_gpt2, inference) as a user would, possibly under
// mpiexec: run a shell command, capture its output and exit code
// (scratch directories: scratch_files.hpp).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <unistd.h>
#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/file_io.hpp"
#include "scratch_files.hpp"

namespace gpt2::test {

struct ProcessResult {
    int exit_code = -1;
    std::string output;  // stdout and stderr interleaved
    double seconds = 0.0;
};

// Runs `command` through the shell with stderr merged into stdout.
inline ProcessResult run_command(const std::string& command) {
    const auto start = std::chrono::steady_clock::now();
    ProcessResult result;
    FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
    if (pipe == nullptr) return result;
    std::array<char, 4096> buffer{};
    while (std::fgets(buffer.data(), buffer.size(), pipe) != nullptr)
        result.output += buffer.data();
    const int status = ::pclose(pipe);
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    result.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return result;
}

// The exit code a shell loop printed as its last "exit=N" (`wait $job; echo exit=$?`), or -1 when
// there is none: tests compare the number, never a prefix of the text.
inline int echoed_exit_code(const std::string& output) {
    const std::size_t at = output.rfind("exit=");
    if (at == std::string::npos) return -1;
    std::size_t end = at + 5;
    while (end < output.size() && std::isdigit(static_cast<unsigned char>(output[end])))
        ++end;
    return end == at + 5 ? -1 : std::stoi(output.substr(at + 5, end - at - 5));
}

inline std::string build_path(const std::string& program) {
    return std::string(GPT2_BUILD_DIR) + "/" + program;
}

// The shape flags of the small model the program tests train: two layers of 32 channels in two
// heads, a few tens of thousands of parameters (fast under the sanitizers, yet every code path).
inline std::string small_model(int seq_len) {
    return " --n-layer 2 --n-head 2 --n-embd 32 --seq-len " + std::to_string(seq_len);
}

// `defaults` (" --flag value" or " --flag" words, none quoted) without the flags that `flags` (a
// shell fragment) gives too: the programs refuse a flag given twice, so a test's own choice
// replaces the default instead of following it. A default flag's value is every word up to the
// next one that starts with "--".
inline std::string without_given(const std::string& defaults, const std::string& flags) {
    const auto gives = [&flags](const std::string& flag) {
        for (std::size_t at = flags.find(flag); at != std::string::npos;
             at = flags.find(flag, at + 1)) {
            const bool starts = at == 0 || flags[at - 1] == ' ';
            const std::size_t end = at + flag.size();
            const bool ends = end == flags.size() || flags[end] == ' ' || flags[end] == '=';
            if (starts && ends) return true;
        }
        return false;
    };
    std::string kept;
    bool keeping = true;
    std::size_t at = 0;
    while (at < defaults.size()) {
        const std::size_t start = defaults.find_first_not_of(' ', at);
        if (start == std::string::npos) break;
        const std::size_t end = std::min(defaults.find(' ', start), defaults.size());
        const std::string word = defaults.substr(start, end - start);
        if (word.starts_with("--")) keeping = !gives(word);
        if (keeping) kept += " " + word;
        at = end;
    }
    return kept;
}

// mpiexec with the flags a test on one small machine needs (more ranks than cores, root).
// `options` go before the first program's "-n" (e.g. "-x NAME" to export a variable); for an MPMD
// job, append " : -n M PROGRAM" to the command.
inline std::string mpiexec(int ranks, const std::string& options = "") {
    return "mpiexec --oversubscribe --allow-run-as-root " + (options.empty() ? "" : options + " ") +
           "-n " + std::to_string(ranks) + " ";
}

// Shell fragments for the scripts (`bash -c '...'`) that start a job in the background, wait for
// it to get somewhere and then interrupt it.
// Waits until `log` contains `text` (a grep pattern without double quotes), polling every 50 ms for
// at most `seconds`; the script goes on either way.
inline std::string wait_for_log(const std::string& log, const std::string& text,
                                int seconds = 120) {
    return "for i in $(seq " + std::to_string(seconds * 20) + "); do grep -q \"" + text + "\" " +
           log + " && break; sleep 0.05; done; ";
}
// Sends `signal` (KILL, TERM, ...) to MPI rank `rank` of the job whose processes carry the
// environment variable assignment `marker` (exported with mpiexec -x), and echoes `said` for each
// process signalled. The job's command line is shared by the launching shell, its environment not.
inline std::string signal_rank(const std::string& marker, int rank, const std::string& signal,
                               const std::string& said) {
    return "for p in $(pgrep -x train_gpt2); do tr \"\\0\" \"\\n\" < /proc/$p/environ | grep -qx " +
           marker + " && tr \"\\0\" \"\\n\" < /proc/$p/environ | grep -qx OMPI_COMM_WORLD_RANK=" +
           std::to_string(rank) + " && kill -" + signal + " $p && echo " + said + "; done; ";
}

// The records of a metrics file (--metrics-file, JSON Lines) whose "type" is `type` ("train",
// "val", "run", ...; empty: every record), in file order.
inline std::vector<nlohmann::json> metrics_records(const std::string& file,
                                                   const std::string& type) {
    std::vector<nlohmann::json> out;
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);) {
        auto record = nlohmann::json::parse(line);
        if (type.empty() || record["type"] == type) out.push_back(std::move(record));
    }
    return out;
}

// One number of each record of `type` (JSON has no NaN: a non-finite value is written as null,
// read back as NaN).
inline std::vector<double> metrics_values(const std::string& file, const std::string& type,
                                          const std::string& field) {
    std::vector<double> values;
    for (const nlohmann::json& record : metrics_records(file, type))
        values.push_back(record[field].is_null() ? std::nan("") : record[field].get<double>());
    return values;
}

// A small tmpfs mounted for the test (needs the right to mount, as root in CI has); unmounted by
// the destructor. `options` are more mount options, e.g. "ro" for a read-only file system.
class TinyFileSystem {
  public:
    TinyFileSystem(const std::filesystem::path& where, const std::string& size,
                   const std::string& options = "")
        : where_(where) {
        std::filesystem::create_directories(where);
        mounted_ = run_command("mount -t tmpfs -o size=" + size +
                               (options.empty() ? "" : "," + options) + " tmpfs " + where.string())
                       .exit_code == 0;
    }
    ~TinyFileSystem() {
        if (mounted_) (void)run_command("umount " + where_.string());
    }
    [[nodiscard]] bool mounted() const { return mounted_; }

  private:
    std::filesystem::path where_;
    bool mounted_ = false;
};

// The .bin shards in `expected`, each compared byte for byte with the file of the same name in
// `actual` (a preparation stopped and resumed against one run through); returns how many.
inline int expect_same_shards(const std::filesystem::path& expected,
                              const std::filesystem::path& actual) {
    int shards = 0;
    for (const auto& entry : std::filesystem::directory_iterator(expected)) {
        if (entry.path().extension() != ".bin") continue;
        ++shards;
        EXPECT_EQ(read_file_bytes(entry.path()), read_file_bytes(actual / entry.path().filename()))
            << entry.path().filename();
    }
    return shards;
}

// A deterministic English-like corpus of about `bytes` bytes.
inline void write_corpus(const std::filesystem::path& path, std::size_t bytes) {
    static constexpr std::array<const char*, 16> kWords = {
        "the", "king", "shall", "speak", "of",   "love",  "and", "war",
        "to",  "thee", "my",    "lord",  "what", "night", "is",  "fair"};
    std::ofstream out(path, std::ios::binary);
    std::uint64_t state = 12345;
    std::size_t written = 0;
    while (written < bytes) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        const std::string word = kWords[(state >> 33) % kWords.size()];
        const char sep = ((state >> 20) % 11 == 0) ? '\n' : ' ';
        out << word << sep;
        written += word.size() + 1;
    }
}

}  // namespace gpt2::test
