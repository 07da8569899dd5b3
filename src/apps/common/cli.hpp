// What the three programs (train_gpt2, inference, prepare_data) share on the command line: one
// log format, one error voice, one set of exit codes, and the flags every program has
// (--version, --log-level). The programs' own flags stay in their front ends.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace gpt2::app {

inline constexpr int kExitOk = 0;
inline constexpr int kExitRuntimeError = 1;  // bad files, failed writes, out of memory...
inline constexpr int kExitBadFlags = 2;      // the command line itself is wrong

[[nodiscard]] std::string_view version();

// "error: message" in a single process, "error (rank R of N): message" when there are several.
[[nodiscard]] std::string error_line(std::string_view message, int rank = 0, int world = 1);

enum class LogStream { Stdout, Stderr };

// Installs the default spdlog logger with the one pattern every program uses: "[HH:MM:SS] text",
// and "[HH:MM:SS rank R] text" when there are several ranks and diagnostics (debug) are on.
// Ranks other than 0 print only warnings and errors unless the level is debug or trace.
void setup_logging(const std::string& level, LogStream stream = LogStream::Stdout, int rank = 0,
                   int world = 1);

// The programs' common CLI11 setup: --version, --log-level (into `log_level`), defaults shown in
// --help, errors printed as one "error: ..." line.
void add_common_flags(CLI::App& app, std::string& log_level);

// Parses argv. Returns nothing when the program should go on, or its exit code when it should stop
// now (0 after --help/--version, kExitBadFlags for a bad command line). Only a `speaker` prints.
[[nodiscard]] std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv,
                                                    bool speaker = true);

// Validators whose failure reads "--flag must be >= 0" rather than CLI11's range message.
[[nodiscard]] CLI::Validator at_least(double minimum);
[[nodiscard]] CLI::Validator positive();
[[nodiscard]] CLI::Validator in_unit_interval();  // (0, 1]

}  // namespace gpt2::app
