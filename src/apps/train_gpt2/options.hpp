// train_gpt2's command line: the flags (CLI11) and --config files that fill TrainOptions.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <variant>
#include <vector>

#include "train/options.hpp"

namespace gpt2 {

// Reads a --config file: one `flag = value` per line (flag spelled as on the command line, with
// dashes or underscores; values bare, "double-quoted" or 'single-quoted'; true/false for
// switches; # or ; starts a comment), each flag of `app` at most once. Returns the equivalent
// command-line arguments. Anything else (unknown or repeated flags, sections, arrays,
// `flag: value`, a directory) is an InputError naming the file, and the line and key.
[[nodiscard]] std::vector<std::string> read_config_file(const std::string& path,
                                                        const CLI::App& app);

// Parses argv. Returns the options, or an exit code when the program should stop now (--help
// printed: 0; a bad flag: 2, with one message naming it on stderr). Only a `speaker` prints, so
// that N ranks do not print the same message N times.
[[nodiscard]] std::variant<TrainOptions, int> parse_train_options(int argc, char** argv,
                                                                  bool speaker = true);

}  // namespace gpt2
