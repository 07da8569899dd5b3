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
#include "model/forward_backward.hpp"
#include "model/generate.hpp"
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

// A char model trained by train_gpt2 (the quick start's kind, a few steps) in out/.
fs::path train_char_model(const ScratchDir& dir) {
    test::write_corpus(dir.path() / "corpus.txt", 20000);
    const auto r = run_command(test::build_path("train_gpt2") + test::small_model(16) +
                               " --batch-size 4 --max-steps 2 --threads 1 --val-every 0 "
                               "--sample-every 0 --data " +
                               (dir / "corpus.txt") + " --out-dir " + (dir / "out"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return dir.path() / "out" / "model_000002.bin";
}

// The quick start's conversions of a char model: a Hugging Face directory that reads back to the
// same weights and tokenizer, and a Q8_0 GGUF.
TEST(ConvertModel, ACharModelConvertsToHuggingFaceAndGguf) {
    const ScratchDir dir("gpt2-convert-char");
    const fs::path checkpoint = train_char_model(dir);
    const std::string convert = test::build_path("convert_model") + " " + checkpoint.string() + " ";
    const auto hf = run_command(convert + (dir / "gpt2-tiny-hf"));
    ASSERT_EQ(hf.exit_code, 0) << hf.output;
    EXPECT_NE(hf.output.find("tokenizer char (the input's own)"), std::string::npos) << hf.output;
    EXPECT_NE(hf.output.find("vocab.json, merges.txt"), std::string::npos) << hf.output;
    const LoadedModel original = load_model_file(checkpoint);
    const LoadedModel back = load_model_file(dir.path() / "gpt2-tiny-hf");
    expect_bitwise(back.model.weights(), original.model.weights());
    ASSERT_TRUE(back.extras.has_value());
    EXPECT_EQ(back.extras->tokenizer, original.extras->tokenizer);
    const auto gguf = run_command(convert + (dir / "tiny.gguf") + " --dtype q8_0");
    ASSERT_EQ(gguf.exit_code, 0) << gguf.output;
    EXPECT_NE(gguf.output.find("q8_0 matrices"), std::string::npos) << gguf.output;
    EXPECT_GT(fs::file_size(dir.path() / "tiny.gguf"), 0u);
}

// OUT never replaces what is not a previous conversion's: a directory of checkpoints is refused
// with its files named, a checkpoint or another file as OUT is refused, all before anything is
// read or written; a previous export is replaced (its stale tokenizer files removed).
TEST(ConvertModel, OutputsNeverOverwriteCheckpointsOrForeignFiles) {
    const ScratchDir dir("gpt2-convert-occupied");
    const fs::path checkpoint = train_char_model(dir);
    const std::vector<std::uint8_t> checkpoint_bytes = read_file_bytes(checkpoint);
    const std::string convert = test::build_path("convert_model") + " ";
    const auto refused = [&](const std::string& args, const std::string& message) {
        const auto r = run_command(convert + args);
        EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
        EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
        EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << r.output;
        EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
    };
    refused(checkpoint.string() + " " + (dir / "out"),
            (dir / "out") +
                " holds files a Hugging Face export does not write (model_000002.bin, "
                "state_000002.bin)");
    EXPECT_FALSE(fs::exists(dir.path() / "out" / "config.json"));
    ASSERT_EQ(run_command(convert + checkpoint.string() + " " + (dir / "m.bin")).exit_code, 0);
    refused((dir / "m.bin") + " " + checkpoint.string(),
            checkpoint.string() +
                " is a checkpoint (it carries its tokenizer and configuration), "
                "which convert_model never overwrites");
    refused(checkpoint.string() + " " + (dir / "corpus.txt") + " --to gguf",
            (dir / "corpus.txt") + " exists and is not a GGUF file");
    refused(checkpoint.string() + " " + (dir / "out/state_000002.bin"),
            "state_000002.bin exists and is not an llm.c model file");
    EXPECT_EQ(read_file_bytes(checkpoint), checkpoint_bytes);

    // A previous conversion's output is replaced; --weights-only leaves no stale tokenizer files.
    ASSERT_EQ(run_command(convert + checkpoint.string() + " " + (dir / "m.bin")).exit_code, 0);
    ASSERT_EQ(run_command(convert + checkpoint.string() + " " + (dir / "hf")).exit_code, 0);
    ASSERT_TRUE(fs::exists(dir.path() / "hf" / "vocab.json"));
    const auto again = run_command(convert + checkpoint.string() + " " + (dir / "hf") +
                                   " --weights-only --dtype bf16");
    ASSERT_EQ(again.exit_code, 0) << again.output;
    for (const char* stale : {"vocab.json", "merges.txt", "tokenizer_config.json"})
        EXPECT_FALSE(fs::exists(dir.path() / "hf" / stale)) << stale;
    EXPECT_FALSE(load_model_file(dir.path() / "hf").extras.has_value());
}

// OUT ending in .safetensors: DIR/model.safetensors writes the Hugging Face files into DIR, where
// our reader (given that file or DIR) and transformers find them; another name is refused.
TEST(ConvertModel, AModelSafetensorsOutputWritesItsDirectory) {
    const ScratchDir dir("gpt2-convert-safetensors");
    const fs::path checkpoint = train_char_model(dir);
    const std::string convert = test::build_path("convert_model") + " " + checkpoint.string() + " ";
    const auto r = run_command(convert + (dir / "tiny/model.safetensors"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(fs::is_regular_file(dir.path() / "tiny" / "model.safetensors"));
    EXPECT_TRUE(fs::is_regular_file(dir.path() / "tiny" / "config.json"));
    EXPECT_TRUE(fs::is_regular_file(dir.path() / "tiny" / "vocab.json"));
    expect_bitwise(load_model_file(dir.path() / "tiny" / "model.safetensors").model.weights(),
                   load_model_file(checkpoint).model.weights());
    // In a directory of other files (here the current one) or under another name: refused.
    const auto here = run_command("cd " + (dir / "out") + " && " + convert + "model.safetensors");
    EXPECT_EQ(here.exit_code, 2) << here.output;
    EXPECT_NE(here.output.find("model.safetensors: the Hugging Face files go beside it, into ., "
                               "which holds files a Hugging Face export does not write"),
              std::string::npos)
        << here.output;
    const auto other = run_command(convert + (dir / "weights.safetensors"));
    EXPECT_EQ(other.exit_code, 2) << other.output;
    EXPECT_NE(other.output.find("weights.safetensors: a Hugging Face model is a directory"),
              std::string::npos)
        << other.output;
    EXPECT_FALSE(fs::exists(dir.path() / "weights.safetensors"));
    EXPECT_FALSE(fs::exists(dir.path() / "out" / "config.json"));
}

// Like inference and train_gpt2, convert_model takes GPT-2's tokenizer from data/gpt2 by default
// for a model of GPT-2's vocabulary without one (gpt2_124M.bin), where the output holds one.
TEST(ConvertModel, TheTokenizerDirDefaultsToDataGpt2) {
    if (!has_gpt2_files()) GTEST_SKIP() << "no GPT-2 tokenizer files in " << kGpt2Dir;
    const ScratchDir dir("gpt2-convert-default-dir");
    Model model(ModelConfig{16, kGpt2VocabSize, pad_vocab(kGpt2VocabSize), 1, 2, 32});
    init_parameters(model, 26);
    save_llmc_model(dir.path() / "gpt2.bin", model, kLlmcModelVersionFp32);
    fs::create_directories(dir.path() / "with" / "data");
    fs::create_directory_symlink(fs::absolute(kGpt2Dir), dir.path() / "with" / "data" / "gpt2");
    fs::create_directories(dir.path() / "without");
    const auto convert = [&](const std::string& where, const std::string& args) {
        return run_command("cd " + (dir / where) + " && " + test::build_path("convert_model") +
                           " ../gpt2.bin " + args);
    };
    const auto gguf = convert("with", "m.gguf");
    ASSERT_EQ(gguf.exit_code, 0) << gguf.output;
    EXPECT_NE(gguf.output.find("tokenizer gpt2 (GPT-2's from data/gpt2)"), std::string::npos)
        << gguf.output;
    const auto hf = convert("with", "hf");
    ASSERT_EQ(hf.exit_code, 0) << hf.output;
    EXPECT_TRUE(fs::exists(dir.path() / "with" / "hf" / "vocab.json"));
    EXPECT_EQ(convert("with", "back.bin").exit_code, 0);

    // Without data/gpt2: llm.c's file needs no tokenizer; GGUF and Hugging Face say what to do.
    EXPECT_EQ(convert("without", "back.bin").exit_code, 0);
    const auto missing = convert("without", "m.gguf");
    EXPECT_EQ(missing.exit_code, 1) << missing.output;
    EXPECT_NE(missing.output.find("GPT-2's tokenizer could not be loaded from data/gpt2 (the "
                                  "default --tokenizer-dir)"),
              std::string::npos)
        << missing.output;
    const auto missing_hf = convert("without", "hf");
    EXPECT_EQ(missing_hf.exit_code, 1) << missing_hf.output;
    EXPECT_NE(missing_hf.output.find("--weights-only writes the directory without tokenizer files"),
              std::string::npos)
        << missing_hf.output;
    EXPECT_EQ(convert("without", "hf --weights-only").exit_code, 0);
    // The default is not a request: an input with its own tokenizer keeps it.
    const auto own = run_command("cd " + (dir / "with") + " && " +
                                 test::build_path("convert_model") + " hf again.gguf");
    ASSERT_EQ(own.exit_code, 0) << own.output;
    EXPECT_NE(own.output.find("(the input's own)"), std::string::npos) << own.output;
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
