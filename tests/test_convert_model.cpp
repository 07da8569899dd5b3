// The convert_model program every way, its one-line refusals, and the programs starting from a
// Hugging Face directory as from the checkpoint it was exported from.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/random.hpp"
#include "formats/checkpoint.hpp"
#include "formats/gguf.hpp"
#include "formats/hugging_face.hpp"
#include "formats/model_file.hpp"
#include "formats/model_tokenizer.hpp"
#include "formats/safetensors.hpp"
#include "formats_support.hpp"
#include "model/generate.hpp"
#include "model/training_context.hpp"
#include "ops/gemm.hpp"
#include "process_support.hpp"
#include "test_support.hpp"

namespace gpt2 {
namespace {

using namespace formats_test;  // fs, json, run_command, ScratchDir and the helpers

// ---- convert_model ---------------------------------------------------------------------------

TEST(ConvertModel, ConvertsEveryWayAndRefusesWhatItCannotDoInOneLine) {
    const ScratchDir dir("gpt2-formats-convert");
    const std::string convert = test::build_path("convert_model");
    const Model model = small_model(300, 22);
    save_llmc_model(dir.path() / "m.bin", model, kLlmcModelVersionFp32);
    // llm.c -> Hugging Face -> llm.c and llm.c v5, bitwise where exact.
    auto r = run_command(convert + " " + (dir / "m.bin") + " " + (dir / "hf"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("no tokenizer files"), std::string::npos) << r.output;
    r = run_command(convert + " " + (dir / "hf") + " " + (dir / "back.bin"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(read_file_bytes(dir.path() / "back.bin"), read_file_bytes(dir.path() / "m.bin"));
    r = run_command(convert + " " + (dir / "hf") + " " + (dir / "v5.bin") + " --dtype bf16");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(fs::file_size(dir.path() / "v5.bin"), 1024 + 2 * model.params.size());

    const auto fails = [&](const std::string& args, int code, const std::string& message) {
        const auto f = run_command(convert + " " + args);
        EXPECT_EQ(f.exit_code, code) << args << "\n" << f.output;
        EXPECT_NE(f.output.find(message), std::string::npos) << args << "\n" << f.output;
        EXPECT_NE(f.output.find("error: "), std::string::npos) << f.output;
    };
    fails((dir / "m.bin") + " " + (dir / "x") + " --dtype q8_0", 2,
          "--dtype q8_0 is not available for hf");
    fails((dir / "m.bin") + " " + (dir / "x.gguf"), 1,
          "has no tokenizer, and a GGUF file must embed one");
    fails((dir / "m.bin") + " " + (dir / "m.bin"), 2, "the output is the input");
    fails((dir / "missing.bin") + " " + (dir / "x"), 1, "missing.bin");
    fails((dir / "m.bin") + " " + (dir / "x.bin") + " --weights-only", 2,
          "--weights-only applies to");
    fails((dir / "m.bin") + " " + (dir / "x.bin") + " --name tiny", 2,
          "--name sets general.name of GGUF output only");
    EXPECT_FALSE(fs::exists(dir.path() / "x.gguf"));
    EXPECT_FALSE(fs::exists(dir.path() / "x.bin"));
}

// train_gpt2 --init-from and inference take a Hugging Face directory as they take the checkpoint
// it was exported from: the same losses, the same greedy text.
TEST(ConvertModel, TrainingAndInferenceStartFromAHuggingFaceDirectory) {
    if (!has_gpt2_files()) GTEST_SKIP() << "no GPT-2 tokenizer files in " << kGpt2Dir;
    const ScratchDir dir("gpt2-formats-programs");
    Model model(ModelConfig{16, 50257, pad_vocab(50257), 2, 2, 32});
    init_parameters(model, 23);
    const auto tokenizer = load_gpt2_tokenizer(kGpt2Dir);
    save_checkpoint(dir.path() / "ckpt.bin", model, CheckpointExtras{tokenizer->serialize(), ""});
    const auto converted = run_command(test::build_path("convert_model") + " " +
                                       (dir / "ckpt.bin") + " " + (dir / "hf"));
    ASSERT_EQ(converted.exit_code, 0) << converted.output;
    // The sample: the lines that are not log lines ("[HH:MM:SS] ...").
    const auto generate = [&](const std::string& model_path) {
        const auto r = run_command(test::build_path("inference") + " " + model_path +
                                   " --temperature 0 --max-new-tokens 12 --prompt 'To be' "
                                   "--no-stream --threads 1");
        EXPECT_EQ(r.exit_code, 0) << r.output;
        std::string text;
        std::istringstream lines(r.output);
        for (std::string line; std::getline(lines, line);) {
            if (!line.starts_with("[")) text += line + "\n";
        }
        return text;
    };
    const std::string from_checkpoint = generate(dir / "ckpt.bin");
    EXPECT_TRUE(from_checkpoint.starts_with("To be")) << from_checkpoint;
    EXPECT_EQ(generate(dir / "hf"), from_checkpoint);

    test::write_corpus(dir.path() / "corpus.txt", 20000);
    const auto train = [&](const std::string& init, const std::string& out, int steps) {
        return run_command(test::build_path("train_gpt2") + " --init-from " + init +
                           " --seq-len 16 --batch-size 2 --threads 1 --val-every 0 "
                           "--sample-every 0 --max-steps 4 --stop-at-step " +
                           std::to_string(steps) + " --seed 5 --data " + (dir / "corpus.txt") +
                           " --out-dir " + (dir / out));
    };
    const auto a = train(dir / "ckpt.bin", "a", 4), b = train(dir / "hf", "b", 4);
    ASSERT_EQ(a.exit_code, 0) << a.output;
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_NE(b.output.find("tokenizer gpt2"), std::string::npos) << b.output;
    EXPECT_EQ(read_file_bytes(dir.path() / "a" / "model_000004.bin"),
              read_file_bytes(dir.path() / "b" / "model_000004.bin"));
    // A fine-tune from the directory, stopped at step 2 and resumed, ends bitwise where the
    // straight run did.
    ASSERT_EQ(train(dir / "hf", "c", 2).exit_code, 0);
    const auto resumed = run_command(test::build_path("train_gpt2") +
                                     " --resume auto --max-steps 4 --seq-len 16 --batch-size 2 "
                                     "--seed 5 --threads 1 --val-every 0 "
                                     "--sample-every 0 --data " +
                                     (dir / "corpus.txt") + " --out-dir " + (dir / "c"));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    // (The weights: the checkpoints' configuration records differ, naming --resume.)
    expect_bitwise(load_model_file(dir.path() / "c" / "model_000004.bin").model.weights(),
                   load_model_file(dir.path() / "b" / "model_000004.bin").model.weights());
}

}  // namespace
}  // namespace gpt2
