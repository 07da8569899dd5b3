// GGUF for llama.cpp (src/formats/gguf): the file's structure read back by a reader written here
// from the format's description, and llama.cpp itself (node-llama-cpp, pinned 3.21.1, installed by
// `GPT2_WITH_LLAMA_CPP=1 scripts/setup.sh`; skips, saying why, where absent) running our files.
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
#include "gguf_support.hpp"
#include "model/forward_backward.hpp"
#include "model/generate.hpp"
#include "ops/gemm.hpp"
#include "process_support.hpp"
#include "test_support.hpp"

namespace gpt2 {
namespace {

using namespace formats_test;  // fs, json, run_command, ScratchDir and the helpers

// ---- GGUF ------------------------------------------------------------------------------------

TEST(Gguf, TheFileHoldsLlamaCppsNamesTheTokenizerAndQ8BlocksWithinHalfAStep) {
    if (!has_gpt2_files()) GTEST_SKIP() << "no GPT-2 tokenizer files in " << kGpt2Dir;
    const ScratchDir dir("gpt2-formats-gguf");
    const Model model = small_model(50257, 19);
    const auto tokenizer = load_gpt2_tokenizer(kGpt2Dir);
    write_gguf(dir.path() / "f32.gguf", model, *tokenizer, GgufWeights::F32, "test");
    write_gguf(dir.path() / "q8.gguf", model, *tokenizer, GgufWeights::Q8_0, "test");
    const GgufFile f32 = read_gguf(dir.path() / "f32.gguf");
    EXPECT_EQ(f32.kv.at("general.architecture"), "gpt2");
    EXPECT_EQ(f32.kv.at("gpt2.block_count"), 2);
    EXPECT_EQ(f32.kv.at("gpt2.context_length"), 64);
    EXPECT_EQ(f32.kv.at("tokenizer.ggml.pre"), "gpt-2");
    EXPECT_EQ(f32.kv.at("tokenizer.ggml.tokens").size(), 50257u);
    EXPECT_EQ(f32.kv.at("tokenizer.ggml.token_type")[50256], 3);
    EXPECT_EQ(f32.kv.at("tokenizer.ggml.merges").size(), 50000u);
    EXPECT_EQ(f32.kv.at("tokenizer.ggml.eos_token_id"), 50256);
    EXPECT_EQ(f32.tensors.size(), 4u + 12u * 2u);
    const GgufTensor& up = f32.tensors.at("blk.1.ffn_up.weight");
    EXPECT_EQ(up.ne, (std::vector<std::uint64_t>{64, 256}));
    const float* fcw = model.layout.layer(model.weights(), ParamTensor::fcw, 1).data();
    std::vector<float> stored(64 * 256);
    std::memcpy(stored.data(), f32.bytes.data() + f32.data + up.offset, stored.size() * 4);
    expect_bitwise(stored, std::span(fcw, stored.size()));

    const GgufFile q8 = read_gguf(dir.path() / "q8.gguf");
    EXPECT_EQ(q8.tensors.at("blk.1.ffn_up.bias").type, 0u);  // 1-D stays F32
    const GgufTensor& q = q8.tensors.at("blk.1.ffn_up.weight");
    ASSERT_EQ(q.type, 8u);
    for (std::size_t block = 0; block < stored.size() / 32; ++block) {
        const std::uint8_t* b = q8.bytes.data() + q8.data + q.offset + block * 34;
        std::uint16_t d_bits;
        std::memcpy(&d_bits, b, 2);
        const float d = half_to_float(d_bits);
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i)
            amax = std::max(amax, std::abs(stored[block * 32 + i]));
        ASSERT_NEAR(d, amax / 127.0f, amax / 127.0f * 1e-3);
        for (int i = 0; i < 32; ++i) {
            const float value = d * static_cast<float>(static_cast<std::int8_t>(b[2 + i]));
            ASSERT_NEAR(value, stored[block * 32 + i], 0.5f * d + amax * 1e-3f)
                << block << "," << i;
        }
    }
}

// A char tokenizer is embedded as a BPE without merges: its bytes in GPT-2's spelling, all normal
// tokens, and (having no end-of-text) its newline as llama.cpp's bos/eos, which it never adds.
TEST(Gguf, ACharTokenizerIsEmbeddedAsABpeWithoutMerges) {
    const ScratchDir dir("gpt2-formats-gguf-char");
    const auto chars = make_char_tokenizer("ROMEO:\nO, she doth teach the torches to burn bright!");
    const Model model = small_model(chars->vocab_size(), 25, 32);
    write_gguf(dir.path() / "char.gguf", model, *chars, GgufWeights::Q8_0, "char");
    const GgufFile f = read_gguf(dir.path() / "char.gguf");
    const SpelledBpe spelled = spell_byte_level_bpe(*chars);
    EXPECT_EQ(f.kv.at("tokenizer.ggml.model"), "gpt2");
    EXPECT_EQ(f.kv.at("tokenizer.ggml.tokens"), json(spelled.tokens));
    EXPECT_EQ(f.kv.at("tokenizer.ggml.tokens")[0], "\xC4\x8A");  // "\n", the smallest byte
    EXPECT_EQ(f.kv.at("tokenizer.ggml.token_type"),
              json(std::vector<int>(static_cast<std::size_t>(chars->vocab_size()), 1)));
    EXPECT_EQ(f.kv.at("tokenizer.ggml.merges"), json::array());
    EXPECT_EQ(f.kv.at("tokenizer.ggml.bos_token_id"), chars->encode("\n").at(0));
    EXPECT_EQ(f.kv.at("tokenizer.ggml.eos_token_id"), chars->encode("\n").at(0));
    EXPECT_EQ(f.kv.at("tokenizer.ggml.add_bos_token"), false);
    EXPECT_EQ(f.tensors.at("token_embd.weight").ne,
              (std::vector<std::uint64_t>{32, static_cast<std::uint64_t>(chars->vocab_size())}));
    // Without a newline in the alphabet, token 0 (what inference starts from then).
    const auto no_newline = make_char_tokenizer("abc");
    write_gguf(dir.path() / "abc.gguf", small_model(3, 25, 32), *no_newline, GgufWeights::F32,
               "abc");
    EXPECT_EQ(read_gguf(dir.path() / "abc.gguf").kv.at("tokenizer.ggml.eos_token_id"), 0);
}

// A random model whose logits have clear winners (wte scaled up), so that greedy decoding by two
// implementations can be compared token for token.
Model confident_model() {
    Model model = small_model(50257, 21);
    for (float& w : model.layout.tensor(model.params.span(), ParamTensor::wte))
        w *= 25.0f;
    return model;
}

TEST(LlamaCpp, RunsOurGgufAsWeDo) {
    if (!fs::exists(kLlamaModules / "node-llama-cpp")) {
        GTEST_SKIP() << "node-llama-cpp is not installed in " << kLlamaModules
                     << " (GPT2_WITH_LLAMA_CPP=1 scripts/setup.sh installs it)";
    }
    if (!has_gpt2_files()) GTEST_SKIP() << "no GPT-2 tokenizer files in " << kGpt2Dir;
    const ScratchDir dir("gpt2-formats-llama");
    const Model model = confident_model();
    const auto tokenizer = load_gpt2_tokenizer(kGpt2Dir);
    const std::string text =
        "Hello, world! It's 2026: naïve cafés,   three spaces\n\nand 12345 digits.";
    const std::vector<std::int32_t> prompt = tokenizer->encode("The quick brown fox");
    const std::vector<std::int32_t> forced = tokenizer->encode(
        "First Citizen: Before we proceed any further, hear me speak. All: Speak, speak.");
    constexpr int kNew = 24;
    const auto greedy = [&](const Model& m) {
        std::vector<std::int32_t> tokens = prompt;
        Rng rng(1);
        generate_recompute(m, tokens, kNew, SamplingParams{0.0f, 0, 1.0f}, rng);
        return std::vector<std::int32_t>(tokens.begin() + static_cast<long>(prompt.size()),
                                         tokens.end());
    };
    // Our greedy continuation on the weights as each format rounds them (F16 and BF16 through a
    // Hugging Face export of that type), and how many of its first steps have a clear top-1.
    struct Rounded {
        std::vector<std::int32_t> tokens;
        std::size_t confident = 0;
    };
    const auto rounded_greedy = [&](ElementType type) {
        write_hugging_face_model(dir.path() / "hf", model, nullptr, type);
        const Model rounded = load_model_file(dir.path() / "hf").model;
        Rounded r{greedy(rounded), 0};
        std::vector<std::int32_t> context = prompt;
        context.insert(context.end(), r.tokens.begin(), r.tokens.end());
        const std::vector<float> logits = our_logits(rounded, context);
        for (; r.confident < r.tokens.size(); ++r.confident) {
            const std::size_t row = prompt.size() - 1 + r.confident;
            std::vector<float> v(logits.begin() + static_cast<long>(row * 50257),
                                 logits.begin() + static_cast<long>((row + 1) * 50257));
            std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<>());
            if (v[0] - v[1] < 0.05f * std::abs(v[0])) break;
        }
        return r;
    };
    const std::vector<std::pair<GgufWeights, std::string>> files = {
        {GgufWeights::F32, "f32.gguf"},
        {GgufWeights::F16, "f16.gguf"},
        {GgufWeights::Bf16, "bf16.gguf"},
        {GgufWeights::Q8_0, "q8.gguf"}};
    for (const auto& [weights, name] : files)
        write_gguf(dir.path() / name, model, *tokenizer, weights, "test");
    const auto at = [&](const std::string& name) { return (dir.path() / name).string(); };
    const json jobs = {
        {{"model", at("f32.gguf")}, {"mode", "tokenize"}, {"text", text}},
        {{"model", at("f32.gguf")}, {"mode", "greedy"}, {"ids", prompt}, {"count", kNew}},
        {{"model", at("f16.gguf")}, {"mode", "greedy"}, {"ids", prompt}, {"count", kNew}},
        {{"model", at("bf16.gguf")}, {"mode", "greedy"}, {"ids", prompt}, {"count", kNew}},
        {{"model", at("q8.gguf")}, {"mode", "teacher"}, {"ids", forced}},
    };
    const std::vector<std::vector<std::int32_t>> theirs = llama(dir.path(), jobs);
    ASSERT_EQ(theirs.size(), jobs.size());

    // The embedded tokenizer splits text as ours does; F32 decodes token for token as we do, and
    // as build/inference --temperature 0 does from the checkpoint the GGUF was made from.
    EXPECT_EQ(theirs[0], tokenizer->encode(text));
    EXPECT_EQ(theirs[1], greedy(model));
    save_checkpoint(dir.path() / "ckpt.bin", model, CheckpointExtras{tokenizer->serialize(), ""});
    const auto inference = run_command(test::build_path("inference") + " " + (dir / "ckpt.bin") +
                                       " --temperature 0 --max-new-tokens " + std::to_string(kNew) +
                                       " --prompt 'The quick brown fox' --no-stream --threads 1 "
                                       "--log-level warn");
    ASSERT_EQ(inference.exit_code, 0) << inference.output;
    std::vector<std::int32_t> continued = prompt;
    continued.insert(continued.end(), theirs[1].begin(), theirs[1].end());
    EXPECT_EQ(inference.output, tokenizer->decode(continued) + "\n");
    // F16 and BF16: llama.cpp also rounds activations, so compare while our top-1 margin (on the
    // rounded weights) is wide enough for that rounding not to matter.
    for (const auto& [index, type] : {std::pair{2, ElementType::F16}, {3, ElementType::Bf16}}) {
        const Rounded ours = rounded_greedy(type);
        EXPECT_GE(ours.confident, 8u)
            << "too few confident steps to judge " << element_type_name(type);
        const auto n = static_cast<long>(ours.confident);
        EXPECT_EQ(std::vector<std::int32_t>(theirs[index].begin(), theirs[index].begin() + n),
                  std::vector<std::int32_t>(ours.tokens.begin(), ours.tokens.begin() + n))
            << element_type_name(type);
    }
    // Q8_0: the top-1 token after each prefix of a text agrees at >= 90% of positions.
    const std::vector<float> logits = our_logits(model, forced);
    ASSERT_EQ(theirs[4].size(), forced.size());
    std::size_t agree = 0;
    for (std::size_t t = 0; t < forced.size(); ++t) {
        const auto row = logits.begin() + static_cast<long>(t * 50257);
        agree += theirs[4][t] == std::max_element(row, row + 50257) - row;
    }
    EXPECT_GE(agree * 10, forced.size() * 9) << agree << " of " << forced.size();
}

// The newcomer's path: a char model trained by train_gpt2, converted by convert_model to F32 GGUF.
// llama.cpp tokenizes text as our char tokenizer does and continues a prompt greedily as our
// generator does; scripts/llama_generate.sh, run from another directory, prints what
// build/inference --temperature 0 prints.
TEST(LlamaCpp, RunsATrainedCharModelsGgufAsWeDo) {
    if (!fs::exists(kLlamaModules / "node-llama-cpp")) {
        GTEST_SKIP() << "node-llama-cpp is not installed in " << kLlamaModules
                     << " (GPT2_WITH_LLAMA_CPP=1 scripts/setup.sh installs it)";
    }
    const ScratchDir dir("gpt2-formats-llama-char");
    test::write_corpus(dir.path() / "corpus.txt", 20000);
    const auto trained = run_command(
        test::build_path("train_gpt2") + test::small_model(64) +
        " --batch-size 4 --max-steps 60 --lr 1e-2 --threads 1 --val-every 0 --sample-every 0 "
        "--data " +
        (dir / "corpus.txt") + " --out-dir " + (dir / "out"));
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
    const fs::path checkpoint = dir.path() / "out" / "model_000060.bin";
    const auto converted = run_command(test::build_path("convert_model") + " " +
                                       checkpoint.string() + " " + (dir / "char.gguf"));
    ASSERT_EQ(converted.exit_code, 0) << converted.output;

    const LoadedModel loaded = load_model_file(checkpoint);
    const auto tokenizer = embedded_tokenizer(loaded);
    ASSERT_EQ(tokenizer->kind(), TokenizerKind::Char);
    const std::string prompt_text = "the king ";
    const std::vector<std::int32_t> prompt = tokenizer->encode(prompt_text);
    constexpr int kNew = 40;
    std::vector<std::int32_t> ours = prompt;
    Rng rng(1);
    generate_recompute(loaded.model, ours, kNew, SamplingParams{0.0f, 0, 1.0f}, rng);
    // The comparison means something only where our top-1 is clear of the runner-up by more than
    // two implementations' float rounding: the trained model is that confident at every step.
    const std::vector<float> logits = our_logits(loaded.model, ours);
    const auto V = static_cast<std::size_t>(loaded.model.config.vocab_size);
    for (std::size_t row = prompt.size() - 1; row + 1 < ours.size(); ++row) {
        std::vector<float> v(logits.begin() + static_cast<long>(row * V),
                             logits.begin() + static_cast<long>((row + 1) * V));
        std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<>());
        ASSERT_GT(v[0] - v[1], 1e-3f) << "a near tie at position " << row;
    }

    const std::string text = "the king shall speak\nof love and war to thee my lord";
    const json jobs = {
        {{"model", dir / "char.gguf"}, {"mode", "tokenize"}, {"text", text}},
        {{"model", dir / "char.gguf"}, {"mode", "greedy"}, {"ids", prompt}, {"count", kNew}},
    };
    const std::vector<std::vector<std::int32_t>> theirs = llama(dir.path(), jobs);
    ASSERT_EQ(theirs.size(), jobs.size());
    EXPECT_EQ(theirs[0], tokenizer->encode(text));
    EXPECT_EQ(theirs[1], std::vector<std::int32_t>(ours.begin() + static_cast<long>(prompt.size()),
                                                   ours.end()));

    const auto inference =
        run_command(test::build_path("inference") + " " + checkpoint.string() + " --prompt '" +
                    prompt_text + "' --temperature 0 --max-new-tokens " + std::to_string(kNew) +
                    " --no-stream --threads 1 --log-level warn");
    ASSERT_EQ(inference.exit_code, 0) << inference.output;
    EXPECT_EQ(inference.output, tokenizer->decode(ours) + "\n");
    fs::create_directories(dir.path() / "elsewhere");
    const auto generated =
        run_command("cd " + (dir / "elsewhere") + " && " + std::string(GPT2_SOURCE_DIR) +
                    "/scripts/llama_generate.sh ../char.gguf --prompt '" + prompt_text +
                    "' --temperature 0 --max-new-tokens " + std::to_string(kNew));
    ASSERT_EQ(generated.exit_code, 0) << generated.output;
    EXPECT_EQ(generated.output, inference.output);
}

// scripts/llama_generate.sh chooses llama.cpp's threads as our programs choose workers: at most
// one per core it may run on, and one per 50M parameters below that (llama.cpp's threads spin at
// every operation: a 30M-parameter model decoded 1.4x faster on 1 thread than on 2 of 2 idle cores,
// and 5x faster than on node-llama-cpp's default); --threads N is taken as given.
TEST(LlamaCpp, TheScriptTakesAThreadPerFiftyMillionParametersAtMostOnePerCore) {
    if (!fs::exists(kLlamaModules / "node-llama-cpp")) {
        GTEST_SKIP() << "node-llama-cpp is not installed in " << kLlamaModules;
    }
    if (!has_gpt2_files()) GTEST_SKIP() << "no GPT-2 tokenizer files in " << kGpt2Dir;
    const ScratchDir dir("gpt2-llama-threads");
    test::write_corpus(dir.path() / "corpus.txt", 20000);
    // GPT-2's vocabulary and one wide layer: 28.9M parameters in a few seconds of set-up.
    const auto made =
        run_command(test::build_path("train_gpt2") +
                    " --n-layer 1 --n-head 8 --n-embd 512 --seq-len 16 --tokenizer gpt2"
                    " --tokenizer-dir " +
                    kGpt2Dir.string() + " --batch-size 1 --threads 1 --max-steps 1" +
                    " --val-every 0 --sample-every 0 --data " + (dir / "corpus.txt") +
                    " --out-dir " + (dir / "out"));
    ASSERT_EQ(made.exit_code, 0) << made.output;
    ASSERT_EQ(run_command(test::build_path("convert_model") + " " + (dir / "out") + " " +
                          (dir / "m.gguf"))
                  .exit_code,
              0);
    const std::string script = std::string(GPT2_SOURCE_DIR) + "/scripts/llama_generate.sh " +
                               (dir / "m.gguf") + " --prompt the --max-new-tokens 2 --verbose";
    const auto chosen = run_command(script);
    ASSERT_EQ(chosen.exit_code, 0) << chosen.output;
    EXPECT_NE(chosen.output.find("llama_generate.sh: 1 thread (28.9M parameters"),
              std::string::npos)
        << chosen.output;
    const auto given = run_command(script + " --threads 3");
    ASSERT_EQ(given.exit_code, 0) << given.output;
    EXPECT_NE(given.output.find("llama_generate.sh: 3 threads (--threads)"), std::string::npos)
        << given.output;
}

}  // namespace
}  // namespace gpt2
