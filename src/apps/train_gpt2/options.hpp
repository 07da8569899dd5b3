// train_gpt2's command line: the flags (CLI11) and --config files that fill TrainOptions.
#pragma once

#include <set>
#include <string>
#include <variant>
#include <vector>

#include "train/options.hpp"

namespace gpt2 {

// Reads a --config file: one `flag = value` per line (flag spelled as on the command line, with
// dashes or underscores; values bare, "double-quoted" or 'single-quoted'; true/false for
// switches; # or ; starts a comment). Returns the equivalent command-line arguments. Anything
// else (unknown flags, sections, arrays, `flag: value`) is an InputError naming the file, line
// and key. `switches` are the flags that take no value.
[[nodiscard]] std::vector<std::string> read_config_file(const std::string& path,
                                                        const std::set<std::string>& known_flags,
                                                        const std::set<std::string>& switches);

// Parses argv. Returns the options, or an exit code when the program should stop now (--help
// printed: 0; a bad flag: 2, with one message naming it on stderr). Only a `speaker` prints, so
// that N ranks do not print the same message N times.
[[nodiscard]] std::variant<TrainOptions, int> parse_train_options(int argc, char** argv,
                                                                  bool speaker = true);

}  // namespace gpt2
