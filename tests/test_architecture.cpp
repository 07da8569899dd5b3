// The layers of src/ (see CMakeLists.txt) include only what they may use: each folder a layer,
// a layer only the ones below it, mpi.h only in the communicator, CLI11 only in the programs, no
// logging below the run loop. (The link dependencies are checked when CMake configures.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "core/file_io.hpp"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;

const fs::path kSource = fs::path(GPT2_SOURCE_DIR) / "src";

// The layer a file of src/ belongs to: its folder (apps/cli/ is the cli layer, data/prepare/
// what only prepare_data uses of data).
std::string layer_of(const std::string& relative) {
    if (relative.starts_with("apps/cli/")) return "cli";
    if (relative.starts_with("data/prepare/")) return "data/prepare";
    if (relative.starts_with("apps/")) return "apps";
    return relative.substr(0, relative.find('/'));
}

// Which layers each layer may include (its own always).
const std::map<std::string, std::set<std::string>> kMayUse = {
    {"core", {}},
    {"ops", {"core"}},
    {"threads", {"core"}},
    {"model", {"core", "ops", "threads"}},
    {"tokenizer", {"core"}},
    {"data", {"core", "tokenizer"}},
    {"data/prepare", {"core", "threads", "tokenizer", "data"}},
    {"formats", {"core", "ops", "threads", "model", "tokenizer"}},
    {"parallel", {"core", "ops", "threads", "model"}},
    {"train", {"core", "ops", "threads", "model", "tokenizer", "formats", "data", "parallel"}},
    {"cli", {"core"}},
    {"apps",
     {"core", "ops", "threads", "model", "tokenizer", "formats", "data", "data/prepare", "parallel",
      "train", "cli", "apps"}},
};

// Everything wrong with one file's includes (`relative` is its path below src/).
std::vector<std::string> violations(const std::string& relative, const std::string& text) {
    std::vector<std::string> found;
    const std::string layer = layer_of(relative);
    const auto allowed = kMayUse.find(layer);
    if (allowed == kMayUse.end()) return {relative + ": in no known layer"};
    static const std::regex include(R"(^\s*#\s*include\s*[<"]([^>"]+)[>"])");
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
        std::smatch match;
        if (!std::regex_search(line, match, include)) continue;
        const std::string header = match[1].str();
        if (header == "mpi.h" && relative != "parallel/comm.cpp") {
            found.push_back(relative + " includes mpi.h (only parallel/comm.cpp may)");
        }
        if (header.starts_with("CLI/") && layer != "apps" && layer != "cli") {
            found.push_back(relative + " includes " + header + " (CLI11 is for the programs)");
        }
        if (header.starts_with("spdlog/") && layer != "train" && layer != "apps" &&
            layer != "cli") {
            found.push_back(relative + " includes " + header + " (layers below train do not log)");
        }
        if (!fs::exists(kSource / header)) continue;  // a system or library header
        const std::string used = layer_of(header);
        if (used != layer && allowed->second.count(used) == 0) {
            found.push_back(relative + " (" + layer + ") includes " + header + " (" + used + ")");
        }
    }
    return found;
}

TEST(Architecture, TheCheckerCatchesViolations) {
    EXPECT_EQ(violations("model/x.cpp", "#include \"parallel/comm.hpp\"\n").size(), 1u);
    EXPECT_EQ(violations("ops/x.cpp", std::string("#include <") + "mpi.h>\n").size(), 1u);
    EXPECT_EQ(violations("core/x.cpp", "#include <CLI/CLI.hpp>\n").size(), 1u);
    EXPECT_EQ(violations("tokenizer/x.cpp", "#include <spdlog/spdlog.h>\n").size(), 1u);
    EXPECT_TRUE(violations("model/x.cpp", "#include \"threads/thread_pool.hpp\"\n").empty());
    EXPECT_TRUE(violations("train/x.cpp", "#include \"parallel/comm.hpp\"\n").empty());
    EXPECT_EQ(violations("train/x.cpp", "#include \"data/prepare/shard_writer.hpp\"\n").size(), 1u);
    EXPECT_EQ(violations("data/x.cpp", "#include \"data/prepare/shard_writer.hpp\"\n").size(), 1u);
    EXPECT_TRUE(violations("data/prepare/x.cpp", "#include \"data/shard.hpp\"\n").empty());
}

TEST(Architecture, EveryFileIncludesOnlyTheLayersBelowIt) {
    int files = 0;
    for (const auto& entry : fs::recursive_directory_iterator(kSource)) {
        if (!entry.is_regular_file()) continue;
        const std::string extension = entry.path().extension().string();
        if (extension != ".cpp" && extension != ".hpp") continue;
        ++files;
        const std::string text = read_text_file(entry.path());
        for (const std::string& problem :
             violations(fs::relative(entry.path(), kSource).string(), text)) {
            ADD_FAILURE() << problem;
        }
    }
    EXPECT_GT(files, 40);
}

TEST(Architecture, OnlyTheCommunicatorIncludesMpiAnywhereInTheRepository) {
    for (const char* folder : {"src", "tests", "scripts"}) {
        for (const auto& entry :
             fs::recursive_directory_iterator(fs::path(GPT2_SOURCE_DIR) / folder)) {
            if (!entry.is_regular_file()) continue;
            const std::string extension = entry.path().extension().string();
            if (extension != ".cpp" && extension != ".hpp" && extension != ".h") continue;
            const std::string text = read_text_file(entry.path());
            const bool includes_mpi =
                std::regex_search(text, std::regex(R"(#\s*include\s*[<"]mpi\.h[>"])"));
            EXPECT_TRUE(!includes_mpi || entry.path().filename() == "comm.cpp") << entry.path();
        }
    }
}

}  // namespace
}  // namespace gpt2
