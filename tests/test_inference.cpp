// The inference program run as a user would (single process and under mpiexec): what it prints,
// its flags, prompts and tokenizers, and the errors it refuses with.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/utf8.hpp"
#include "data/chat_template.hpp"
#include "data/shard.hpp"
#include "formats/checkpoint.hpp"
#include "formats/resume_state.hpp"
#include "model/forward_backward.hpp"
#include "model/generate.hpp"
#include "model/kv_cache.hpp"
#include "model/sampling.hpp"
#include "ops/gemm.hpp"
#include "optim/adamw.hpp"
#include "process_support.hpp"
#include "test_support.hpp"
#include "tokenizer/tokenizer.hpp"

#include "random_model.hpp"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;

using test::random_model;
using test::small_config;

class InferenceProgram : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = std::make_unique<test::ScratchDir>("gpt2-test-inference");
        const std::string corpus = "To be, or not to be: that is the question.\n";
        tokenizer_ = make_char_tokenizer(corpus);
        ModelConfig c = small_config(64);
        c.vocab_size = tokenizer_->vocab_size();
        c.padded_vocab_size = pad_vocab(c.vocab_size);
        const auto model = random_model(c, 51, 1.0f);
        save_checkpoint(path("model.bin"), *model, CheckpointExtras{tokenizer_->serialize(), "{}"});
        // The same weights with a tokenizer of more symbols than the model predicts.
        const auto big = make_char_tokenizer(corpus + "XYZ#@!");
        save_checkpoint(path("big_vocab.bin"), *model, CheckpointExtras{big->serialize(), "{}"});
        save_checkpoint(path("no_tokenizer.bin"), *model, std::nullopt);
        const auto bytes = read_file_bytes(path("model.bin"));
        std::ofstream(path("truncated.bin"), std::ios::binary)
            .write(reinterpret_cast<const char*>(bytes.data()),
                   static_cast<std::streamsize>(bytes.size() * 2 / 3));
        auto flipped = bytes;
        flipped[bytes.size() / 2] ^= 0x10;
        std::ofstream(path("flipped.bin"), std::ios::binary)
            .write(reinterpret_cast<const char*>(flipped.data()),
                   static_cast<std::streamsize>(flipped.size()));
        std::ofstream(path("corpus.txt"), std::ios::binary) << corpus;
        // A training resume state beside its model, as train_gpt2 writes them.
        OptimizerState moments(model->layout.total());
        save_resume_state(path("state_000010.bin"), ResumeState{}, c, moments);
        // A plain llm.c file of GPT-2's vocabulary (tiny otherwise), like gpt2_124M.bin.
        ModelConfig g = small_config(16);
        g.vocab_size = 50257;
        g.padded_vocab_size = pad_vocab(g.vocab_size);
        g.num_layers = 1;
        g.num_heads = 2;
        g.channels = 16;
        save_checkpoint(path("gpt2_shaped.bin"), *random_model(g, 52, 1.0f), std::nullopt);
        // A char tokenizer's symbols are bytes: over this corpus most of them are pieces of
        // multi-byte characters, so a random model's output is mostly ill-formed UTF-8.
        const auto pieces = make_char_tokenizer("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80 ");
        ModelConfig u = small_config(64);
        u.vocab_size = pieces->vocab_size();
        u.padded_vocab_size = pad_vocab(u.vocab_size);
        save_checkpoint(path("utf8_pieces.bin"), *random_model(u, 53, 1.0f),
                        CheckpointExtras{pieces->serialize(), "{}"});
    }
    static void TearDownTestSuite() {
        tokenizer_.reset();
        dir_.reset();
    }
    static std::string path(const std::string& name) { return *dir_ / name; }
    // Runs the program (under mpiexec with `ranks` > 0), with the output of the shell command
    // `feed` on its stdin if given; output is stdout and stderr unless stdout_only.
    static test::ProcessResult inference(const std::string& args, int ranks = 0,
                                         bool stdout_only = false, const std::string& feed = "") {
        const std::string env =
            "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
            "OMPI_MCA_rmaps_base_oversubscribe=1 ";
        const std::string command = (feed.empty() ? std::string() : feed + " | ") + env +
                                    (ranks > 0 ? test::mpiexec(ranks) : std::string()) +
                                    test::build_path("inference") + " " + args;
        return test::run_command(stdout_only ? "{ " + command + " 2>/dev/null; }" : command);
    }
    static std::size_t count(const std::string& text, const std::string& what) {
        std::size_t n = 0;
        for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
            ++n;
        return n;
    }

    static std::unique_ptr<test::ScratchDir> dir_;
    static std::unique_ptr<Tokenizer> tokenizer_;
};
std::unique_ptr<test::ScratchDir> InferenceProgram::dir_;
std::unique_ptr<Tokenizer> InferenceProgram::tokenizer_;

TEST_F(InferenceProgram, GeneratesTokensAndReportsStatistics) {
    const auto r =
        inference(path("model.bin") + " --prompt 'To be' --max-new-tokens 50 --seed 3 --threads 2");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("stats: sample=1 prompt_tokens=5 generated_tokens=50"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("To be"), std::string::npos);
    // Same seed, same text; the output is deterministic in the seed, not the thread count.
    const auto again = inference(
        path("model.bin") + " --prompt 'To be' --max-new-tokens 50 --seed 3 --threads 1", 0, true);
    // The text ends at the newline before the stats log line ("[HH:MM:SS] stats: ...").
    const auto first_line = [](const std::string& s) {
        return s.substr(0, s.rfind('\n', s.find("] stats: sample=")));
    };
    EXPECT_EQ(again.output, first_line(r.output.substr(r.output.find("To be"))) + "\n");
}

TEST_F(InferenceProgram, StdoutIsPromptPlusGeneratedText) {
    const auto r = inference(
        path("model.bin") + " --prompt 'not' --max-new-tokens 30 --temperature 0", 0, true);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_EQ(r.output.size(), 3 + 30 + 1) << r.output;  // prompt, 30 one-byte tokens, newline
    EXPECT_EQ(r.output.substr(0, 3), "not");
    // Greedy from the library gives the same text.
    const LoadedModel loaded = load_checkpoint(path("model.bin"));
    ThreadPool pool(1);
    KvCacheSession session(loaded.model, pool);
    std::vector<std::int32_t> tokens = tokenizer_->encode("not");
    Rng rng(0);
    (void)generate_kv(session, tokens, 30, SamplingParams{0.0f, 0, 1.0f}, rng);
    EXPECT_EQ(r.output, tokenizer_->decode(tokens) + "\n");
}

TEST_F(InferenceProgram, BadCheckpointsFailNamingTheFile) {
    for (const std::string name : {"missing.bin", "truncated.bin", "flipped.bin"}) {
        const auto r = inference(path(name) + " --max-new-tokens 5");
        EXPECT_NE(r.exit_code, 0) << name << ": " << r.output;
        EXPECT_NE(r.output.find(path(name)), std::string::npos) << r.output;
        EXPECT_EQ(r.output.find("stats:"), std::string::npos) << r.output;
    }
}

// A run's --out-dir stands for its newest checkpoint that verifies (as --resume auto takes it),
// so README's commands work whatever step a run stopped at; a damaged newest one is skipped.
TEST_F(InferenceProgram, ADirectoryOfCheckpointsMeansItsNewestThatVerifies) {
    const std::string run = path("run");
    std::filesystem::create_directories(run);
    std::filesystem::copy_file(path("flipped.bin"), run + "/model_000030.bin");
    std::filesystem::copy_file(path("model.bin"), run + "/model_000020.bin");
    std::filesystem::copy_file(path("big_vocab.bin"), run + "/model_000010.bin");
    const auto r = inference(run + " --prompt 'not' --max-new-tokens 30 --temperature 0");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(run + "/model_000030.bin"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("its newest checkpoint, " + run + "/model_000020.bin"),
              std::string::npos)
        << r.output;
    const auto direct = inference(path("model.bin") +
                                      " --prompt 'not' --max-new-tokens 30 "
                                      "--temperature 0",
                                  0, true);
    EXPECT_NE(r.output.find(direct.output), std::string::npos) << r.output << direct.output;
    const auto empty = inference(path("") + " --max-new-tokens 5");
    EXPECT_EQ(empty.exit_code, 1) << empty.output;
    EXPECT_NE(empty.output.find("neither a run's checkpoints"), std::string::npos) << empty.output;
}

TEST_F(InferenceProgram, TokenizerLargerThanModelVocabularyFails) {
    const auto r = inference(path("big_vocab.bin") + " --max-new-tokens 5");
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("larger than the model's vocab_size"), std::string::npos) << r.output;
}

TEST_F(InferenceProgram, CheckpointWithoutTokenizerNeedsTheFlag) {
    const auto r = inference(path("no_tokenizer.bin") + " --max-new-tokens 5");
    EXPECT_EQ(r.exit_code, 2) << r.output;  // the command line can fix it
    // GPT-2's tokenizer cannot fit its vocabulary: the rebuilt tokenizers are what is offered.
    EXPECT_NE(r.output.find("its vocabulary (" + std::to_string(tokenizer_->vocab_size()) +
                            " tokens) is not GPT-2's (50257): pass --tokenizer char|bpe "
                            "--tokenizer-corpus FILE"),
              std::string::npos)
        << r.output;
}

TEST_F(InferenceProgram, BadFlagsAndPromptsFail) {
    for (const std::string& args : std::vector<std::string>{
             "--top-p 1.5", "--temperature -1", "--num-samples 0", "--prompt a --prompt-file b",
             "--tokenizer gpt2", "--prompt-file " + path("absent.txt"), "--prompt '~~~'"}) {
        const auto r = inference(path("model.bin") + " --max-new-tokens 5 " + args);
        EXPECT_NE(r.exit_code, 0) << args << ": " << r.output;
        EXPECT_EQ(r.output.find("stats:"), std::string::npos) << args << ": " << r.output;
    }
}

TEST_F(InferenceProgram, InteractiveReadsPromptsUntilEndOfInput) {
    const auto r =
        test::run_command("printf 'To be\\nnot\\n' | " + test::build_path("inference") + " " +
                          path("model.bin") + " --interactive --max-new-tokens 10 --seed 1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(count(r.output, "stats: sample=1"), 2u) << r.output;
    EXPECT_NE(r.output.find("prompt_tokens=5"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("prompt_tokens=3"), std::string::npos) << r.output;
}

TEST_F(InferenceProgram, SamplesAreSharedBetweenRanks) {
    const std::string args = path("model.bin") +
                             " --prompt 'To' --num-samples 3 --max-new-tokens"
                             " 20 --seed 9 --threads 1";
    const auto mpi = inference(args, 2, true);
    ASSERT_EQ(mpi.exit_code, 0) << mpi.output;
    for (int m = 1; m <= 3; ++m) {
        EXPECT_EQ(count(mpi.output, "--- sample " + std::to_string(m) + "/3 ---"), 1u)
            << mpi.output;
    }
    // The text depends on (seed, sample) only: one process prints the same.
    const auto single = inference(args, 0, true);
    ASSERT_EQ(single.exit_code, 0) << single.output;
    EXPECT_EQ(mpi.output, single.output);
}

TEST_F(InferenceProgram, ErrorsUnderMpiEndTheJob) {
    const auto r = inference(path("truncated.bin") + " --num-samples 2", 2);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(path("truncated.bin")), std::string::npos) << r.output;
}

// ---- issue 13: one voice, trustworthy inputs and outputs ----

TEST_F(InferenceProgram, LoadLogNamesModelAndTokenizer) {
    const auto r = inference(path("model.bin") + " --max-new-tokens 2");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string vocab = std::to_string(tokenizer_->vocab_size());
    EXPECT_NE(r.output.find("loaded " + path("model.bin") + ": model L=2 H=4 C=64 V=" + vocab),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("maxT=64, tokenizer char (vocab " + vocab + "), from the checkpoint"),
              std::string::npos)
        << r.output;
}

TEST_F(InferenceProgram, TokenizerOfAnotherVocabularyThanAnLlmcModelIsRefused) {
    const auto r = inference(path("gpt2_shaped.bin") + " --tokenizer char --tokenizer-corpus " +
                             path("corpus.txt") + " --max-new-tokens 5");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(r.output.find("stats:"), std::string::npos) << r.output;
    // One line naming the file and both vocabulary sizes.
    const std::string expected = "error: " + path("gpt2_shaped.bin") +
                                 ": the model's vocabulary has 50257 tokens but --tokenizer char "
                                 "(rebuilt from " +
                                 path("corpus.txt") + ") has " +
                                 std::to_string(tokenizer_->vocab_size()) + ":";
    EXPECT_NE(r.output.find(expected), std::string::npos) << r.output;
    EXPECT_EQ(count(r.output, "error"), 1u) << r.output;
}

TEST_F(InferenceProgram, TokenizerFlagMustReproduceTheCheckpointsOwn) {
    // The same alphabet rebuilt is accepted; another alphabet is not the model's vocabulary.
    const auto same = inference(path("model.bin") + " --tokenizer char --tokenizer-corpus " +
                                path("corpus.txt") + " --max-new-tokens 5 --prompt 'To be'");
    EXPECT_EQ(same.exit_code, 0) << same.output;
    std::ofstream(path("other_corpus.txt"), std::ios::binary) << "abcdef\n";
    const auto other = inference(path("model.bin") + " --tokenizer char --tokenizer-corpus " +
                                 path("other_corpus.txt") + " --max-new-tokens 5");
    EXPECT_EQ(other.exit_code, 2) << other.output;
    EXPECT_NE(other.output.find(path("model.bin") + " carries its own tokenizer, char (vocab " +
                                std::to_string(tokenizer_->vocab_size()) + ")"),
              std::string::npos)
        << other.output;
    EXPECT_EQ(other.output.find("stats:"), std::string::npos) << other.output;
}

TEST_F(InferenceProgram, LlmcModelOfGpt2VocabularyDefaultsToGpt2Tokenizer) {
    const std::filesystem::path gpt2_files = std::filesystem::path(GPT2_SHARED_DATA_DIR) / "gpt2";
    if (!std::filesystem::exists(gpt2_files / "encoder.json")) {
        GTEST_SKIP() << gpt2_files << " lacks GPT-2's tokenizer (scripts/get_gpt2_tokenizer.sh)";
    }
    // Run from a directory whose data/gpt2 holds the files: the default --tokenizer-dir.
    const std::filesystem::path cwd = path("gpt2_cwd");
    std::filesystem::create_directories(cwd / "data");
    std::filesystem::create_symlink(std::filesystem::absolute(gpt2_files), cwd / "data" / "gpt2");
    const auto r = test::run_command("cd " + cwd.string() + " && " + test::build_path("inference") +
                                     " " + path("gpt2_shaped.bin") +
                                     " --prompt 'Hello, world' --max-new-tokens 40 --seed 2");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(path("gpt2_shaped.bin") +
                            " has no tokenizer; its vocabulary (50257) is GPT-2's, so it uses the "
                            "GPT-2 tokenizer from data/gpt2"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("tokenizer gpt2 (vocab 50257), from data/gpt2"), std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("Hello, world"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("stats: sample=1 prompt_tokens=3 generated_tokens=40"),
              std::string::npos)
        << r.output;
    EXPECT_TRUE(is_valid_utf8(r.output)) << r.output;

    // Without the files the error says which model needed them and where they were looked for.
    const auto missing = inference(path("gpt2_shaped.bin") + " --tokenizer-dir " +
                                   path("no_such_dir") + " --max-new-tokens 5");
    EXPECT_EQ(missing.exit_code, 1) << missing.output;
    EXPECT_NE(missing.output.find(path("gpt2_shaped.bin") + " needs the GPT-2 tokenizer"),
              std::string::npos)
        << missing.output;
    EXPECT_NE(missing.output.find(path("no_such_dir")), std::string::npos) << missing.output;
}

TEST_F(InferenceProgram, InteractiveReportsALineItCannotEncodeAndGoesOn) {
    // '~' and 'X' are not in the char tokenizer's alphabet.
    const auto r =
        test::run_command("printf 'To be\\n~~~\\nnot\\nX\\n' | " + test::build_path("inference") +
                          " " + path("model.bin") + " --interactive --max-new-tokens 10 --seed 1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(count(r.output, "stats: sample=1"), 2u) << r.output;
    EXPECT_NE(r.output.find("prompt_tokens=5"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("prompt_tokens=3"), std::string::npos) << r.output;
    EXPECT_EQ(count(r.output, "stdin line 2: cannot encode the prompt"), 1u) << r.output;
    EXPECT_EQ(count(r.output, "stdin line 4: cannot encode the prompt"), 1u) << r.output;
    EXPECT_EQ(count(r.output, "skipped"), 2u) << r.output;
    // Skipping changes nothing else: with a good line in the bad one's place, stdout is the same
    // plus that line's sample (samples are seeded by line number). Each prompt prints as its
    // text, 10 one-byte tokens and a newline.
    const std::string args = path("model.bin") + " --interactive --max-new-tokens 10 --seed 1";
    const auto skipped = inference(args, 0, true, "printf 'To be\\n~~~\\nnot\\n'");
    const auto full = inference(args, 0, true, "printf 'To be\\nthe\\nnot\\n'");
    ASSERT_EQ(skipped.exit_code, 0) << skipped.output;
    ASSERT_EQ(full.exit_code, 0) << full.output;
    ASSERT_EQ(skipped.output.size(), (5u + 11u) + (3u + 11u)) << skipped.output;
    ASSERT_EQ(full.output.size(), (5u + 11u) + (3u + 11u) + (3u + 11u)) << full.output;
    EXPECT_EQ(skipped.output, full.output.substr(0, 16) + full.output.substr(30)) << full.output;
    EXPECT_EQ(full.output.substr(30, 3), "not");
    // Under mpiexec, with the samples shared between ranks, the same lines print the same.
    const auto mpi = inference(args + " --num-samples 2", 2, true, "printf 'To be\\n~~~\\nnot\\n'");
    const auto one = inference(args + " --num-samples 2", 0, true, "printf 'To be\\n~~~\\nnot\\n'");
    ASSERT_EQ(mpi.exit_code, 0) << mpi.output;
    EXPECT_EQ(count(mpi.output, "--- sample 2/2 ---"), 2u) << mpi.output;
    EXPECT_EQ(mpi.output, one.output);
}

TEST_F(InferenceProgram, PromptFileDashReadsStandardInput) {
    const std::string args = path("model.bin") + " --max-new-tokens 20 --temperature 0";
    const auto flag = inference(args + " --prompt 'To be'", 0, true);
    ASSERT_EQ(flag.exit_code, 0) << flag.output;
    ASSERT_EQ(flag.output.substr(0, 5), "To be");
    const auto piped = inference(args + " --prompt-file -", 0, true, "printf 'To be'");
    ASSERT_EQ(piped.exit_code, 0) << piped.output;
    EXPECT_EQ(piped.output, flag.output);
    // Under mpiexec the input reaches rank 0 through mpiexec.
    const auto mpi = inference(args + " --prompt-file -", 2, true, "printf 'To be'");
    ASSERT_EQ(mpi.exit_code, 0) << mpi.output;
    EXPECT_EQ(mpi.output, flag.output);
}

TEST_F(InferenceProgram, TextOnStdinThatNothingReadsIsRefused) {
    const std::string expected =
        "error: standard input holds text that nothing reads: pass --interactive (one prompt per "
        "line) or --prompt-file - (all of it as one prompt)";
    std::ofstream(path("stdin.txt"), std::ios::binary) << "First Citizen:\n";
    const std::string args = " " + path("model.bin") + " --max-new-tokens 5";
    const auto from_file =
        test::run_command(test::build_path("inference") + args + " < " + path("stdin.txt"));
    EXPECT_EQ(from_file.exit_code, 2) << from_file.output;
    EXPECT_EQ(count(from_file.output, expected), 1u) << from_file.output;
    EXPECT_EQ(from_file.output.find("stats:"), std::string::npos) << from_file.output;
    // A pipe: the program starts once the text is in the pipe, so that the non-blocking check
    // cannot run before it arrives.
    const auto from_pipe = test::run_command(
        "printf 'First Citizen:\\n' | bash -c 'until read -t 0; do sleep 0.01; done; exec " +
        test::build_path("inference") + args + "'");
    EXPECT_EQ(from_pipe.exit_code, 2) << from_pipe.output;
    EXPECT_EQ(count(from_pipe.output, expected), 1u) << from_pipe.output;
    // Empty input is no text: an empty file, an empty pipe at its end, /dev/null.
    std::ofstream(path("empty.txt"), std::ios::binary).flush();
    const std::string program = test::build_path("inference") + args;
    for (const std::string& command : std::vector<std::string>{
             program + " < " + path("empty.txt"), program + " < /dev/null", "true | " + program}) {
        const auto r = test::run_command(command);
        EXPECT_EQ(r.exit_code, 0) << command << ": " << r.output;
        EXPECT_NE(r.output.find("stats: sample=1"), std::string::npos) << command;
    }
}

TEST_F(InferenceProgram, ResumeStateFileIsNamedForWhatItIs) {
    const auto r = inference(path("state_000010.bin") + " --max-new-tokens 5");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("error: " + path("state_000010.bin") +
                            " is a training resume state (optimizer moments), not a model: use "
                            "model_000010.bin from the same directory"),
              std::string::npos)
        << r.output;
}

TEST_F(InferenceProgram, PrintsOnlyValidUtf8) {
    const std::string args = path("utf8_pieces.bin") + " --max-new-tokens 300 --seed 4";
    const auto streamed = inference(args, 0, true);
    ASSERT_EQ(streamed.exit_code, 0) << streamed.output;
    EXPECT_TRUE(is_valid_utf8(streamed.output)) << streamed.output;
    // The model did emit ill-formed sequences (the corpus has no U+FFFD of its own) and whole
    // characters too: the sanitizer replaced the first and kept the second.
    EXPECT_NE(streamed.output.find(kReplacementCharacter), std::string::npos);
    EXPECT_NE(streamed.output.find("\xC3\xA9"), std::string::npos) << streamed.output;
    // Printing when done, and samples printed after the fact, read the same.
    const auto whole = inference(args + " --no-stream", 0, true);
    EXPECT_EQ(whole.output, streamed.output);
    const auto two = inference(args + " --num-samples 2", 0, true);
    ASSERT_EQ(two.exit_code, 0) << two.output;
    EXPECT_TRUE(is_valid_utf8(two.output)) << two.output;
    EXPECT_EQ(two.output.substr(0, two.output.find("--- sample 2/2 ---")),
              "--- sample 1/2 ---\n" + streamed.output);
    // A prompt that is itself ill-formed is printed sanitized too.
    const auto prompt = inference(args + " --prompt \"$(printf '\\342\\202 \\360')\"", 0, true);
    ASSERT_EQ(prompt.exit_code, 0) << prompt.output;
    EXPECT_TRUE(is_valid_utf8(prompt.output)) << prompt.output;
    EXPECT_EQ(prompt.output.substr(0, 4), std::string(kReplacementCharacter) + " ");
}

TEST_F(InferenceProgram, CommandLineSpeaksWithTheCommonVoice) {
    const auto version = inference("--version");
    EXPECT_EQ(version.exit_code, 0) << version.output;
    EXPECT_NE(version.output.find("inference (gpt2-mpi) "), std::string::npos) << version.output;

    const auto help = inference("--help");
    EXPECT_EQ(help.exit_code, 0) << help.output;
    for (const std::string shown :
         {"--max-new-tokens,--sample-tokens INT=256", "--seed UINT=1337", "--temperature FLOAT=1",
          "--tokenizer-dir DIR=data/gpt2", "--log-level LEVEL", "=info", "--version"}) {
        EXPECT_NE(help.output.find(shown), std::string::npos) << shown << "\n" << help.output;
    }
    EXPECT_EQ(help.output.find("1797693"), std::string::npos) << help.output;  // DBL_MAX digits
    EXPECT_EQ(help.output.find("NONNEGATIVE"), std::string::npos) << help.output;

    const auto negative = inference(path("model.bin") + " --temperature -1");
    EXPECT_EQ(negative.exit_code, 2) << negative.output;
    EXPECT_NE(negative.output.find("error: --temperature: must be >= 0 (got -1)\n"),
              std::string::npos)
        << negative.output;
    const auto top_p = inference(path("model.bin") + " --top-p 1.5");
    EXPECT_EQ(top_p.exit_code, 2) << top_p.output;
    EXPECT_NE(top_p.output.find("error: --top-p: must be in (0, 1] (got 1.5)"), std::string::npos)
        << top_p.output;
    const auto missing = inference(path("missing.bin"));
    EXPECT_EQ(missing.exit_code, 1) << missing.output;
    EXPECT_EQ(missing.output.rfind("error: " + path("missing.bin"), 0), 0u) << missing.output;

    // --sample-tokens is --max-new-tokens; --log-level warn silences the statistics only.
    const auto alias = inference(path("model.bin") + " --prompt not --sample-tokens 7");
    EXPECT_EQ(alias.exit_code, 0) << alias.output;
    EXPECT_NE(alias.output.find("generated_tokens=7 "), std::string::npos) << alias.output;
    const auto quiet =
        inference(path("model.bin") + " --prompt not --sample-tokens 7 --log-level warn");
    EXPECT_EQ(quiet.exit_code, 0) << quiet.output;
    EXPECT_EQ(quiet.output.find("stats:"), std::string::npos) << quiet.output;
    EXPECT_EQ(quiet.output.find("loaded"), std::string::npos) << quiet.output;
    EXPECT_EQ(quiet.output.substr(0, 3), "not");
    EXPECT_EQ(quiet.output.size(), 3u + 7u + 1u) << quiet.output;
}

TEST_F(InferenceProgram, HelpShowsStreamingAsTheDefault) {
    const auto help = inference("--help");
    ASSERT_EQ(help.exit_code, 0) << help.output;
    // CLI11's "--stream,--no-stream{false}" read as if streaming were off by default.
    EXPECT_EQ(help.output.find("{false}"), std::string::npos) << help.output;
    EXPECT_NE(help.output.find("print each token as it is generated (the default)"),
              std::string::npos)
        << help.output;
    EXPECT_NE(help.output.find("  --no-stream "), std::string::npos) << help.output;
    EXPECT_NE(help.output.find("print each sample when it is done"), std::string::npos)
        << help.output;
    EXPECT_NE(help.output.find("--tokenizer NAME "), std::string::npos) << help.output;
    const auto both = inference(path("model.bin") + " --stream --no-stream");
    EXPECT_EQ(both.exit_code, 2) << both.output;
    EXPECT_EQ(both.output.rfind("error: --stream excludes --no-stream", 0), 0u) << both.output;
}

TEST_F(InferenceProgram, ATokenizerCorpusWithoutARebuiltTokenizerIsRefused) {
    for (const std::string& args : {std::string(), std::string(" --tokenizer gpt2")}) {
        const auto r = inference(path("model.bin") + " --max-new-tokens 5 --tokenizer-corpus " +
                                 path("corpus.txt") + args);
        EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
        EXPECT_EQ(r.output.rfind("error: --tokenizer-corpus is the text a char or bpe tokenizer is "
                                 "rebuilt from",
                                 0),
                  0u)
            << r.output;
    }
}

// ---- where a sample ends, and what makes repeats less likely ----

// A model whose next-token logits are the same whatever the text (final LayerNorm weight 0, its
// bias e1): each token's logit is its embedding's first component, `first` by id, 0 elsewhere.
// Greedy decoding, and so every stop, is then known in advance.
void save_fixed_logits_model(const fs::path& path, const Tokenizer& tokenizer,
                             const std::vector<std::pair<int, float>>& first) {
    const int V = tokenizer.vocab_size();
    const ModelConfig c{32, V, pad_vocab(V), 1, 1, 8};
    Model model(c);
    init_parameters(model, 3);
    const std::span<float> w = model.params.span();
    std::fill_n(model.layout.tensor(w, ParamTensor::lnfw).begin(), c.channels, 0.0f);
    const std::span<float> bias = model.layout.tensor(w, ParamTensor::lnfb);
    std::fill(bias.begin(), bias.end(), 0.0f);
    bias[0] = 1.0f;
    const std::span<float> wte = model.layout.tensor(w, ParamTensor::wte);
    for (std::size_t row = 0; row < static_cast<std::size_t>(c.padded_vocab_size); ++row)
        wte[row * c.channels] = 0.0f;
    for (const auto& [id, logit] : first)
        wte[static_cast<std::size_t>(id) * c.channels] = logit;
    (void)save_checkpoint(path, model, CheckpointExtras{tokenizer.serialize(), "{}"});
}

// The text inference prints for `flags` (stdout only), greedy.
std::string greedy_text(const fs::path& model, const std::string& flags) {
    const auto run = test::run_command("{ " + test::build_path("inference") + " " + model.string() +
                                       " --temperature 0 --threads 1 " + flags + " 2>/dev/null; }");
    EXPECT_EQ(run.exit_code, 0) << flags << "\n" << run.output;
    return run.output;
}

// A stop string ends the sample without being printed, even when it would be cut over tokens
// (the text that might begin it is held back, and printed once it cannot); several may be given.
TEST(InferenceStops, AStopStringEndsTheSampleUnprinted) {
    const test::ScratchDir dir("gpt2-inference-stop");
    const auto chars = make_char_tokenizer("abc\nxyz");
    const int a = chars->encode("a").at(0);
    save_fixed_logits_model(dir.path() / "m.bin", *chars, {{a, 10.0f}});
    const fs::path m = dir.path() / "m.bin";
    EXPECT_EQ(greedy_text(m, "--prompt x --max-new-tokens 6"), "xaaaaaa\n");
    EXPECT_EQ(greedy_text(m, "--prompt x --max-new-tokens 6 --stop aaa"), "x\n");
    EXPECT_EQ(greedy_text(m, "--prompt x --max-new-tokens 6 --stop ab"), "xaaaaaa\n");
    EXPECT_EQ(greedy_text(m, "--prompt x --max-new-tokens 6 --stop zz --stop aa"), "x\n");
    EXPECT_EQ(greedy_text(m, "--prompt x --max-new-tokens 6 --stop aa --no-stream"), "x\n");
    const auto empty =
        test::run_command(test::build_path("inference") + " " + m.string() + " --stop ''");
    EXPECT_EQ(empty.exit_code, 2) << empty.output;
}

// The end-of-text token ends a sample, unprinted (a model trained on documents says it is done),
// unless --ignore-eot; the statistics count it.
TEST(InferenceStops, TheEndOfTextTokenEndsTheSampleUnlessIgnored) {
    const test::ScratchDir dir("gpt2-inference-eot");
    const auto bpe = train_bpe_tokenizer("the king shall speak of love and war", 280);
    const int eot = *bpe->eot_id();
    save_fixed_logits_model(dir.path() / "m.bin", *bpe, {{eot, 10.0f}});
    EXPECT_EQ(greedy_text(dir.path() / "m.bin", "--prompt king --max-new-tokens 3"), "king\n");
    EXPECT_EQ(greedy_text(dir.path() / "m.bin", "--prompt king --max-new-tokens 3 --ignore-eot"),
              "king<|endoftext|><|endoftext|><|endoftext|>\n");
    const auto stats = test::run_command(test::build_path("inference") + " " + (dir / "m.bin") +
                                         " --prompt king --max-new-tokens 3 --temperature 0");
    EXPECT_NE(stats.output.find("generated_tokens=1 "), std::string::npos) << stats.output;
}

// --repetition-penalty as Hugging Face defines it, checked against the logits by hand: 'a' 10,
// 'b' 8, the rest 0. Penalty 1.5: 'a' (10 -> 6.67) gives way to 'b' (8) once it is in the text,
// then 'b' (8 -> 5.33) to 'a' again, which stays (each token is penalised once, not per repeat).
TEST(InferenceStops, TheRepetitionPenaltyDividesTheLogitsOfTokensInTheContext) {
    const test::ScratchDir dir("gpt2-inference-penalty");
    const auto chars = make_char_tokenizer("abc\nxyz");
    save_fixed_logits_model(dir.path() / "m.bin", *chars,
                            {{chars->encode("a").at(0), 10.0f}, {chars->encode("b").at(0), 8.0f}});
    const fs::path m = dir.path() / "m.bin";
    EXPECT_EQ(greedy_text(m, "--prompt x --max-new-tokens 6"), "xaaaaaa\n");
    EXPECT_EQ(greedy_text(m, "--prompt x --max-new-tokens 6 --repetition-penalty 1.5"),
              "xabaaaa\n");
    // Below 10/8 the penalised 'a' (10 / 1.2 = 8.33) stays above 'b'.
    EXPECT_EQ(greedy_text(m, "--prompt x --max-new-tokens 3 --repetition-penalty 1.2"), "xaaa\n");
    std::vector<float> logits = {10.0f, -4.0f, 8.0f, 0.0f};
    apply_repetition_penalty(logits, std::vector<std::int32_t>{0, 1, 1, 7}, 2.0f);
    EXPECT_EQ(logits, (std::vector<float>{5.0f, -8.0f, 8.0f, 0.0f}));
}

// --chat lays the conversation out as prepare_data lays out a chat record (the one template):
// the shard a chat JSONL line makes holds exactly the tokens --chat asks the model to continue,
// its reply included; each reply joins the conversation as the assistant's message, and a reply
// ends where a model begins the next turn (the stop strings --stop's test checks).
TEST(InferenceStops, ChatUsesTheTemplatePrepareDataTrainsWith) {
    const test::ScratchDir dir("gpt2-inference-chat");
    // prepare_data's document of a two-message chat, through a trained BPE's tokens.
    test::write_bytes(dir.path() / "chat.jsonl",
                      "{\"messages\": [{\"role\": \"user\", \"content\": \"hi there\"}, "
                      "{\"role\": \"assistant\", \"content\": \"hello\"}]}\n");
    const auto prepared = test::run_command(
        test::build_path("prepare_data") + " --data " + (dir / "chat.jsonl") +
        " --tokenizer bpe --vocab-size 300 --val-fraction 0 --out-dir " + (dir / "shards"));
    ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
    const auto tokenizer =
        deserialize_tokenizer(read_file_bytes(dir.path() / "shards" / "tokenizer.bin"));
    const std::vector<ChatMessage> conversation = {{"user", "hi there"}};
    const MappedShard shard(dir.path() / "shards" / "chat_train_000000.bin");
    const std::vector<std::int32_t> tokens(shard.tokens().begin(), shard.tokens().end());
    EXPECT_EQ(tokenizer->decode(tokens), "<|endoftext|>" + chat_prompt(conversation) + "hello");
    EXPECT_EQ(chat_turn_ends(), (std::vector<std::string>{"\n\nuser:", "\n\nsystem:"}));
    // --chat on a model that answers "a" for ever: each reply (cut at --max-new-tokens) becomes
    // the assistant's message the next prompt carries.
    const auto chars = make_char_tokenizer("abcdefghijklmnopqrstuvwxyz:\n ");
    save_fixed_logits_model(dir.path() / "m.bin", *chars, {{chars->encode("a").at(0), 10.0f}});
    const auto chat = test::run_command("printf 'hi\\nbye\\n' | " + test::build_path("inference") +
                                        " " + (dir / "m.bin") +
                                        " --chat --temperature 0 --max-new-tokens 4 --threads 1"
                                        " --log-level debug");
    ASSERT_EQ(chat.exit_code, 0) << chat.output;
    EXPECT_NE(chat.output.find("chat prompt: \"user: hi\\n\\nassistant: \""), std::string::npos)
        << chat.output;
    EXPECT_NE(chat.output.find("chat prompt: \"user: hi\\n\\nassistant: aaaa\\n\\nuser: "
                               "bye\\n\\nassistant: \""),
              std::string::npos)
        << chat.output;
    const auto many = test::run_command(test::build_path("inference") + " " + (dir / "m.bin") +
                                        " --chat --num-samples 2");
    EXPECT_EQ(many.exit_code, 2) << many.output;
}

TEST_F(InferenceProgram, FlagErrorUnderMpiIsPrintedOnce) {
    const auto r = inference(path("model.bin") + " --temperature -1 --num-samples 2", 2);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(count(r.output, "error: --temperature: must be >= 0 (got -1)"), 1u) << r.output;
    const auto corpus = inference(path("model.bin") + " --tokenizer char", 2);
    EXPECT_EQ(corpus.exit_code, 2) << corpus.output;
    EXPECT_EQ(count(corpus.output, "error: --tokenizer char needs --tokenizer-corpus"), 1u)
        << corpus.output;
}

}  // namespace
}  // namespace gpt2
