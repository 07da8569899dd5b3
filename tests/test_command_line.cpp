// train_gpt2's command line as a user meets it: config files are strict (anything unknown refused
// with file, line and key), errors are one line with the documented exit code, also under
// mpiexec, and --version and --help say what they should.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "process_support.hpp"
#include "train_run_fixture.hpp"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;
using test::run_command;
using test::ScratchDir;
using test::TrainRun;

// ---- config files ----

struct ConfigCase {
    const char* name;
    const char* text;
    const char* expected;  // in the error
};

class ConfigFile : public TrainRun, public ::testing::WithParamInterface<ConfigCase> {};

TEST_P(ConfigFile, AnythingUnknownIsRefusedWithFileLineAndKey) {
    const ConfigCase& c = GetParam();
    std::ofstream(path("run.toml")) << "max-steps = 2\n" << c.text << "\n";
    const auto result = train("--config " + path("run.toml") + " --out-dir " + path("out"));
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find("--config " + path("run.toml") + ":2"), std::string::npos)
        << result.output;
    EXPECT_NE(result.output.find(c.expected), std::string::npos) << result.output;
    EXPECT_FALSE(fs::exists(path("out"))) << "the run went ahead";
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ConfigFile,
    ::testing::Values(
        ConfigCase{"misspelled", "n-layr = 2", "unknown key 'n-layr' (did you mean 'n-layer'?)"},
        ConfigCase{"section", "[train]", "sections such as [train] are not supported"},
        ConfigCase{"yaml_style", "max-steps: 3", "expected 'flag = value'"},
        ConfigCase{"no_such_flag", "colour = \"blue\"", "unknown key 'colour'"},
        ConfigCase{"array", "lr = [0.1, 0.2]", "arrays and tables are not supported"},
        ConfigCase{"switch_value", "no-shuffle = 3", "no-shuffle is a switch"}),
    [](const ::testing::TestParamInfo<ConfigCase>& info) { return std::string(info.param.name); });

TEST_F(TrainRun, ConfigFilesAcceptUnderscoresAndSayTheyWereApplied) {
    std::ofstream(path("run.toml")) << "# both spellings\nmax_steps = 3\ngrad-accum = 2\n"
                                       "out_dir = \""
                                    << path("cfg-out")
                                    << "\"\n"
                                       "no_shuffle = true\n";
    const auto result = train("--config " + path("run.toml"));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("config file " + path("run.toml") + " applied"), std::string::npos)
        << result.output;
    EXPECT_NE(result.output.find("step 3/3 |"), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("grad accum 2"), std::string::npos) << result.output;
    EXPECT_TRUE(fs::exists(path("cfg-out/model_000003.bin")));
}

// ---- one voice: exit codes, error lines, version, help ----

TEST_F(TrainRun, AOneRankErrorUnderMpiexecIsOneLineAndExitCodeOne) {
    const auto result = run_command(test::mpiexec(1) + test::build_path("train_gpt2") + " --data " +
                                    path("missing.txt"));
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_EQ(test::count_of(result.output, "error: "), 1u) << result.output;
    EXPECT_NE(result.output.find(path("missing.txt")), std::string::npos) << result.output;
}

TEST_F(TrainRun, ExitCodesErrorLinesAndVersion) {
    const auto version = run_command(test::build_path("train_gpt2") + " --version");
    EXPECT_EQ(version.exit_code, 0);
    EXPECT_TRUE(
        std::regex_search(version.output, std::regex(R"(^train_gpt2 \(gpt2-mpi\) \d+\.\d+\.\d+)")))
        << version.output;
    const auto bad_flag = train("--lr nope --out-dir " + path("out"));
    EXPECT_EQ(bad_flag.exit_code, 2) << bad_flag.output;
    EXPECT_NE(bad_flag.output.find("error: --lr"), std::string::npos) << bad_flag.output;
    const auto bad_range = train("--warmup-steps -3 --out-dir " + path("out"));
    EXPECT_EQ(bad_range.exit_code, 2) << bad_range.output;
    EXPECT_NE(bad_range.output.find("error: --warmup-steps: must be >= 0 (got -3)"),
              std::string::npos)
        << bad_range.output;
    const auto runtime = train("--data " + path("missing.txt") + " --out-dir " + path("out"));
    EXPECT_EQ(runtime.exit_code, 1) << runtime.output;
    EXPECT_NE(runtime.output.find("error: "), std::string::npos) << runtime.output;
    EXPECT_NE(runtime.output.find(path("missing.txt")), std::string::npos) << runtime.output;
    EXPECT_EQ(runtime.output.find("rank"), std::string::npos) << "one rank: no rank in the error";
}

TEST_F(TrainRun, UnderMpiexecAFlagErrorIsPrintedOnce) {
    const auto result = train("--lr nope --out-dir " + path("out"), 2);
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_EQ(test::count_of(result.output, "error: --lr"), 1u) << result.output;
}

TEST(TrainHelp, ShowsDefaultsAndWordsNotInternalMaps) {
    const auto help = run_command(test::build_path("train_gpt2") + " --help");
    EXPECT_EQ(help.exit_code, 0);
    EXPECT_NE(help.output.find("--schedule NAME=cosine"), std::string::npos) << help.output;
    EXPECT_NE(help.output.find("--peak-gflops FLOAT=0"), std::string::npos) << help.output;
    EXPECT_NE(help.output.find("--log-level LEVEL=info"), std::string::npos) << help.output;
    EXPECT_NE(help.output.find("--version"), std::string::npos) << help.output;
    EXPECT_EQ(help.output.find("->"), std::string::npos) << help.output;
    EXPECT_EQ(help.output.find("1.79769e+308"), std::string::npos) << help.output;
}

}  // namespace
}  // namespace gpt2
