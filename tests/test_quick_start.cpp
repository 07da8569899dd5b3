// The README's commands as a newcomer runs them: the quick start's journey (train, generate, two
// ranks through the launcher, convert, generate with llama.cpp) and the table of the four programs,
// each command exactly as written, in a directory laid out like a fresh checkout after
// scripts/setup.sh, as root without Open MPI's root variables (as in a container). Training runs
// are shortened by an appended --max-steps, nothing else changes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "checkout_support.hpp"
#include "core/file_io.hpp"
#include "process_support.hpp"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;
using test::run_command;

// The --max-steps appended to the README's training commands: the quick start's, and the table's
// (a 30M-parameter model there).
constexpr int kShortRun = 20;
constexpr int kShortTableRun = 5;

// The text of `line` before its comment: the first '#' outside quotes that follows a blank.
std::string without_comment(const std::string& line) {
    char quote = 0;
    for (std::size_t i = 0; i < line.size(); ++i) {
        const char c = line[i];
        if (quote != 0) {
            if (c == quote) quote = 0;
        } else if (c == '\'' || c == '"') {
            quote = c;
        } else if (c == '#' && i > 0 && (line[i - 1] == ' ' || line[i - 1] == '\t')) {
            return line.substr(0, line.find_last_not_of(" \t", i - 1) + 1);
        }
    }
    return line;
}

// The commands of the first ```bash block after `heading` in README.md.
std::vector<std::string> bash_block_after(const std::string& heading) {
    const std::string readme = read_text_file(fs::path(GPT2_SOURCE_DIR) / "README.md");
    const auto at = readme.find(heading);
    EXPECT_NE(at, std::string::npos) << heading;
    if (at == std::string::npos) return {};
    const auto begin = readme.find("```bash\n", at) + 8;
    const auto end = readme.find("```", begin);
    std::vector<std::string> commands;
    std::istringstream lines(readme.substr(begin, end - begin));
    for (std::string line; std::getline(lines, line);) {
        const std::string command = without_comment(line);
        if (!command.empty()) commands.push_back(command);
    }
    return commands;
}

// The example commands of the README's table of the four programs: its third column, in order.
std::vector<std::string> program_table_examples() {
    const std::string readme = read_text_file(fs::path(GPT2_SOURCE_DIR) / "README.md");
    const auto at = readme.find("## The four programs");
    EXPECT_NE(at, std::string::npos);
    std::vector<std::string> commands;
    std::istringstream lines(readme.substr(at, readme.find("\n## ", at + 1) - at));
    for (std::string line; std::getline(lines, line);) {
        if (!line.starts_with("| `build/")) continue;
        const auto last = line.rfind(" | `");
        if (last == std::string::npos) continue;
        commands.push_back(line.substr(last + 4, line.rfind("` |") - last - 4));
    }
    return commands;
}

// A README command as the test runs it: training shortened by an appended --max-steps.
std::string shortened(const std::string& command, int steps = kShortRun) {
    return command.find("build/train_gpt2") != std::string::npos
               ? command + " --max-steps " + std::to_string(steps)
               : command;
}

// The command's program: its first word after the environment assignments (NAME=value) before it.
std::string program_of(const std::string& command) {
    std::istringstream words(command);
    std::string word;
    while (words >> word && word.find('=') != std::string::npos && word.front() != '-') {
    }
    return word;
}

bool llama_cpp_installed() {
    return fs::exists(fs::path(GPT2_SOURCE_DIR) / ".deps/llama-cpp/node_modules/node-llama-cpp") &&
           run_command("command -v node").exit_code == 0;
}

TEST(QuickStart, EveryCommandRunsAsWrittenFromTrainingToLlamaCpp) {
    const test::Checkout checkout("gpt2-quick-start");
    if (!checkout.has_corpus()) GTEST_SKIP() << "no data/tinyshakespeare.txt: run scripts/setup.sh";
    const std::vector<std::string> commands = bash_block_after("## Quick start");
    ASSERT_GE(commands.size(), 6u);
    const std::string checkpoint = "model_" +
                                   std::string(6 - std::to_string(kShortRun).size(), '0') +
                                   std::to_string(kShortRun) + ".bin";
    bool skipped_llama = false;
    for (const std::string& command : commands) {
        // Setup and the suite are what the test runs in (and under): not run again here.
        if (program_of(command) == "scripts/setup.sh" || program_of(command) == "ctest") continue;
        if (command.find("llama_generate") != std::string::npos && !llama_cpp_installed()) {
            skipped_llama = true;
            continue;
        }
        const auto result = checkout.run(shortened(command));
        ASSERT_EQ(result.exit_code, 0) << shortened(command) << "\n" << result.output;
        if (command.starts_with("build/inference") ||
            command.find("llama_generate") != std::string::npos) {
            EXPECT_NE(result.output.find("ROMEO:"), std::string::npos)
                << command << " printed no text after its prompt:\n"
                << result.output;
        }
        if (command.starts_with("scripts/mpirun.sh")) {  // as root too: the script allows it
            EXPECT_NE(result.output.find("ranks x workers 2 x 1"), std::string::npos)
                << result.output;
        }
    }
    EXPECT_TRUE(fs::exists(checkout.path() / "out" / checkpoint));
    EXPECT_TRUE(fs::exists(checkout.path() / "out-2" / checkpoint));
    EXPECT_TRUE(fs::exists(checkout.path() / "tiny.gguf"));
    if (skipped_llama) {
        GTEST_SKIP() << "llama.cpp is not installed (GPT2_WITH_LLAMA_CPP=1 scripts/setup.sh): "
                        "its command was not run";
    }
}

TEST(QuickStart, TheProgramsTableExamplesRunAsWrittenInOrder) {
    const test::Checkout checkout("gpt2-programs-table");
    if (!checkout.has_corpus()) GTEST_SKIP() << "no data/tinyshakespeare.txt: run scripts/setup.sh";
    if (!fs::exists(checkout.path() / "data" / "gpt2" / "encoder.json")) {
        GTEST_SKIP() << "no data/gpt2 (GPT-2's tokenizer files): run scripts/setup.sh";
    }
    const std::vector<std::string> commands = program_table_examples();
    ASSERT_EQ(commands.size(), 4u);
    for (const std::string& command : commands) {
        const auto result = checkout.run(shortened(command, kShortTableRun));
        ASSERT_EQ(result.exit_code, 0) << shortened(command, kShortTableRun) << "\n"
                                       << result.output;
    }
}

}  // namespace
}  // namespace gpt2
