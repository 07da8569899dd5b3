// Inputs the fuzzers found (tests/fuzz/regressions), replayed in the ordinary suite: each must be
// refused with a clear InputError or usage error, quickly and without a crash.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "gpt2/checkpoint.hpp"
#include "gpt2/error.hpp"
#include "gpt2/tokenizer.hpp"
#include "gpt2/train_options.hpp"

namespace gpt2 {
namespace {

const std::string kRegressions = std::string(GPT2_SOURCE_DIR) + "/tests/fuzz/regressions/";

TEST(FuzzRegressions, BpeMergesThatDoubleTokenLengthsAreRefusedQuickly) {
    const auto start = std::chrono::steady_clock::now();
    const std::vector<std::uint8_t> bytes =
        read_file_bytes(kRegressions + "tokenizer/oom-bpe-doubling-merges.bin");
    EXPECT_THROW((void)deserialize_tokenizer(bytes), InputError);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
}

TEST(FuzzRegressions, CheckpointCarryingSuchATokenizerLoadsButItsTokenizerIsRefused) {
    const LoadedModel loaded =
        load_checkpoint(kRegressions + "checkpoint/oom-bpe-doubling-merges-in-trailer.bin");
    ASSERT_TRUE(loaded.extras.has_value());
    EXPECT_THROW((void)deserialize_tokenizer(loaded.extras->tokenizer), InputError);
}

TEST(FuzzRegressions, ConfigFileWithAnEmptyArrayIsAUsageError) {
    for (const char* name :
         {"crash-empty-array.toml", "crash-7953b6d9f67b727957b45d948ad5d551fb9a97af"}) {
        std::string program = "train_gpt2", flag = "--config",
                    path = kRegressions + "train_config/" + name;
        char* argv[] = {program.data(), flag.data(), path.data()};
        const auto parsed = parse_train_options(3, argv, false);
        ASSERT_TRUE(std::holds_alternative<int>(parsed)) << name;
        EXPECT_EQ(std::get<int>(parsed), 2) << name;
    }
}

}  // namespace
}  // namespace gpt2
