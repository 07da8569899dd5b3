// The user's path end to end: text -> train_gpt2 -> checkpoint -> inference, and text ->
// prepare_data shards (with their tokenizer) -> train_gpt2 on shards, also under mpiexec.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "formats/resume_state.hpp"
#include "process_support.hpp"

namespace gpt2 {
namespace {

using test::run_command;
using test::ScratchDir;

const std::string kSmall = test::small_model(32) +
                           " --batch-size 8 --lr 3e-3 --warmup-steps 5"
                           " --sample-every 0 --val-tokens 1024";

TEST(EndToEnd, TrainingReducesLossAndInferenceGeneratesFromTheCheckpoint) {
    const ScratchDir dir("gpt2-e2e");
    test::write_corpus(dir.path() / "corpus.txt", 50000);
    const auto train =
        run_command(test::build_path("train_gpt2") + kSmall + " --data " + (dir / "corpus.txt") +
                    " --max-steps 60 --val-every 20 --out-dir " + (dir / "out") +
                    " --metrics-file " + (dir / "m.jsonl"));
    ASSERT_EQ(train.exit_code, 0) << train.output;
    const std::vector<double> val = test::metrics_values(dir / "m.jsonl", "val", "val_loss");
    ASSERT_EQ(val.size(), 4u);  // steps 0, 20, 40, 60
    EXPECT_LT(val.back(), 0.75 * val.front()) << train.output;

    const std::string checkpoint = model_path(dir.path() / "out", 60).string();
    const auto generate =
        run_command(test::build_path("inference") + " " + checkpoint +
                    " --prompt 'the king' --max-new-tokens 40 --seed 3 --no-stream");
    ASSERT_EQ(generate.exit_code, 0) << generate.output;
    EXPECT_NE(generate.output.find("the king"), std::string::npos) << generate.output;
    EXPECT_GT(generate.output.size(), 40u) << generate.output;
}

TEST(EndToEnd, PreparedShardsTrainUnderMpiexec) {
    const ScratchDir dir("gpt2-e2e-shards");
    test::write_corpus(dir.path() / "corpus.txt", 50000);
    const auto prepare = run_command(test::build_path("prepare_data") + " --input " +
                                     (dir / "corpus.txt") + " --tokenizer bpe --vocab-size 300" +
                                     " --out-dir " + (dir / "shards") + " --shard-tokens 8000");
    ASSERT_EQ(prepare.exit_code, 0) << prepare.output;
    ASSERT_TRUE(std::filesystem::exists(dir.path() / "shards" / "tokenizer.bin"));
    const auto train =
        run_command(test::mpiexec(2) + test::build_path("train_gpt2") + kSmall + " --threads 1" +
                    " --train-data '" + (dir / "shards") + "/*_train_*.bin' --val-data '" +
                    (dir / "shards") + "/*_val_*.bin' --max-steps 30 --val-every 30 --out-dir " +
                    (dir / "out") + " --metrics-file " + (dir / "m.jsonl"));
    ASSERT_EQ(train.exit_code, 0) << train.output;
    const std::vector<double> val = test::metrics_values(dir / "m.jsonl", "val", "val_loss");
    ASSERT_EQ(val.size(), 2u);
    EXPECT_LT(val.back(), val.front()) << train.output;
    // The checkpoint carries the shards' BPE tokenizer: inference needs nothing else.
    const auto generate = run_command(test::build_path("inference") + " " +
                                      model_path(dir.path() / "out", 30).string() +
                                      " --max-new-tokens 20 --no-stream");
    EXPECT_EQ(generate.exit_code, 0) << generate.output;
}

}  // namespace
}  // namespace gpt2

namespace gpt2 {
namespace {

TEST(EndToEnd, ConfigFileSetsFlagsAndTheCommandLineOverridesIt) {
    const ScratchDir dir("gpt2-e2e-config");
    test::write_corpus(dir.path() / "corpus.txt", 30000);
    std::ofstream(dir.path() / "run.toml") << "# a run\nmax-steps = 3\nseq-len = 16\nn-layer = 1\n"
                                              "n-embd = 16\nn-head = 2\nbatch-size = 4\n"
                                              "val-every = 0\nsample-every = 0\n";
    const auto result =
        run_command(test::build_path("train_gpt2") + " --config " + (dir / "run.toml") +
                    " --seq-len 8 --data " + (dir / "corpus.txt") + " --out-dir " + (dir / "out"));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("step 3/3 |"), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("batch 4 x 8 per rank"), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("L=1 H=2 C=16"), std::string::npos) << result.output;
}

TEST(EndToEnd, ReplicaCheckConfirmsIdenticalParametersAcrossRanks) {
    const ScratchDir dir("gpt2-e2e-replicas");
    test::write_corpus(dir.path() / "corpus.txt", 30000);
    const auto result =
        run_command(test::mpiexec(2) + test::build_path("train_gpt2") + kSmall +
                    " --threads 1 --max-steps 4 --check-replicas 2 --log-level debug"
                    " --val-every 0 --data " +
                    (dir / "corpus.txt") + " --out-dir " + (dir / "out"));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("step 2: replicas identical"), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("step 4: replicas identical"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace gpt2
