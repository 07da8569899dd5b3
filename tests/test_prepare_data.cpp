// build/prepare_data as a user runs it: shards equal to tiktoken's ids in both end-of-text modes,
// --data (and the older --input), files written atomically (a full disk leaves nothing partial),
// and the common command-line voice.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "data/shard.hpp"
#include "process_support.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;
using test::run_command;
using test::ScratchDir;

const fs::path kTestData = GPT2_TEST_DATA_DIR;
const fs::path kGpt2Dir = fs::path(GPT2_SHARED_DATA_DIR) / "gpt2";

std::vector<std::int32_t> read_u16_ids(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::int32_t> ids(bytes.size() / 2);
    for (std::size_t i = 0; i < ids.size(); ++i) {
        ids[i] = static_cast<unsigned char>(bytes[2 * i]) |
                 (static_cast<unsigned char>(bytes[2 * i + 1]) << 8);
    }
    return ids;
}

std::string prepare(const std::string& flags) {
    return test::build_path("prepare_data") + " " + flags;
}

TEST(PrepareData, ShardsEqualTiktokensIdsInBothEndOfTextModes) {
    if (!fs::exists(kGpt2Dir / "encoder.json")) GTEST_SKIP() << "no GPT-2 tokenizer files";
    const ScratchDir dir("gpt2-prepare-eot");
    for (const std::string mode : {"token", "text"}) {
        const auto result = run_command(prepare(
            "--data " + (kTestData / "tokenizer_eot.txt").string() +
            " --tokenizer gpt2 --tokenizer-dir " + kGpt2Dir.string() +
            " --val-fraction 0 --name eot --eot-in-text " + mode + " --out-dir " + (dir / mode)));
        ASSERT_EQ(result.exit_code, 0) << result.output;
        const MappedShard shard(dir.path() / mode / "eot_train_000000.bin");
        const std::vector<std::int32_t> ids(shard.tokens().begin(), shard.tokens().end());
        EXPECT_EQ(ids, read_u16_ids(kTestData / ("tokenizer_gpt2_eot_" + mode + ".u16"))) << mode;
    }
}

TEST(PrepareData, InputIsTheOlderNameOfData) {
    const ScratchDir dir("gpt2-prepare-alias");
    test::write_corpus(dir.path() / "corpus.txt", 20000);
    const std::string common = " --tokenizer char --name c --out-dir ";
    ASSERT_EQ(
        run_command(prepare("--data " + (dir / "corpus.txt") + common + (dir / "a"))).exit_code, 0);
    ASSERT_EQ(
        run_command(prepare("--input " + (dir / "corpus.txt") + common + (dir / "b"))).exit_code,
        0);
    for (const char* file : {"c_train_000000.bin", "c_val_000000.bin", "tokenizer.bin"}) {
        std::ifstream a(dir.path() / "a" / file, std::ios::binary);
        std::ifstream b(dir.path() / "b" / file, std::ios::binary);
        const std::string x((std::istreambuf_iterator<char>(a)), std::istreambuf_iterator<char>());
        const std::string y((std::istreambuf_iterator<char>(b)), std::istreambuf_iterator<char>());
        EXPECT_FALSE(x.empty()) << file;
        EXPECT_EQ(x, y) << file;
    }
}

// The shards fit; GPT-2's tokenizer files (about 1 MB) do not: before, tokenizer.bin was
// written in place and left cut short.
TEST(PrepareData, AFullDiskLeavesNoPartialOrTemporaryFile) {
    if (!fs::exists(kGpt2Dir / "encoder.json")) GTEST_SKIP() << "no GPT-2 tokenizer files";
    const ScratchDir dir("gpt2-prepare-full");
    test::write_corpus(dir.path() / "corpus.txt", 20000);
    const test::TinyFileSystem disk(dir.path() / "out", "256k");
    if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
    const auto result = run_command(
        prepare("--data " + (dir / "corpus.txt") + " --tokenizer gpt2 --tokenizer-dir " +
                kGpt2Dir.string() + " --name c --out-dir " + (dir / "out")));
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_NE(result.output.find("error: cannot write " + (dir / "out/tokenizer.bin")),
              std::string::npos)
        << result.output;
    EXPECT_NE(result.output.find("No space left on device"), std::string::npos) << result.output;
    for (const auto& entry : fs::directory_iterator(dir.path() / "out")) {
        const std::string name = entry.path().filename().string();
        EXPECT_EQ(name.find(".tmp."), std::string::npos) << name;
        EXPECT_NE(name, "tokenizer.bin") << "a partial tokenizer.bin was left";
    }
}

TEST(PrepareData, SpeaksWithTheCommonVoice) {
    const ScratchDir dir("gpt2-prepare-voice");
    const auto version = run_command(prepare("--version"));
    EXPECT_EQ(version.exit_code, 0);
    EXPECT_EQ(version.output.rfind("prepare_data (gpt2-mpi) ", 0), 0u) << version.output;
    const auto bad_flag =
        run_command(prepare("--data x --tokenizer chars --out-dir " + (dir / "o")));
    EXPECT_EQ(bad_flag.exit_code, 2) << bad_flag.output;
    EXPECT_EQ(bad_flag.output.rfind("error: --tokenizer", 0), 0u) << bad_flag.output;
    const auto bad_range =
        run_command(prepare("--data x --tokenizer char --threads 0 --out-dir " + (dir / "o")));
    EXPECT_EQ(bad_range.exit_code, 2) << bad_range.output;
    EXPECT_NE(bad_range.output.find("--threads: must be > 0 (got 0)"), std::string::npos)
        << bad_range.output;
    const auto missing = run_command(
        prepare("--data " + (dir / "missing.txt") + " --tokenizer char --out-dir " + (dir / "o")));
    EXPECT_EQ(missing.exit_code, 1) << missing.output;
    EXPECT_EQ(missing.output.rfind("error: " + (dir / "missing.txt"), 0), 0u) << missing.output;
    const auto help = run_command(prepare("--help"));
    EXPECT_NE(help.output.find("--shard-tokens INT=100000000"), std::string::npos) << help.output;
    EXPECT_NE(help.output.find("--eot-in-text MODE=token"), std::string::npos) << help.output;
    EXPECT_EQ(help.output.find("->"), std::string::npos) << help.output;
}

}  // namespace
}  // namespace gpt2
