// The scripts users run: plot_metrics.py reads train_gpt2's metrics files (runs marked, the last
// one plotted by default, one clear error for anything else), and setup.sh installs only what is
// missing, judging Node and Python modules by the commands and modules present.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "process_support.hpp"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;
using test::run_command;
using test::ScratchDir;

const std::string kSource = GPT2_SOURCE_DIR;

std::string plot(const std::string& args) {
    return "/usr/bin/python3 " + kSource + "/scripts/plot_metrics.py " + args;
}

TEST(PlotMetrics, ANonJsonLinesFileIsOneClearErrorWithItsLine) {
    if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
    const ScratchDir dir("gpt2-plot-bad");
    std::ofstream(dir.path() / "log.txt") << "{\"type\": \"train\", \"step\": 1, \"loss\": 2}\n"
                                          << "[12:00:00] step 2/600 | loss 1.9\n";
    const auto result = run_command(plot(dir / "log.txt"));
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_NE(result.output.find("plot_metrics: " + (dir / "log.txt") + ":2: not a JSON object"),
              std::string::npos)
        << result.output;
    EXPECT_EQ(result.output.find("Traceback"), std::string::npos) << result.output;
    const auto missing = run_command(plot(dir / "missing.jsonl"));
    EXPECT_EQ(missing.exit_code, 1) << missing.output;
    EXPECT_EQ(missing.output.find("Traceback"), std::string::npos) << missing.output;
}

TEST(PlotMetrics, TheLastRunIsPlottedUnlessAllRunsAreAskedFor) {
    if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
    // A real file: a run stopped at step 2, then resumed to step 4.
    const ScratchDir dir("gpt2-plot-runs");
    test::write_corpus(dir.path() / "corpus.txt", 30000);
    const std::string train = test::build_path("train_gpt2") +
                              " --n-layer 1 --n-head 2 --n-embd 16 --seq-len 16 --batch-size 2"
                              " --val-every 2 --sample-every 0 --data " +
                              (dir / "corpus.txt") + " --out-dir " + (dir / "out") +
                              " --metrics-file " + (dir / "m.jsonl");
    ASSERT_EQ(run_command(train + " --max-steps 10 --stop-at-step 2").exit_code, 0);
    ASSERT_EQ(run_command(train + " --max-steps 4 --resume auto").exit_code, 0);
    const auto last = run_command(plot(dir / "m.jsonl") + " --summary");
    ASSERT_EQ(last.exit_code, 0) << last.output;
    EXPECT_NE(last.output.find("run 1: steps 1-2"), std::string::npos) << last.output;
    EXPECT_NE(last.output.find("run 2: steps 3-4"), std::string::npos) << last.output;
    EXPECT_NE(last.output.find("plotted: run 2\n"), std::string::npos) << last.output;
    const auto all = run_command(plot(dir / "m.jsonl") + " --summary --all-runs");
    EXPECT_NE(all.output.find("plotted: run 1, run 2"), std::string::npos) << all.output;
    if (run_command("/usr/bin/python3 -c 'import matplotlib'").exit_code != 0) {
        GTEST_SKIP() << "no matplotlib for /usr/bin/python3: the plot itself is not drawn";
    }
    const auto png = run_command(plot(dir / "m.jsonl") + " -o " + (dir / "m.png"));
    EXPECT_EQ(png.exit_code, 0) << png.output;
    EXPECT_GT(fs::file_size(dir.path() / "m.png"), 1000u);
}

// Node from elsewhere (nodesource, nvm) conflicts with Debian's npm package: setup.sh must look
// for the commands, not the packages.
TEST(Setup, NodeAndNpmAreJudgedByTheCommandsPresent) {
    const ScratchDir dir("gpt2-setup-node");
    // A PATH with only what setup.sh needs before it installs anything, plus fake node/npm.
    fs::create_directories(dir.path() / "bin");
    for (const char* tool : {"dirname", "dpkg-query", "grep"}) {
        const auto found = run_command(std::string("command -v ") + tool);
        ASSERT_EQ(found.exit_code, 0) << tool;
        fs::create_symlink(found.output.substr(0, found.output.find('\n')),
                           dir.path() / "bin" / tool);
    }
    const std::string run = "env GPT2_WITH_PYTHON=1 GPT2_SETUP_DRY_RUN=1 PATH=" + (dir / "bin") +
                            " /bin/bash " + kSource + "/scripts/setup.sh";
    const auto without = run_command(run);
    ASSERT_EQ(without.exit_code, 0) << without.output;
    // Without the commands, the Debian packages are wanted (unless dpkg already has them).
    for (const std::string package : {"nodejs", "npm"}) {
        const bool installed = run_command("dpkg-query -W -f='${Status}' " + package +
                                           " 2>/dev/null | grep -q 'ok installed'")
                                   .exit_code == 0;
        EXPECT_EQ(without.output.find(" " + package) != std::string::npos, !installed)
            << package << "\n"
            << without.output;
    }
    for (const char* tool : {"node", "npm"}) {
        std::ofstream(dir.path() / "bin" / tool) << "#!/bin/sh\nexit 0\n";
        fs::permissions(dir.path() / "bin" / tool, fs::perms::owner_all);
    }
    const auto with = run_command(run);
    ASSERT_EQ(with.exit_code, 0) << with.output;
    EXPECT_EQ(with.output.find(" nodejs"), std::string::npos) << with.output;
    EXPECT_EQ(with.output.find(" npm"), std::string::npos) << with.output;
}

}  // namespace
}  // namespace gpt2
