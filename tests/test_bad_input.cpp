// Bad input to train_gpt2 under mpiexec -n 2: every case must end with a non-zero exit and a
// message that names the problem, and never hang the other rank (a generous process timeout
// catches a hang; how fast the job ends is not asserted, as CI machines differ in speed).
#include <gtest/gtest.h>

#include <fstream>

#include "data/shard.hpp"
#include "formats/checkpoint.hpp"
#include "process_support.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {
namespace {

using test::run_command;
using test::ScratchDir;

struct BadInput {
    const char* name;
    const char* flags;     // {dir} is replaced by the scratch directory
    const char* expected;  // text the error must contain
};

class BadInputTable : public ::testing::TestWithParam<BadInput> {
  protected:
    static void SetUpTestSuite() {
        dir_ = std::make_unique<ScratchDir>("gpt2-bad-input");
        const ScratchDir& d = *dir_;
        test::write_corpus(d.path() / "corpus.txt", 20000);
        std::ofstream(d.path() / "empty.txt").flush();
        std::filesystem::copy_file(GPT2_TEST_DATA_DIR "/parquet/duckdb_snappy_v1.parquet",
                                   d.path() / "fineweb.txt");
        std::filesystem::copy_file(d.path() / "fineweb.txt", d.path() / "fineweb.parquet");
        std::ofstream(d.path() / "qa.jsonl") << "{\"prompt\": \"2+2?\", \"response\": \"4\"}\n"
                                             << "{\"prompt\": \"3+3?\", \"response\": \"6\"}\n";
        std::ofstream(d.path() / "qa.txt") << "{\"prompt\": \"2+2?\", \"response\": \"4\"}\n";
        std::ofstream(d.path() / "web.jsonl.gz") << "\x1f\x8b compressed";
        std::filesystem::create_directories(d.path() / "a_directory");
        // A checkpoint to damage: train briefly (char tokenizer, L2 C32, block 32).
        const auto r = run_command(test::build_path("train_gpt2") + kSmall + " --data " +
                                   (d / "corpus.txt") + " --max-steps 2 --out-dir " + (d / "good"));
        ASSERT_EQ(r.exit_code, 0) << r.output;
        const auto model = d.path() / "good" / "model_000002.bin";
        std::vector<std::uint8_t> bytes = read_file_bytes(model);
        std::ofstream(d.path() / "truncated.bin", std::ios::binary)
            .write(reinterpret_cast<const char*>(bytes.data()),
                   static_cast<std::streamsize>(bytes.size() / 2));
        bytes[2048] ^= 0x20;
        std::ofstream(d.path() / "flipped.bin", std::ios::binary)
            .write(reinterpret_cast<const char*>(bytes.data()),
                   static_cast<std::streamsize>(bytes.size()));
        // Shards: one with a wrong magic, one with a token beyond the char vocabulary.
        std::filesystem::create_directories(d.path() / "shards");
        write_shard(d.path() / "shards" / "x_train_000000.bin", std::vector<std::int32_t>(500, 3));
        std::filesystem::copy_file(model, d.path() / "shards" / "bad_magic_train.bin");
        const std::vector<std::uint8_t> tokenizer = make_char_tokenizer("abcdefgh")->serialize();
        std::ofstream(d.path() / "shards" / "tokenizer.bin", std::ios::binary)
            .write(reinterpret_cast<const char*>(tokenizer.data()),
                   static_cast<std::streamsize>(tokenizer.size()));
        std::filesystem::create_directories(d.path() / "range");
        std::vector<std::int32_t> tokens(500, 1);
        tokens[77] = 60000;
        write_shard(d.path() / "range" / "x_train_000000.bin", tokens);
        write_shard(d.path() / "range" / "x_val_000000.bin", tokens);
    }
    static void TearDownTestSuite() { dir_.reset(); }

    static inline const std::string kSmall = test::small_model(32) +
                                             " --batch-size 2 --threads 1"
                                             " --val-every 0 --sample-every 0 --checkpoint-every 0";
    static std::unique_ptr<ScratchDir> dir_;
};
std::unique_ptr<ScratchDir> BadInputTable::dir_;

TEST_P(BadInputTable, FailsFastWithAClearMessage) {
    const BadInput& c = GetParam();
    std::string flags = c.flags;
    for (std::size_t at; (at = flags.find("{dir}")) != std::string::npos;) {
        flags.replace(at, 5, dir_->path().string());
    }
    std::string expected = c.expected;
    for (std::size_t at; (at = expected.find("{dir}")) != std::string::npos;) {
        expected.replace(at, 5, dir_->path().string());
    }
    // The case's flags replace the common ones (a flag given twice is refused), and shards replace
    // the text corpus (both at once are refused).
    const std::string data = flags.find("--train-data") == std::string::npos
                                 ? " --data " + (*dir_ / "corpus.txt")
                                 : std::string();
    const std::string command =
        "timeout 120 " + test::mpiexec(2) + test::build_path("train_gpt2") +
        test::without_given(kSmall + " --max-steps 3 --out-dir " + (*dir_ / "out") + data, flags) +
        " " + flags;
    const auto result = run_command(command);
    EXPECT_NE(result.exit_code, 0) << command << "\n" << result.output;
    EXPECT_NE(result.exit_code, 124) << "hung until the timeout\n" << result.output;
    EXPECT_NE(result.output.find(expected), std::string::npos)
        << "expected '" << expected << "' in:\n"
        << result.output;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadInputTable,
    ::testing::Values(
        BadInput{"missing_file", "--data {dir}/no-such-file.txt",
                 "{dir}/no-such-file.txt: cannot open"},
        BadInput{"directory_instead_of_file", "--data {dir}/a_directory",
                 "a_directory: is a directory"},
        BadInput{"empty_file", "--data {dir}/empty.txt", "the corpus is empty"},
        BadInput{"parquet_given_as_text", "--data {dir}/fineweb.txt",
                 "--data {dir}/fineweb.txt is a Parquet file: --data reads one plain-text file; "
                 "build/prepare_data turns such files into token shards"},
        BadInput{"parquet_named_so", "--data {dir}/fineweb.parquet",
                 "--data {dir}/fineweb.parquet is a Parquet file: --data reads one plain-text "
                 "file; build/prepare_data turns such files into token shards (with loss masks "
                 "for prompt/response and chat records): build/prepare_data --data "
                 "{dir}/fineweb.parquet --tokenizer gpt2 --out-dir data/fineweb, then train with "
                 "--train-data 'data/fineweb/*_train_*.bin'"},
        BadInput{"json_lines", "--data {dir}/qa.jsonl",
                 "--data {dir}/qa.jsonl is JSON Lines: --data reads one plain-text file; "
                 "build/prepare_data"},
        BadInput{"json_lines_named_as_text", "--data {dir}/qa.txt",
                 "--data {dir}/qa.txt is JSON Lines (its first line is a JSON object)"},
        BadInput{"compressed_json_lines", "--data {dir}/web.jsonl.gz",
                 "--data {dir}/web.jsonl.gz is gzip-compressed JSON Lines: --data reads one "
                 "plain-text file; build/prepare_data turns such files into token shards (with "
                 "loss masks for prompt/response and chat records): build/prepare_data --data "
                 "{dir}/web.jsonl.gz --tokenizer gpt2 --out-dir data/web,"},
        BadInput{"truncated_checkpoint", "--init-from {dir}/truncated.bin",
                 "truncated.bin: truncated"},
        BadInput{"flipped_byte_checkpoint", "--init-from {dir}/flipped.bin",
                 "flipped.bin: checksum mismatch"},
        BadInput{"other_shape_on_resume", "--resume {dir}/good/state_000002.bin --n-layer 3",
                 "--n-layer 3 contradicts --resume"},
        BadInput{"block_size_beyond_checkpoint",
                 "--init-from {dir}/good/model_000002.bin --seq-len 64",
                 "exceeds the block size 32"},
        BadInput{"shard_wrong_magic",
                 "--train-data {dir}/shards/bad_magic_train.bin --val-data "
                 "{dir}/shards/bad_magic_train.bin",
                 "bad_magic_train.bin"},
        BadInput{"token_id_out_of_range",
                 "--init-from {dir}/good/model_000002.bin --train-data '{dir}/range/*_train_*.bin' "
                 "--val-data '{dir}/range/*_val_*.bin'",
                 "60000"},
        BadInput{"zero_batch", "--batch-size 0", "--batch-size: must be > 0 (got 0)"},
        BadInput{"negative_seq_len", "--seq-len -4", "--seq-len: must be > 0 (got -4)"},
        BadInput{"zero_layers", "--n-layer 0", "--n-layer"},
        BadInput{"batch_smaller_than_workers", "--threads 4 --batch-size 2",
                 "--threads 4 exceeds --batch-size 2"},
        BadInput{"unwritable_out_dir", "--out-dir /proc/version/out",
                 "--out-dir /proc/version/out"},
        BadInput{"accum_and_total_tokens", "--grad-accum 2 --total-batch-tokens 4096", "give one"}),
    [](const ::testing::TestParamInfo<BadInput>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace gpt2
