// Where a run starts: weights given with --init-from are trained with their own tokenizer and
// shape (contradicting flags refused, presets overridable), and --resume auto on an empty directory
// starts from them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "formats/checkpoint.hpp"
#include "model/model.hpp"
#include "process_support.hpp"
#include "train_run_fixture.hpp"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;
using test::run_command;
using test::ScratchDir;
using test::TrainRun;

const fs::path kGpt2Dir = fs::path(GPT2_SHARED_DATA_DIR) / "gpt2";

// ---- weights, tokenizer and shape flags ----

// A plain llm.c model file (no tokenizer) of vocabulary V.
std::string write_llmc_model(const std::string& path, int V) {
    // The shape of kSmall, so that only the vocabulary differs.
    Model model(ModelConfig{16, V, pad_vocab(V), 2, 2, 32});
    init_parameters(model, 3);
    return save_checkpoint(path, model, std::nullopt).string();
}

TEST_F(TrainRun, APlainGpt2ModelFileIsNotTrainedOnCharacterIds) {
    const std::string model = write_llmc_model(path("gpt2_tiny.bin"), 50257);
    const auto refused =
        train("--init-from " + model + " --tokenizer char --max-steps 1 --out-dir " + path("a"));
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_NE(refused.output.find("vocabulary (50257) is not the char tokenizer's"),
              std::string::npos)
        << refused.output;
    if (!fs::exists(kGpt2Dir / "encoder.json")) GTEST_SKIP() << "no GPT-2 tokenizer files";
    // Without --tokenizer, a 50257-token llm.c file gets GPT-2's tokenizer, and says so.
    const auto defaulted = train("--init-from " + model + " --tokenizer-dir " + kGpt2Dir.string() +
                                 " --max-steps 1 --out-dir " + path("b"));
    ASSERT_EQ(defaulted.exit_code, 0) << defaulted.output;
    EXPECT_NE(defaulted.output.find("no tokenizer in the file; using GPT-2's"), std::string::npos)
        << defaulted.output;
    EXPECT_NE(defaulted.output.find("--init-from " + model + ": model L=2"), std::string::npos)
        << defaulted.output;
    EXPECT_NE(defaulted.output.find("tokenizer gpt2 (vocab 50257)"), std::string::npos)
        << defaulted.output;
}

TEST_F(TrainRun, APlainModelFileOfAnotherVocabularyNeedsItsTokenizerNamed) {
    const std::string model = write_llmc_model(path("odd.bin"), 300);
    const auto refused = train("--init-from " + model + " --max-steps 1 --out-dir " + path("a"));
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_NE(refused.output.find("give the --tokenizer it was trained with"), std::string::npos)
        << refused.output;
}

TEST_F(TrainRun, ShapeFlagsThatContradictTheWeightsAreRefused) {
    ASSERT_EQ(train("--max-steps 2 --out-dir " + path("a")).exit_code, 0);
    const auto refused = train("--init-from " + path("a/model_000002.bin") +
                               " --n-layer 3 --max-steps 1 --out-dir " + path("b"));
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_NE(refused.output.find("--n-layer 3 contradicts --init-from"), std::string::npos)
        << refused.output;
    // The same shape given again is no contradiction.
    const auto agreed = train("--init-from " + path("a/model_000002.bin") +
                              " --n-layer 2 --max-steps 1 --out-dir " + path("c"));
    EXPECT_EQ(agreed.exit_code, 0) << agreed.output;
}

TEST_F(TrainRun, ExplicitDimensionsOverrideAPreset) {
    const auto result = run_command(
        test::build_path("train_gpt2") +
        " --model char-small --n-layer 1 --seq-len 16 --batch-size 1 --threads 1 --max-steps 1"
        " --val-every 0 --sample-every 0 --data " +
        path("corpus.txt") + " --out-dir " + path("a"));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("preset char-small with --n-layer"), std::string::npos)
        << result.output;
    EXPECT_NE(result.output.find("L=1 H=4 C=256"), std::string::npos) << result.output;
}

TEST_F(TrainRun, ResumeAutoOnAnEmptyDirectoryStartsFromInitFrom) {
    ASSERT_EQ(train("--max-steps 3 --out-dir " + path("a")).exit_code, 0);
    const std::string weights = path("a/model_000003.bin");
    const auto plain = train("--init-from " + weights + " --max-steps 1 --metrics-file " +
                             path("plain.jsonl") + " --out-dir " + path("b"));
    ASSERT_EQ(plain.exit_code, 0) << plain.output;
    const auto resumed =
        train("--resume auto --init-from " + weights + " --max-steps 1 --metrics-file " +
              path("auto.jsonl") + " --out-dir " + path("c"));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("no checkpoint in " + path("c") + "; starting from --init-from"),
              std::string::npos)
        << resumed.output;
    const auto a = test::metrics_records(path("plain.jsonl"), "train");
    const auto b = test::metrics_records(path("auto.jsonl"), "train");
    ASSERT_EQ(a.size(), 1u);
    ASSERT_EQ(b.size(), 1u);
    EXPECT_EQ(a[0]["loss"], b[0]["loss"]) << "--init-from was not used";
}

}  // namespace
}  // namespace gpt2
