// README.md and docs/ are the user's manual: every flag the programs accept is documented in them,
// every flag they name exists, and the example output they show has the shape of what the
// programs print today (numbers, sizes and machine-dependent names aside).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "checkout_support.hpp"
#include "core/file_io.hpp"
#include "process_support.hpp"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;
using test::run_command;

std::string readme() {
    return read_text_file(fs::path(GPT2_SOURCE_DIR) / "README.md");
}

// README.md and every page of docs/, in name order.
std::string manual() {
    std::vector<fs::path> pages;
    for (const auto& entry : fs::directory_iterator(fs::path(GPT2_SOURCE_DIR) / "docs")) {
        if (entry.path().extension() == ".md") pages.push_back(entry.path());
    }
    std::sort(pages.begin(), pages.end());
    std::string text = readme();
    for (const fs::path& page : pages)
        text += "\n" + read_text_file(page);
    return text;
}

std::set<std::string> long_flags(const std::string& text) {
    static const std::regex flag(R"((^|[^A-Za-z0-9-])(--[a-z][a-z0-9]*(-[a-z0-9]+)*))");
    std::set<std::string> flags;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), flag);
         it != std::sregex_iterator(); ++it) {
        flags.insert((*it)[2].str());
    }
    return flags;
}

const std::vector<std::string> kPrograms = {"train_gpt2", "inference", "prepare_data",
                                            "convert_model", "serve"};

TEST(Readme, DocumentsEveryFlagOfEveryProgram) {
    const std::set<std::string> documented = long_flags(manual());
    for (const std::string& program : kPrograms) {
        const auto help = run_command(test::build_path(program) + " --help");
        ASSERT_EQ(help.exit_code, 0) << program;
        for (const std::string& flag : long_flags(help.output)) {
            EXPECT_TRUE(documented.count(flag) > 0)
                << program << " " << flag << " is not mentioned in README.md or docs/";
        }
    }
}

TEST(Readme, NamesNoFlagThatDoesNotExist) {
    std::set<std::string> real;
    for (const std::string& program : kPrograms) {
        const auto help = run_command(test::build_path(program) + " --help");
        for (const std::string& flag : long_flags(help.output))
            real.insert(flag);
    }
    // The benchmark programs' flags (docs/development.md shows them).
    for (const char* bench : {"bench_prefill", "bench_gemm"}) {
        const auto help = run_command(test::build_path(bench) + " --help");
        for (const std::string& flag : long_flags(help.output))
            real.insert(flag);
    }
    // The shell scripts' own flags: the `--flag)` cases of their argument loops.
    std::vector<fs::path> scripts;
    for (const char* folder : {"/scripts", "/dev"}) {
        for (const auto& entry : fs::directory_iterator(std::string(GPT2_SOURCE_DIR) + folder))
            scripts.push_back(entry.path());
    }
    // The Python scripts' flags: their argparse add_argument("--flag", ...) calls.
    for (const fs::path& script : scripts) {
        if (script.extension() != ".sh" && script.extension() != ".py") continue;
        const std::string text = read_text_file(script);
        const std::regex option(script.extension() == ".sh"
                                    ? R"((--[a-z][a-z0-9-]*)\))"
                                    : R"re(add_argument\(\s*"(--[a-z][a-z0-9-]*)")re");
        for (auto it = std::sregex_iterator(text.begin(), text.end(), option);
             it != std::sregex_iterator(); ++it)
            real.insert((*it)[1].str());
    }
    // Flags of other tools the README shows (mpirun, Slurm, ctest, cmake, scripts).
    const std::set<std::string> others = {"--allow-run-as-root",
                                          "--oversubscribe",
                                          "--hostfile",
                                          "--map-by",
                                          "--bind-to",
                                          "--mca",
                                          "--nodes",
                                          "--ntasks-per-node",
                                          "--cpus-per-task",
                                          "--test-dir",
                                          "--output-on-failure",
                                          "--signal",
                                          "--mpi",
                                          "--repeats",
                                          "--configs",
                                          "--all-runs",
                                          "--last-segment",
                                          "--prefix",
                                          "--install",
                                          "--build",
                                          "--batch",
                                          "--summary",
                                          "--ignore-eos",  // llama-cli's, for a char model
                                          "--max-step"};   // an example of a mistyped flag
    for (const std::string& flag : long_flags(manual())) {
        EXPECT_TRUE(real.count(flag) > 0 || others.count(flag) > 0)
            << "README.md or docs/ names " << flag << ", which no program accepts";
    }
}

// A log line reduced to its words: any token holding a digit becomes '#', sizes' units one word,
// the GEMM kernel name (machine-dependent) '*'.
std::string shape(const std::string& line) {
    std::istringstream in(line);
    std::string out, token, previous;
    while (in >> token) {
        std::string word = token;
        if (std::any_of(token.begin(), token.end(), [](char c) { return std::isdigit(c); })) {
            word = "#";
        } else if (token == "KiB" || token == "MiB" || token == "GiB" || token == "KiB)" ||
                   token == "MiB)" || token == "GiB)") {
            word = "UNIT";
        } else if (previous == "kernels") {
            word = "*";
        }
        out += word + " ";
        previous = token;
    }
    return out;
}

TEST(Readme, TheDefaultRunsExampleOutputHasTheShapeOfTheRealOutput) {
    // The README's example of the default run, as the program prints it today, on a small corpus
    // at the same relative paths; 130 steps, so that the last step lines carry z-scores; 2,048
    // tokens a step, so that --optimizer auto takes Muon as on the default run.
    const std::string manual = readme();
    const auto begin = manual.find("It prints (abridged):");
    ASSERT_NE(begin, std::string::npos);
    const auto block = manual.find("```\n", begin) + 4;
    const auto end = manual.find("```", block);
    const std::string example = manual.substr(block, end - block);

    test::ScratchDir dir("gpt2-readme");
    fs::create_directories(dir.path() / "data");
    test::write_corpus(dir.path() / "data" / "tinyshakespeare.txt", 40000);
    const auto run =
        run_command("cd " + dir.path().string() + " && " + test::build_path("train_gpt2") +
                    " --max-steps 130 --val-every 65 --sample-every 130 "
                    "--max-new-tokens 16 --batch-size 128 --seq-len 16");
    ASSERT_EQ(run.exit_code, 0) << run.output;
    std::set<std::string> actual;
    std::istringstream lines(run.output);
    for (std::string line; std::getline(lines, line);) {
        if (line.starts_with("[")) actual.insert(shape(line.substr(line.find(']') + 1)));
    }
    std::istringstream examples(example);
    int checked = 0;
    for (std::string line; std::getline(examples, line);) {
        if (!line.starts_with("[")) continue;  // sample text, "..."
        ++checked;
        EXPECT_TRUE(actual.count(shape(line.substr(line.find(']') + 1))) > 0)
            << "README line not printed in this shape today:\n"
            << line << "\nactual output:\n"
            << run.output;
    }
    EXPECT_GE(checked, 10);
}

TEST(Readme, TheStepLineExampleHasTheShapeOfTheRealOne) {
    const std::string manual = ::gpt2::manual();
    const std::regex example_line(R"(\n(\[\d\d:\d\d:\d\d\] step 120/600 \|[^\n]*))");
    std::smatch match;
    ASSERT_TRUE(std::regex_search(manual, match, example_line));
    test::ScratchDir dir("gpt2-readme-step");
    test::write_corpus(dir.path() / "corpus.txt", 30000);
    const auto run = run_command(test::build_path("train_gpt2") +
                                 " --n-layer 1 --n-embd 16 --n-head 2 --seq-len 16 "
                                 "--batch-size 2 --max-steps 1 --val-every 0 --sample-every 0 "
                                 "--data " +
                                 (dir / "corpus.txt") + " --out-dir " + (dir / "out"));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const auto at = run.output.find("] step 1/1 | loss");
    ASSERT_NE(at, std::string::npos) << run.output;
    const std::string real = run.output.substr(at + 1, run.output.find('\n', at) - at - 1);
    const std::string documented = match[1].str();
    EXPECT_EQ(shape(documented.substr(documented.find(']') + 1)), shape(real)) << real;
}

// An example of a command and what it prints, as the manual shows them in a code block:
// "$ COMMAND" and the lines after it.
struct ShownCommand {
    std::string command;
    std::vector<std::string> output;
};

std::vector<ShownCommand> shown_commands(const std::string& text) {
    std::vector<ShownCommand> shown;
    std::istringstream lines(text);
    bool in_block = false;
    for (std::string line; std::getline(lines, line);) {
        const std::string trimmed = line.substr(std::min(line.find_first_not_of(' '), line.size()));
        if (trimmed.starts_with("```")) {
            in_block = !in_block;
            continue;
        }
        if (!in_block) continue;
        if (trimmed.starts_with("$ ")) {
            shown.push_back({trimmed.substr(2), {}});
        } else if (!shown.empty() && !trimmed.empty()) {
            shown.back().output.push_back(trimmed);
        }
    }
    return shown;
}

// Every error the manual quotes after a command ("$ build/... " then "error: ...") is the line
// the program prints today, run as shown in a checkout where the quick start's run is in out/.
TEST(Readme, QuotedErrorsAreWhatTheCommandsPrintToday) {
    const test::Checkout checkout("gpt2-readme-errors");
    if (!checkout.has_corpus()) GTEST_SKIP() << "no data/tinyshakespeare.txt: run scripts/setup.sh";
    // The quick start's checkpoint, shortened: the default model, saved as its step 600.
    const auto trained = checkout.run(
        "build/train_gpt2 --max-steps 2 --batch-size 4 --val-tokens 256 --out-dir out && "
        "mv out/model_000002.bin out/model_000600.bin && "
        "mv out/state_000002.bin out/state_000600.bin");
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
    int checked = 0;
    for (const ShownCommand& shown : shown_commands(manual())) {
        const auto error =
            std::find_if(shown.output.begin(), shown.output.end(),
                         [](const std::string& l) { return l.starts_with("error:"); });
        if (error == shown.output.end()) continue;
        ++checked;
        const auto result = checkout.run(shown.command);
        EXPECT_NE(result.exit_code, 0) << shown.command;
        std::string printed;
        std::istringstream lines(result.output);
        for (std::string line; std::getline(lines, line);) {
            if (line.starts_with("error")) {
                printed = line;
                break;
            }
        }
        EXPECT_EQ(printed, *error) << "$ " << shown.command << "\n" << result.output;
    }
    EXPECT_GE(checked, 5);
}

// The lines of the manual's code blocks (fenced with ```), a command's "$ " taken off.
std::vector<std::string> code_lines(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream lines(text);
    bool in_block = false;
    for (std::string line; std::getline(lines, line);) {
        const std::string trimmed = line.substr(std::min(line.find_first_not_of(' '), line.size()));
        if (trimmed.starts_with("```")) {
            in_block = !in_block;
            continue;
        }
        if (in_block) out.push_back(trimmed.starts_with("$ ") ? trimmed.substr(2) : trimmed);
    }
    return out;
}

// Whatever the manual's commands write into a checkout (run directories, shards, conversions,
// metrics, plots) is ignored by git, so that following the docs leaves `git status` clean.
TEST(Readme, EveryPathTheManualsCommandsWriteIsIgnoredByGit) {
    const std::string source = GPT2_SOURCE_DIR;
    if (run_command("git -C " + source + " rev-parse --git-dir").exit_code != 0) {
        GTEST_SKIP() << source << " is not a git checkout";
    }
    // The paths after the flags and words that name an output, and convert_model's OUT.
    static const std::regex output(
        R"((--out-dir|--out|--metrics-file|-o|>|build/convert_model [^ ]+) +([^ ;&|`]+))");
    std::set<std::string> written;
    for (const std::string& line : code_lines(manual())) {
        if (!line.starts_with("build/") && !line.starts_with("scripts/") &&
            !line.starts_with("/usr/bin/python3") && !line.starts_with("dev/")) {
            continue;
        }
        for (auto it = std::sregex_iterator(line.begin(), line.end(), output);
             it != std::sregex_iterator(); ++it) {
            std::string path = (*it)[2].str();
            if (path.front() == '\'' || path.front() == '"') path = path.substr(1);
            // Placeholders (DIR, OUT, F), absolute paths, devices and variables are no paths.
            const bool placeholder = std::all_of(path.begin(), path.end(), [](char c) {
                return std::isupper(static_cast<unsigned char>(c));
            });
            if (path.empty() || placeholder || path.starts_with("/") || path.starts_with("$") ||
                path.starts_with("-") || path.starts_with("&")) {
                continue;
            }
            written.insert(path);
        }
    }
    EXPECT_GE(written.size(), 20u);
    for (const std::string& path : written) {
        EXPECT_EQ(run_command("git -C " + source + " check-ignore -q --no-index '" + path + "'")
                      .exit_code,
                  0)
            << path << " is written by a command of the manual but not ignored by .gitignore";
    }
}

}  // namespace
}  // namespace gpt2
