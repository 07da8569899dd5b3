// The layers of src/ include only what they may use: each folder a layer, a layer only what its
// library links in CMakeLists.txt (the rules' one source, build/layer_rules.txt), mpi.h only in
// the communicator, CLI11 only in the programs, no logging below the run loop; docs/design.md's
// table says the same. (What must never be linked is checked when CMake configures.)
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

// Which layers each layer may include besides its own: what its library links, as CMake derives
// it into build/layer_rules.txt ("layer: used layers"); the programs (apps) may use every layer.
using LayerRules = std::map<std::string, std::set<std::string>>;
LayerRules load_layer_rules() {
    LayerRules rules;
    std::istringstream lines(read_text_file(fs::path(GPT2_BUILD_DIR) / "layer_rules.txt"));
    for (std::string line; std::getline(lines, line);) {
        const std::size_t colon = line.find(':');
        if (colon == std::string::npos) continue;
        std::set<std::string>& uses = rules[line.substr(0, colon)];
        std::istringstream words(line.substr(colon + 1));
        for (std::string word; words >> word;)
            uses.insert(word);
    }
    std::set<std::string>& apps = rules["apps"];
    for (const auto& [layer, uses] : rules)
        if (layer != "apps") apps.insert(layer);
    return rules;
}
const LayerRules& may_use() {
    static const LayerRules rules = load_layer_rules();
    return rules;
}

// Everything wrong with one file's includes (`relative` is its path below src/).
std::vector<std::string> violations(const std::string& relative, const std::string& text) {
    std::vector<std::string> found;
    const std::string layer = layer_of(relative);
    const auto allowed = may_use().find(layer);
    if (allowed == may_use().end()) return {relative + ": in no known layer"};
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

TEST(Architecture, TheRulesAreCMakesLinksAndDesignMdsTableSaysTheSame) {
    const LayerRules& rules = may_use();
    EXPECT_EQ(rules.at("model"), (std::set<std::string>{"core", "ops", "threads"}));
    EXPECT_EQ(rules.at("core"), std::set<std::string>{});
    // docs/design.md's table: each library's "may use" column names exactly the layers it may
    // use (besides libraries outside src/).
    const std::string design = read_text_file(fs::path(GPT2_SOURCE_DIR) / "docs" / "design.md");
    static const std::regex row(R"(^\| `([a-z/]+)/` \| gpt2_[a-z_]+ \|.*\| ([^|]+) \|$)");
    std::istringstream lines(design);
    int rows = 0;
    for (std::string line; std::getline(lines, line);) {
        std::smatch match;
        if (!std::regex_match(line, match, row)) continue;
        ++rows;
        const std::string layer = match[1].str() == "apps/cli" ? "cli" : match[1].str();
        std::set<std::string> named;
        std::istringstream words(match[2].str());
        for (std::string word; std::getline(words, word, ',');) {
            word.erase(0, word.find_first_not_of(' '));
            word.erase(word.find_last_not_of(' ') + 1);
            if (rules.contains(word)) named.insert(word);
        }
        ASSERT_TRUE(rules.contains(layer)) << line;
        EXPECT_EQ(named, rules.at(layer)) << "docs/design.md's row for " << layer;
    }
    EXPECT_EQ(rows, static_cast<int>(rules.size()) - 1);  // every library's row (apps are not one)
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
