// Inputs the fuzzers found (tests/fuzz/regressions), replayed in the ordinary suite: each must be
// refused with a clear InputError or usage error, quickly and without a crash.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "apps/train_gpt2/options.hpp"
#include "core/error.hpp"
#include "formats/checkpoint.hpp"
#include "formats/gguf.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {
namespace {

const std::string kRegressions = std::string(GPT2_SOURCE_DIR) + "/tests/fuzz/regressions/";

// The input once asked for 2^40 bytes; it must be refused by the length bound (before anything
// that large is built), not by running out of memory.
TEST(FuzzRegressions, BpeMergesThatDoubleTokenLengthsAreRefusedByTheLengthBound) {
    const std::vector<std::uint8_t> bytes =
        read_file_bytes(kRegressions + "tokenizer/oom-bpe-doubling-merges.bin");
    try {
        (void)deserialize_tokenizer(bytes);
        ADD_FAILURE() << "the tokenizer was accepted";
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("implausibly long"), std::string::npos) << e.what();
    }
}

TEST(FuzzRegressions, CheckpointCarryingSuchATokenizerLoadsButItsTokenizerIsRefused) {
    const LoadedModel loaded =
        load_checkpoint(kRegressions + "checkpoint/oom-bpe-doubling-merges-in-trailer.bin");
    ASSERT_TRUE(loaded.extras.has_value());
    EXPECT_THROW((void)deserialize_tokenizer(loaded.extras->tokenizer), InputError);
}

// Every saved config input (an empty array crashed CLI11; a preset with n-head = 0 divided by
// zero in validation) is now a usage error, a validation error, or simply valid.
TEST(FuzzRegressions, SavedConfigFilesAreRefusedCleanly) {
    int files = 0;
    for (const auto& entry : std::filesystem::directory_iterator(kRegressions + "train_config")) {
        ++files;
        std::string program = "train_gpt2", flag = "--config", path = entry.path().string();
        char* argv[] = {program.data(), flag.data(), path.data()};
        const auto parsed = parse_train_options(3, argv, false);
        if (const int* code = std::get_if<int>(&parsed)) {
            EXPECT_EQ(*code, 2) << path;
        } else {
            // Valid, or refused with a clear error: never a crash or another exception.
            try {
                validate_train_options(std::get<TrainOptions>(parsed), 1);
            } catch (const InputError&) {
            }
        }
    }
    EXPECT_GE(files, 3);
}

// A GGUF whose general.name is not UTF-8 threw nlohmann's type_error out of the reader when it
// recorded where the model came from: the name is kept with the bad bytes replaced.
TEST(FuzzRegressions, AGgufNameThatIsNotUtf8IsKeptReplaced) {
    const LoadedModel loaded = load_gguf_model(kRegressions + "gguf/general-name-not-utf8.gguf");
    ASSERT_TRUE(loaded.extras.has_value());
    const auto config = nlohmann::json::parse(loaded.extras->config_json);
    EXPECT_NE(config.at("general.name").get<std::string>().find("\xEF\xBF\xBD"), std::string::npos)
        << loaded.extras->config_json;
}

// An embedding length near 10^9 overflowed int in the message refusing its feed_forward_length.
TEST(FuzzRegressions, AGgufFeedForwardLengthIsRefusedWithoutOverflow) {
    try {
        (void)load_gguf_model(kRegressions + "gguf/feed-forward-message-overflow.gguf");
        ADD_FAILURE() << "the file was accepted";
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("feed_forward_length"), std::string::npos) << e.what();
    }
}

// dev/fuzz.sh (CI) fuzzes each target from a copy of tests/fuzz/corpus/NAME/ and stops at a
// missing one: every fuzz_NAME.cpp needs its seeds committed (build-fuzz/fuzz/make_seeds writes
// them) and its name in the script's target list, or CI fails only after its half-hour run.
TEST(FuzzRegressions, EveryFuzzTargetHasSeedsAndIsFuzzedByTheScript) {
    const std::filesystem::path source_dir(GPT2_SOURCE_DIR);
    std::ifstream script_file(source_dir / "dev/fuzz.sh");
    ASSERT_TRUE(script_file) << "dev/fuzz.sh";
    std::stringstream script;
    script << script_file.rdbuf();
    const std::string script_text = script.str();
    const std::string list_start = "targets=${FUZZ_TARGETS:-\"";
    const auto start = script_text.find(list_start);
    ASSERT_NE(start, std::string::npos) << "dev/fuzz.sh no longer lists its targets as expected";
    const auto end = script_text.find('"', start + list_start.size());
    std::istringstream names(
        script_text.substr(start + list_start.size(), end - start - list_start.size()));
    std::set<std::string> scripted;
    for (std::string name; names >> name;)
        scripted.insert(name);

    int targets = 0;
    for (const auto& entry : std::filesystem::directory_iterator(source_dir / "tests/fuzz")) {
        const std::string file = entry.path().filename().string();
        if (!file.starts_with("fuzz_") || entry.path().extension() != ".cpp") continue;
        ++targets;
        const std::string name = file.substr(5, file.size() - 5 - 4);
        EXPECT_TRUE(scripted.contains(name)) << name << " is missing from dev/fuzz.sh's targets";
        const std::filesystem::path corpus = source_dir / "tests/fuzz/corpus" / name;
        EXPECT_TRUE(std::filesystem::is_directory(corpus) && !std::filesystem::is_empty(corpus))
            << corpus << " holds no seeds: run build-fuzz/fuzz/make_seeds tests/fuzz/corpus";
    }
    EXPECT_GE(targets, 13);
    EXPECT_EQ(scripted.size(), static_cast<std::size_t>(targets));
}

}  // namespace
}  // namespace gpt2
