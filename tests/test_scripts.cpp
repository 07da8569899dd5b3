// The scripts users run: plot_metrics.py reads train_gpt2's metrics files (runs marked, the last
// run's whole curve with the starts it resumed plotted by default, one clear error for anything
// else), and setup.sh installs only what is missing, judging Node and Python modules by the
// commands and modules present.
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

// The default plot is the last run's whole training curve: its start and the starts it resumed
// (the same run id, skipping an unrelated run in the same file), each cut where the next resumed,
// so that steps done again after a crash appear once; --last-segment plots the last start only,
// --all-runs every start.
TEST(PlotMetrics, TheLastRunsWholeCurveIsPlottedWithTheStartsItResumed) {
    if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
    const ScratchDir dir("gpt2-plot-runs");
    test::write_corpus(dir.path() / "corpus.txt", 30000);
    const std::string train = test::build_path("train_gpt2") +
                              " --n-layer 1 --n-head 2 --n-embd 16 --seq-len 16 --batch-size 2"
                              " --val-every 2 --val-tokens 64 --sample-every 0 --max-steps 6"
                              " --checkpoint-every 2 --data " +
                              (dir / "corpus.txt") + " --metrics-file " + (dir / "m.jsonl") +
                              " --out-dir ";
    // Run 1 fails at step 4 (a NaN gradient, --max-bad-steps 1) after its checkpoint at step 2
    // and its step 3; run 2 is another run in the same file; run 3 resumes run 1 from step 2.
    const auto crashed =
        run_command(train + (dir / "a") + " --inject-nan-step 3 --max-bad-steps 1");
    ASSERT_EQ(crashed.exit_code, 1) << crashed.output;
    ASSERT_EQ(run_command(train + (dir / "b") + " --max-steps 2").exit_code, 0);
    ASSERT_EQ(run_command(train + (dir / "a") + " --resume auto").exit_code, 0);
    const auto whole = run_command(plot(dir / "m.jsonl") + " --summary");
    ASSERT_EQ(whole.exit_code, 0) << whole.output;
    EXPECT_NE(whole.output.find("run 1: steps 1-3, 2 validations"), std::string::npos)
        << whole.output;
    EXPECT_NE(whole.output.find("run 2: steps 1-2"), std::string::npos) << whole.output;
    EXPECT_NE(whole.output.find("run 3: steps 3-6, 2 validations"), std::string::npos)
        << whole.output;
    EXPECT_NE(whole.output.find("at step 2 (resumed)"), std::string::npos) << whole.output;
    EXPECT_NE(whole.output.find("plotted: run 1, run 3\n"
                                "curve: steps 1-6, 6 train records, 4 validations\n"),
              std::string::npos)
        << whole.output;
    const auto last = run_command(plot(dir / "m.jsonl") + " --summary --last-segment");
    EXPECT_NE(last.output.find("plotted: run 3\ncurve: steps 3-6, 4 train records"),
              std::string::npos)
        << last.output;
    const auto all = run_command(plot(dir / "m.jsonl") + " --summary --all-runs");
    EXPECT_NE(all.output.find("plotted: run 1, run 2, run 3\n"), std::string::npos) << all.output;

    // Files of older versions have no run ids: a resumed start continues the one before it.
    std::ofstream(dir.path() / "old.jsonl") << R"({"type": "run", "start_step": 0, "resumed": false}
{"type": "train", "step": 1, "loss": 3.0}
{"type": "run", "start_step": 0, "resumed": false}
{"type": "train", "step": 1, "loss": 3.1}
{"type": "train", "step": 2, "loss": 3.0}
{"type": "run", "start_step": 2, "resumed": true}
{"type": "train", "step": 3, "loss": 2.9}
)";
    const auto old = run_command(plot(dir / "old.jsonl") + " --summary");
    EXPECT_NE(old.output.find("plotted: run 2, run 3\ncurve: steps 1-3, 3 train records"),
              std::string::npos)
        << old.output;

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
