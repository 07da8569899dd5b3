// What the four programs (train_gpt2, inference, prepare_data, convert_model) share on the command
// line: one log format, one error voice, one set of exit codes, the flags every program has
// (--version, --log-level), and one "did you mean" for mistyped flags, config keys and names.
// The programs' own flags stay in their front ends.
#pragma once

#include <CLI/CLI.hpp>

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

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
// An unknown flag is named with the closest known one ("did you mean"); a flag given more than
// once is refused, unless it takes a list (a vector option such as prepare_data's --data).
[[nodiscard]] std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv,
                                                    bool speaker = true);

// parse_command_line over `args` (the arguments after the program's name), of which the first
// `from_config` came from a config file: a flag set there and again on the command line is no
// repetition (the command line wins when the option takes the last value).
[[nodiscard]] std::optional<int> parse_arguments(CLI::App& app,
                                                 const std::vector<std::string>& args,
                                                 std::size_t from_config, bool speaker = true);

// The closest of `candidates` to `name` within a couple of edits (fewer for short names), or ""
// when none is that close: the one "did you mean" of unknown flags, config keys and names.
[[nodiscard]] std::string closest_name(std::string_view name,
                                       const std::vector<std::string>& candidates);

// The long names (without dashes) of the options of `app` and of its option groups; hidden ones
// (the testing hooks, in the group "") only with `include_hidden`.
[[nodiscard]] std::vector<std::string> long_flag_names(const CLI::App& app, bool include_hidden);

// A validator that accepts one of `names` and otherwise says "unknown NAME 'x' (did you mean y?);
// known: a, b, c", e.g. for --model's presets and every flag that takes one of a few words.
[[nodiscard]] CLI::Validator one_of(std::vector<std::string> names, std::string what);
// The message one_of gives for `input`.
[[nodiscard]] std::string unknown_name(const std::string& input,
                                       const std::vector<std::string>& names,
                                       const std::string& what);
// one_of for an option bound to an enum: a name of `values` becomes its value (CLI11 then stores
// it), anything else is one_of's message.
template <typename Enum>
[[nodiscard]] CLI::Validator named_value(std::map<std::string, Enum> values, std::string what) {
    std::vector<std::string> names;
    for (const auto& entry : values)
        names.push_back(entry.first);
    return CLI::Validator(
        [values = std::move(values), names = std::move(names),
         what = std::move(what)](std::string& input) -> std::string {
            const auto found = values.find(input);
            if (found == values.end()) return unknown_name(input, names, what);
            input = std::to_string(static_cast<std::underlying_type_t<Enum>>(found->second));
            return {};
        },
        "", "");
}

// Validators whose failure reads "--flag must be >= 0" rather than CLI11's range message.
[[nodiscard]] CLI::Validator at_least(double minimum);
[[nodiscard]] CLI::Validator positive();
[[nodiscard]] CLI::Validator in_unit_interval();  // (0, 1]
// An unsigned 64-bit whole number (a seed): "-1" is refused, not wrapped around to 2^64 - 1.
[[nodiscard]] CLI::Validator whole_number();

}  // namespace gpt2::app
