// Inputs the fuzzers found (tests/fuzz/regressions), replayed in the ordinary suite: each must be
// refused with a clear InputError or usage error, quickly and without a crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "apps/train_gpt2/options.hpp"
#include "core/error.hpp"
#include "formats/checkpoint.hpp"
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

}  // namespace
}  // namespace gpt2
