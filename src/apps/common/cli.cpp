#include "apps/common/cli.hpp"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <iostream>
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

void setup_logging(const std::string& level_name, LogStream stream, int rank, int world) {
    const std::string name = "gpt2";
    spdlog::drop(name);
    auto logger = stream == LogStream::Stdout ? spdlog::stdout_logger_mt(name)
                                              : spdlog::stderr_logger_mt(name);
    const auto level = spdlog::level::from_str(level_name);
    const bool diagnostics = level <= spdlog::level::debug;
    logger->set_pattern(world > 1 && diagnostics ? fmt::format("[%H:%M:%S rank {}] %v", rank)
                                                 : std::string("[%H:%M:%S] %v"));
    logger->set_level(rank == 0 || diagnostics ? level : spdlog::level::warn);
    logger->flush_on(spdlog::level::trace);
    spdlog::set_default_logger(logger);
}

void add_common_flags(CLI::App& app, std::string& log_level) {
    app.set_version_flag("--version",
                         std::string(app.get_name()) + " (gpt2-mpi) " + std::string(version()));
    app.add_option("--log-level", log_level, "trace | debug | info | warn | error")
        ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}).description(""))
        ->type_name("LEVEL")
        ->capture_default_str();
    app.failure_message([](const CLI::App*, const CLI::Error& e) {
        return error_line(e.what()) + "\n(--help lists every flag)\n";
    });
}

std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv, bool speaker) {
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        if (!speaker) return e.get_exit_code() == 0 ? kExitOk : kExitBadFlags;
        std::ostringstream out, err;
        const int code = app.exit(e, out, err);
        std::cout << out.str() << std::flush;
        std::cerr << err.str() << std::flush;
        return code == 0 ? kExitOk : kExitBadFlags;
    }
    return std::nullopt;
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

CLI::Validator in_unit_interval() {
    return numeric_check("in (0, 1]", [](double v) { return v > 0.0 && v <= 1.0; });
}

}  // namespace gpt2::app
