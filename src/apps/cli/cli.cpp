#include "apps/cli/cli.hpp"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

namespace gpt2::app {

std::string_view version() {
    return GPT2_VERSION;
}

std::string error_line(std::string_view message, int rank, int world) {
    if (world > 1) {
        return "error (rank " + std::to_string(rank) + " of " + std::to_string(world) +
               "): " + std::string(message);
    }
    return "error: " + std::string(message);
}

namespace {

// "warning: " before a warning and "error: " before an error (the prefix of every program's error
// line), nothing before information: a warning reads as one in a log and to grep.
class LevelPrefix final : public spdlog::custom_flag_formatter {
  public:
    void format(const spdlog::details::log_msg& msg, const std::tm& /*time*/,
                spdlog::memory_buf_t& dest) override {
        const std::string_view prefix = msg.level == spdlog::level::warn  ? "warning: "
                                        : msg.level >= spdlog::level::err ? "error: "
                                                                          : "";
        dest.append(prefix.data(), prefix.data() + prefix.size());
    }
    [[nodiscard]] std::unique_ptr<custom_flag_formatter> clone() const override {
        return std::make_unique<LevelPrefix>();
    }
};

}  // namespace

void setup_logging(const std::string& level_name, LogStream stream, int rank, int world) {
    const std::string name = "gpt2";
    spdlog::drop(name);
    // Colour only the level's prefix, and only on a terminal: not under mpirun, which hands the
    // ranks a pseudo-terminal whatever its own output is (a file, a pipe), nor with NO_COLOR set
    // (no-color.org) or TERM=dumb.
    const int fd = stream == LogStream::Stdout ? STDOUT_FILENO : STDERR_FILENO;
    const char* term = std::getenv("TERM");
    const bool colour = ::isatty(fd) == 1 && std::getenv("NO_COLOR") == nullptr &&
                        std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr &&
                        std::getenv("PMI_RANK") == nullptr &&
                        !(term != nullptr && std::string_view(term) == "dumb");
    const spdlog::color_mode mode = colour ? spdlog::color_mode::always : spdlog::color_mode::never;
    auto logger = stream == LogStream::Stdout ? spdlog::stdout_color_mt(name, mode)
                                              : spdlog::stderr_color_mt(name, mode);
    const auto level = spdlog::level::from_str(level_name);
    const bool diagnostics = level <= spdlog::level::debug;
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<LevelPrefix>('*').set_pattern(
        world > 1 && diagnostics ? fmt::format("[%H:%M:%S rank {}] %^%*%$%v", rank)
                                 : std::string("[%H:%M:%S] %^%*%$%v"));
    logger->set_formatter(std::move(formatter));
    logger->set_level(rank == 0 || diagnostics ? level : spdlog::level::warn);
    logger->flush_on(spdlog::level::trace);
    spdlog::set_default_logger(logger);
}

void add_common_flags(CLI::App& app, std::string& log_level) {
    app.set_version_flag("--version",
                         std::string(app.get_name()) + " (gpt2-mpi) " + std::string(version()));
    app.add_option("--log-level", log_level, "trace | debug | info | warn | error")
        ->check(one_of({"trace", "debug", "info", "warn", "error"}, "log level"))
        ->type_name("LEVEL")
        ->capture_default_str();
    app.failure_message([](const CLI::App*, const CLI::Error& e) {
        return error_line(e.what()) + "\n(--help lists every flag)\n";
    });
}

std::string closest_name(std::string_view name, const std::vector<std::string>& candidates) {
    // Two edits catch a dropped, doubled or swapped letter; a name of one or two letters is too
    // short for any suggestion to mean something.
    const std::size_t limit = std::min<std::size_t>(2, name.empty() ? 0 : (name.size() - 1) / 2);
    std::string best;
    std::size_t best_distance = limit + 1;
    for (const std::string& candidate : candidates) {
        // Edit distance with adjacent letters swapped counting as one edit ("gtp2" is one from
        // "gpt2"): rows i-2, i-1 and i of the table.
        std::vector<std::size_t> before(candidate.size() + 1), previous(candidate.size() + 1),
            row(candidate.size() + 1);
        for (std::size_t j = 0; j < row.size(); ++j)
            row[j] = j;
        for (std::size_t i = 1; i <= name.size(); ++i) {
            before.swap(previous);
            previous.swap(row);
            row[0] = i;
            for (std::size_t j = 1; j <= candidate.size(); ++j) {
                row[j] = std::min({previous[j] + 1, row[j - 1] + 1,
                                   previous[j - 1] + (name[i - 1] == candidate[j - 1] ? 0 : 1)});
                if (i > 1 && j > 1 && name[i - 1] == candidate[j - 2] &&
                    name[i - 2] == candidate[j - 1]) {
                    row[j] = std::min(row[j], before[j - 2] + 1);
                }
            }
        }
        if (row.back() < best_distance) {
            best_distance = row.back();
            best = candidate;
        }
    }
    if (!best.empty()) return best;
    // A name cut short or run on ("q8" for "q8_0", "warning" for "warn", "--lr-decay" for
    // "--lr-decay-steps"), when only one candidate fits.
    std::string only;
    for (const std::string& candidate : candidates) {
        const bool cut_short = name.size() >= 2 && candidate.starts_with(name);
        const bool run_on = candidate.size() >= 3 && name.starts_with(candidate);
        if (!cut_short && !run_on) continue;
        if (!only.empty()) return {};
        only = candidate;
    }
    return only;
}

namespace {

void collect_long_names(const CLI::App& app, bool include_hidden, std::vector<std::string>& names) {
    for (const CLI::Option* option : app.get_options()) {
        if (!include_hidden && option->get_group().empty()) continue;
        for (const std::string& name : option->get_lnames())
            names.push_back(name);
    }
    for (const CLI::App* group : app.get_subcommands([](const CLI::App*) { return true; })) {
        collect_long_names(*group, include_hidden, names);
    }
}

// Every option of `app` and of its option groups.
void collect_options(const CLI::App& app, std::vector<const CLI::Option*>& options) {
    for (const CLI::Option* option : app.get_options())
        options.push_back(option);
    for (const CLI::App* group : app.get_subcommands([](const CLI::App*) { return true; })) {
        collect_options(*group, options);
    }
}

// The option a command-line word names ("--flag", "--flag=value", "-f"), if any.
const CLI::Option* named_option(const CLI::App& app, const std::string& word) {
    if (word.size() < 2 || word.front() != '-') return nullptr;
    return app.get_option_no_throw(word.substr(0, word.find('=')));
}

// What is wrong with a command line that CLI11 parsed, in one line.
struct Problem {
    std::string message;
    bool see_help = false;  // nothing close to what was typed: --help is where to look
};

// "unknown flag --x (did you mean --y?)" for the first word CLI11 could not place that looks like
// a flag; a stray value is named too. Nothing when every word found its option.
std::optional<Problem> unplaced_words(const CLI::App& app) {
    const std::vector<std::string> extras = app.remaining();
    for (const std::string& word : extras) {
        if (word.size() < 2 || word.front() != '-' || word == "--") continue;
        if (std::isdigit(static_cast<unsigned char>(word[1])) != 0 || word[1] == '.') continue;
        const std::string flag = word.substr(0, word.find('='));
        const std::string bare = flag.substr(flag.find_first_not_of('-'));
        const std::string suggestion = closest_name(bare, long_flag_names(app, false));
        if (suggestion.empty()) return Problem{"unknown flag " + flag, true};
        return Problem{"unknown flag " + flag + " (did you mean --" + suggestion + "?)"};
    }
    if (!extras.empty()) return Problem{"unexpected argument '" + extras.front() + "'", true};
    return std::nullopt;
}

// A flag given more than once on the command line (the words after the first `from_config`),
// unless its option takes a list. Counted by CLI11 (which knows which words were values), minus
// what the config file set.
std::optional<Problem> repeated_flag(const CLI::App& app, const std::vector<std::string>& args,
                                     std::size_t from_config) {
    std::map<const CLI::Option*, std::size_t> in_file;
    std::map<const CLI::Option*, std::vector<std::string>> spelled;  // as typed, in order
    std::map<const CLI::Option*, std::vector<std::string>> typed;    // values as typed, in order
    for (std::size_t i = 0; i < args.size(); ++i) {
        const CLI::Option* option = named_option(app, args[i]);
        if (option == nullptr) continue;
        if (i < from_config) {
            ++in_file[option];
        } else {
            std::vector<std::string>& names = spelled[option];
            const std::string name = args[i].substr(0, args[i].find('='));
            if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
            const auto equals = args[i].find('=');
            if (equals != std::string::npos) {
                typed[option].push_back(args[i].substr(equals + 1));
            } else if (option->get_expected_min() > 0 && i + 1 < args.size()) {
                typed[option].push_back(args[i + 1]);
            }
        }
    }
    std::vector<const CLI::Option*> options;
    collect_options(app, options);
    for (const CLI::Option* option : options) {
        if (option->get_positional() || option->get_expected_max() > 1) continue;
        const std::size_t given = option->count();
        const std::size_t on_command_line = given - std::min(given, in_file[option]);
        if (on_command_line < 2) continue;
        std::string names;
        for (const std::string& name : spelled[option])
            names += (names.empty() ? "" : " and ") + name;
        if (names.empty()) names = option->get_name();
        std::string values;
        // The values as typed (CLI11's results are after its transforms: a kind's number).
        if (option->get_expected_min() > 0 && !typed[option].empty()) {
            for (const std::string& value : typed[option])
                values += (values.empty() ? " (" : ", then ") + value;
            values += ")";
        }
        const std::string times =
            on_command_line == 2 ? "twice" : std::to_string(on_command_line) + " times";
        return Problem{names + " given " + times + values + ": give it once"};
    }
    return std::nullopt;
}

}  // namespace

std::vector<std::string> long_flag_names(const CLI::App& app, bool include_hidden) {
    std::vector<std::string> names;
    collect_long_names(app, include_hidden, names);
    return names;
}

std::optional<int> parse_arguments(CLI::App& app, const std::vector<std::string>& args,
                                   std::size_t from_config, bool speaker) {
    // CLI11 takes the arguments last first.
    std::vector<std::string> reversed(args.rbegin(), args.rend());
    std::optional<CLI::ParseError> failure;
    try {
        app.parse(reversed);
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == 0) {  // --help, --version
            if (!speaker) return kExitOk;
            std::ostringstream out, err;
            (void)app.exit(e, out, err);
            std::cout << out.str() << std::flush;
            std::cerr << err.str() << std::flush;
            return kExitOk;
        }
        failure = e;
    }
    // A mistyped or repeated flag explains whatever else went wrong, so it is named first.
    std::optional<Problem> problem = unplaced_words(app);
    if (!problem) problem = repeated_flag(app, args, from_config);
    if (!problem && !failure) return std::nullopt;
    if (!speaker) return kExitBadFlags;
    if (problem) {
        std::cerr << error_line(problem->message)
                  << (problem->see_help ? "\n(--help lists every flag)" : "") << std::endl;
    } else {
        std::ostringstream out, err;
        (void)app.exit(*failure, out, err);
        std::cout << out.str() << std::flush;
        std::cerr << err.str() << std::flush;
    }
    return kExitBadFlags;
}

std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv, bool speaker) {
    return parse_arguments(app, std::vector<std::string>(argv + 1, argv + argc), 0, speaker);
}

std::string unknown_name(const std::string& input, const std::vector<std::string>& names,
                         const std::string& what) {
    std::string known;
    for (const std::string& name : names)
        known += (known.empty() ? "" : ", ") + name;
    const std::string suggestion = closest_name(input, names);
    return "unknown " + what + " '" + input + "'" +
           (suggestion.empty() ? "" : " (did you mean " + suggestion + "?)") + "; known: " + known;
}

CLI::Validator one_of(std::vector<std::string> names, std::string what) {
    return CLI::Validator(
        [names = std::move(names), what = std::move(what)](std::string& input) -> std::string {
            if (std::find(names.begin(), names.end(), input) != names.end()) return {};
            return unknown_name(input, names, what);
        },
        "", "");
}

namespace {
std::string format_bound(double value) {
    std::ostringstream out;
    out << value;
    return out.str();
}

CLI::Validator numeric_check(std::string description, std::function<bool(double)> accept) {
    return CLI::Validator(
        [description, accept](std::string& input) -> std::string {
            double value = 0.0;
            std::size_t used = 0;
            try {
                value = std::stod(input, &used);
            } catch (const std::exception&) {
                return "must be a number (got '" + input + "')";
            }
            if (used != input.size() || !std::isfinite(value)) {
                return "must be a finite number (got '" + input + "')";
            }
            if (!accept(value)) return "must be " + description + " (got " + input + ")";
            return {};
        },
        "", "");
}
}  // namespace

CLI::Validator at_least(double minimum) {
    return numeric_check(">= " + format_bound(minimum),
                         [minimum](double v) { return v >= minimum; });
}

CLI::Validator positive() {
    return numeric_check("> 0", [](double v) { return v > 0.0; });
}

CLI::Validator whole_number() {
    return CLI::Validator(
        [](std::string& input) -> std::string {
            const bool digits =
                !input.empty() && input.find_first_not_of("0123456789") == std::string::npos;
            // 2^64 - 1 has 20 digits; anything longer, or 20 digits above it, does not fit.
            if (digits &&
                (input.size() < 20 || (input.size() == 20 && input <= "18446744073709551615"))) {
                return {};
            }
            return "must be a whole number from 0 to 18446744073709551615 (got " + input + ")";
        },
        "", "");
}

CLI::Validator in_unit_interval() {
    return numeric_check("in (0, 1]", [](double v) { return v > 0.0 && v <= 1.0; });
}

}  // namespace gpt2::app
