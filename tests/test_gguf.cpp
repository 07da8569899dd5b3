// GGUF for llama.cpp (src/formats/gguf): the file's structure read back by a reader written here
// from the format's description, and llama.cpp itself (node-llama-cpp, pinned 3.21.1, installed by
// `GPT2_WITH_LLAMA_CPP=1 scripts/setup.sh`; skips, saying why, where absent) running our files.
#include <gtest/gtest.h>

#include <algorithm>
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
#include "formats/element_type.hpp"
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

// ---- Reading GGUF ------------------------------------------------------------------------------

// Every model written as GGUF reads back as the weights its type holds (F32 bitwise; F16, BF16
// and Q8_0 as those types round them; 1-D tensors and wpe stay as written), with the same
// tokenizer (char, trained BPE and GPT-2's), so every program that reads a model reads GGUF.
TEST(GgufImport, EveryTypeAndTokenizerReadsBackAsWritten) {
    const ScratchDir dir("gpt2-gguf-import");
    std::vector<std::unique_ptr<Tokenizer>> tokenizers;
    tokenizers.push_back(make_char_tokenizer("ROMEO:\nO, she doth teach the torches to burn!"));
    tokenizers.push_back(train_bpe_tokenizer(
        "the king shall speak of love and war to thee my lord, what night is fair", 300));
    if (has_gpt2_files()) tokenizers.push_back(load_gpt2_tokenizer(kGpt2Dir));
    for (const auto& tokenizer : tokenizers) {
        const Model model = small_model(tokenizer->vocab_size(), 31, 64);
        for (const GgufWeights type :
             {GgufWeights::F32, GgufWeights::F16, GgufWeights::Bf16, GgufWeights::Q8_0}) {
            const fs::path file = dir.path() / "m.gguf";
            write_gguf(file, model, *tokenizer, type, "m");
            const LoadedModel loaded = load_model_file(file);
            ASSERT_EQ(loaded.model.config, model.config);
            ASSERT_TRUE(loaded.extras.has_value());
            // The same tokenizer: a trained BPE comes back as GPT-2's kind of BPE over its own
            // vocabulary and merges (spellings hold no kind), which encodes every text alike.
            const std::unique_ptr<Tokenizer> read = embedded_tokenizer(loaded);
            if (tokenizer->kind() == TokenizerKind::Bpe) {
                EXPECT_EQ(read->vocab_size(), tokenizer->vocab_size());
                EXPECT_EQ(read->eot_id(), tokenizer->eot_id());
                const std::string text = "the king shall speak, my lord <|endoftext|> fair night";
                EXPECT_EQ(read->encode(text), tokenizer->encode(text));
            } else {
                EXPECT_EQ(read->serialize(), tokenizer->serialize());
            }
            for (int i = 0; i < kNumParamTensors; ++i) {
                const auto t = static_cast<ParamTensor>(i);
                std::span<const float> written = model.layout.tensor(model.weights(), t);
                std::span<const float> read = loaded.model.layout.tensor(loaded.model.weights(), t);
                const auto V = static_cast<std::size_t>(model.config.vocab_size);
                const auto C = static_cast<std::size_t>(model.config.channels);
                if (t == ParamTensor::wte) {  // the padded rows are zero
                    for (const float pad : read.subspan(V * C))
                        ASSERT_EQ(pad, 0.0f);
                    written = written.first(V * C);
                    read = read.first(V * C);
                }
                const bool matrix =
                    t == ParamTensor::wte || t == ParamTensor::wpe || model.layout.decays(t);
                expect_bitwise(read, rounded_as(written, matrix ? type : GgufWeights::F32));
            }
        }
    }
}

// A GGUF that llama.cpp's own tooling wrote: llama_model_quantize (llama.cpp's llama-quantize, in
// node-llama-cpp's libllama) turns our F32 file into its Q8_0 file; read back, its weights are our
// weights as Q8_0 rounds them (ggml's quantizer and ours round alike but perhaps at an exact tie:
// at most one step there), and inference continues a prompt with the text it gives from the
// checkpoint's own Q8_0 file.
TEST(GgufImport, AFileLlamaCppsQuantizerWroteReadsAsOursDoes) {
    const fs::path lib =
        kLlamaModules / "@node-llama-cpp/linux-x64/bins/linux-x64/libllama.v0.4.0.so";
    if (!fs::exists(lib)) GTEST_SKIP() << "node-llama-cpp's libllama is not installed: " << lib;
#ifdef GPT2_SANITIZER_BUILD
    GTEST_SKIP() << "llama.cpp's library is not built for the sanitizers";
#endif
    const ScratchDir dir("gpt2-gguf-llama-quantized");
    const auto chars = make_char_tokenizer("ROMEO:\nO, she doth teach the torches to burn bright!");
    const Model model = small_model(chars->vocab_size(), 33, 64);
    write_gguf(dir.path() / "f32.gguf", model, *chars, GgufWeights::F32, "m");
    write_gguf(dir.path() / "ours-q8.gguf", model, *chars, GgufWeights::Q8_0, "m");
    ASSERT_TRUE(llama_quantize_q8_0(lib, dir.path() / "f32.gguf", dir.path() / "llama-q8.gguf"));
    const GgufFile written = read_gguf(dir.path() / "llama-q8.gguf");
    EXPECT_EQ(written.tensors.at("blk.0.attn_qkv.weight").type, 8u);  // llama.cpp's Q8_0 indeed
    const LoadedModel theirs = load_model_file(dir.path() / "llama-q8.gguf");
    const LoadedModel ours = load_model_file(dir.path() / "ours-q8.gguf");
    ASSERT_EQ(theirs.model.config, ours.model.config);
    EXPECT_EQ(embedded_tokenizer(theirs)->serialize(), chars->serialize());
    // Each tensor read back is what llama.cpp stored: its Q8_0 as ours rounds (ggml's quantizer
    // may take the other side of an exact tie: one step, the block's largest weight / 127), and
    // what it left unquantized (position_embd, the 1-D tensors) exact.
    const std::span<const float> weights = model.weights();
    const std::span<const float> read = theirs.model.weights();
    const ParameterLayout& layout = model.layout;
    const auto V = static_cast<std::size_t>(model.config.vocab_size);
    const auto C = static_cast<std::size_t>(model.config.channels);
    std::vector<std::pair<std::string, std::pair<std::size_t, std::size_t>>> stored = {
        {"token_embd.weight", {layout.offset(ParamTensor::wte), V * C}},
        {"position_embd.weight", {layout.offset(ParamTensor::wpe), layout.size(ParamTensor::wpe)}},
        {"output_norm.weight", {layout.offset(ParamTensor::lnfw), C}},
        {"output_norm.bias", {layout.offset(ParamTensor::lnfb), C}}};
    const std::vector<std::pair<std::string, ParamTensor>> layer_names = {
        {"attn_norm.weight", ParamTensor::ln1w},       {"attn_norm.bias", ParamTensor::ln1b},
        {"attn_qkv.weight", ParamTensor::qkvw},        {"attn_qkv.bias", ParamTensor::qkvb},
        {"attn_output.weight", ParamTensor::attprojw}, {"attn_output.bias", ParamTensor::attprojb},
        {"ffn_norm.weight", ParamTensor::ln2w},        {"ffn_norm.bias", ParamTensor::ln2b},
        {"ffn_up.weight", ParamTensor::fcw},           {"ffn_up.bias", ParamTensor::fcb},
        {"ffn_down.weight", ParamTensor::fcprojw},     {"ffn_down.bias", ParamTensor::fcprojb}};
    for (int l = 0; l < model.config.num_layers; ++l) {
        for (const auto& [suffix, t] : layer_names) {
            const std::span<const float> values = layout.layer(weights, t, l);
            stored.push_back(
                {"blk." + std::to_string(l) + "." + suffix,
                 {static_cast<std::size_t>(values.data() - weights.data()), values.size()}});
        }
    }
    std::size_t quantized = 0;
    for (const auto& [name, where] : stored) {
        const auto [offset, count] = where;
        const std::uint32_t type = written.tensors.at(name).type;
        ASSERT_TRUE(type == 0 || type == 8) << name << " stored as type " << type;
        const std::span<const float> original = weights.subspan(offset, count);
        const std::span<const float> back = read.subspan(offset, count);
        if (type == 0) {
            expect_bitwise(back, original);
            continue;
        }
        ++quantized;
        const std::vector<float> expected = rounded_as(original, GgufWeights::Q8_0);
        for (std::size_t i = 0; i < count; ++i) {
            if (back[i] == expected[i]) continue;
            float amax = 0.0f;
            for (std::size_t k = i / 32 * 32; k < i / 32 * 32 + 32; ++k)
                amax = std::max(amax, std::abs(original[k]));
            ASSERT_LE(std::abs(back[i] - expected[i]), 1.01f * amax / 127.0f) << name << " " << i;
        }
    }
    EXPECT_GE(quantized, 1u + 4u * static_cast<std::size_t>(model.config.num_layers));
    for (const char* file : {"llama-q8.gguf", "ours-q8.gguf"}) {
        const auto generated = run_command(test::build_path("inference") + " " + (dir / file) +
                                           " --prompt ROMEO: --temperature 0 --max-new-tokens 30"
                                           " --threads 1 --log-level warn");
        ASSERT_EQ(generated.exit_code, 0) << generated.output;
        EXPECT_EQ(generated.output.substr(0, 6), "ROMEO:") << generated.output;
    }
}

// Every program that reads a model takes a GGUF: inference continues a prompt as from the
// checkpoint it came from (F32: the same weights), convert_model writes it as llm.c's file with
// the checkpoint's weights, and train_gpt2 --init-from starts from it.
TEST(GgufImport, TheProgramsReadGgufLikeTheCheckpointItCameFrom) {
    const ScratchDir dir("gpt2-gguf-programs");
    test::write_corpus(dir.path() / "corpus.txt", 20000);
    const auto trained = run_command(test::build_path("train_gpt2") + test::small_model(32) +
                                     " --batch-size 4 --max-steps 20 --lr 1e-2 --threads 1"
                                     " --val-every 0 --sample-every 0 --data " +
                                     (dir / "corpus.txt") + " --out-dir " + (dir / "out"));
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
    ASSERT_EQ(run_command(test::build_path("convert_model") + " " + (dir / "out") + " " +
                          (dir / "m.gguf"))
                  .exit_code,
              0);
    const std::string generate =
        " --prompt 'the king' --temperature 0 --max-new-tokens 40 "
        "--threads 1 --log-level warn";
    const auto from_checkpoint =
        run_command(test::build_path("inference") + " " + (dir / "out") + generate);
    const auto from_gguf =
        run_command(test::build_path("inference") + " " + (dir / "m.gguf") + generate);
    ASSERT_EQ(from_gguf.exit_code, 0) << from_gguf.output;
    EXPECT_EQ(from_gguf.output, from_checkpoint.output);
    const auto back = run_command(test::build_path("convert_model") + " " + (dir / "m.gguf") + " " +
                                  (dir / "back.bin"));
    ASSERT_EQ(back.exit_code, 0) << back.output;
    const LoadedModel original = load_model_file(dir.path() / "out");
    const LoadedModel converted = load_model_file(dir.path() / "back.bin");
    expect_bitwise(converted.model.weights(), original.model.weights());
    const auto tuned = run_command(test::build_path("train_gpt2") +
                                   " --seq-len 32 --batch-size 4 --max-steps 2 --threads 1 "
                                   "--val-every 0 --sample-every 0 --init-from " +
                                   (dir / "m.gguf") + " --data " + (dir / "corpus.txt") +
                                   " --out-dir " + (dir / "tuned"));
    EXPECT_EQ(tuned.exit_code, 0) << tuned.output;
    EXPECT_NE(tuned.output.find("step 2/2"), std::string::npos) << tuned.output;
}

// A GGUF bytes by hand: version 3, the given string keys, no tensors.
std::string gguf_with_keys(const std::vector<std::pair<std::string, std::string>>& keys) {
    std::string out = "GGUF";
    const auto put = [&out](auto value) {
        out.append(reinterpret_cast<const char*>(&value), sizeof(value));
    };
    const auto text = [&](const std::string& s) {
        put(static_cast<std::uint64_t>(s.size()));
        out += s;
    };
    put(std::uint32_t{3});
    put(std::uint64_t{0});
    put(static_cast<std::uint64_t>(keys.size()));
    for (const auto& [key, value] : keys) {
        text(key);
        put(std::uint32_t{8});
        text(value);
    }
    return out;
}

// A file that is no model of ours gets one line saying what it is: a GGUF of another architecture,
// a GGUF LoRA adapter, a token shard, a resume state; a tensor type the programs do not read is
// named; a truncated GGUF is damaged. inference, convert_model and --init-from alike.
TEST(GgufImport, AFileThatIsNoModelOfOursIsNamedForWhatItIs) {
    const ScratchDir dir("gpt2-gguf-not-ours");
    test::write_bytes(dir.path() / "qwen2.gguf",
                      gguf_with_keys({{"general.architecture", "qwen2"}}));
    test::write_bytes(dir.path() / "adapter.gguf", gguf_with_keys({{"general.architecture", "gpt2"},
                                                                   {"general.type", "adapter"},
                                                                   {"adapter.type", "lora"}}));
    std::string shard(1024, '\0');
    const std::int32_t shard_magic = 20240520;
    std::memcpy(shard.data(), &shard_magic, 4);
    test::write_bytes(dir.path() / "tokens.bin", shard);
    const auto chars = make_char_tokenizer("abcdefgh\n");
    const Model model = small_model(chars->vocab_size(), 35, 32);
    write_gguf(dir.path() / "q4.gguf", model, *chars, GgufWeights::F32, "m");
    {  // token_embd.weight's type made Q4_K (12): its u32 follows the name, dims and shape
        std::vector<std::uint8_t> bytes = read_file_bytes(dir.path() / "q4.gguf");
        const std::string key = "token_embd.weight";
        const auto at = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
        ASSERT_NE(at, bytes.end());
        const std::size_t type_at =
            static_cast<std::size_t>(at - bytes.begin()) + key.size() + 4 + 16;
        const std::uint32_t q4_k = 12;
        std::memcpy(bytes.data() + type_at, &q4_k, 4);
        test::write_bytes(dir.path() / "q4.gguf", bytes);
    }
    std::vector<std::uint8_t> truncated;
    write_gguf(dir.path() / "whole.gguf", model, *chars, GgufWeights::F32, "m");
    truncated = read_file_bytes(dir.path() / "whole.gguf");
    truncated.resize(truncated.size() - 100);
    test::write_bytes(dir.path() / "truncated.gguf", truncated);
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"qwen2.gguf",
         " is a GGUF model of llama.cpp's 'qwen2' architecture: the programs read "
         "its 'gpt2' and 'llama' architectures"},
        {"adapter.gguf",
         " is a GGUF lora adapter for llama.cpp's 'gpt2' architecture, not a "
         "model"},
        {"tokens.bin", " is an llm.c token shard, not a model file"},
        {"q4.gguf",
         ": tensor token_embd.weight is Q4_K (type 12): the programs read F32, F16, "
         "BF16 and Q8_0"},
        {"truncated.gguf",
         ": tensor blk.1.ffn_down.bias's data lies beyond the end of the file "
         "(truncated)"},
    };
    for (const auto& [file, expected] : cases) {
        for (const std::string& command :
             {test::build_path("inference") + " " + (dir / file) + " --max-new-tokens 1",
              test::build_path("convert_model") + " " + (dir / file) + " " + (dir / "x.bin")}) {
            const auto result = run_command(command);
            EXPECT_EQ(result.exit_code, 1) << command << "\n" << result.output;
            EXPECT_NE(result.output.find(dir / file + expected), std::string::npos)
                << command << "\n"
                << result.output;
            EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1)
                << command << "\n"
                << result.output;
        }
    }
    const auto init = run_command(test::build_path("train_gpt2") + " --init-from " +
                                  (dir / "qwen2.gguf") + " --max-steps 1 --out-dir " + (dir / "o"));
    EXPECT_EQ(init.exit_code, 1) << init.output;
    EXPECT_NE(init.output.find("is a GGUF model of llama.cpp's 'qwen2' architecture"),
              std::string::npos)
        << init.output;
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

// The Llama family's block out to llama.cpp's llama architecture: a llama-tiny char model trained
// by train_gpt2 (grouped-query attention, rotary positions, SwiGLU, RMSNorm; untied head),
// converted by convert_model; llama.cpp continues a prompt greedily as our training forward does,
// while our top-1 is clear of the runner-up (Q and K reach it in its rotary's row order).
TEST(LlamaCpp, RunsATrainedLlamaFamilyModelAsWeDo) {
    if (!fs::exists(kLlamaModules / "node-llama-cpp")) {
        GTEST_SKIP() << "node-llama-cpp is not installed in " << kLlamaModules
                     << " (GPT2_WITH_LLAMA_CPP=1 scripts/setup.sh installs it)";
    }
    const ScratchDir dir("gpt2-formats-llama-family");
    test::write_corpus(dir.path() / "corpus.txt", 20000);
    const auto trained = run_command(
        test::build_path("train_gpt2") +
        " --model llama-tiny --n-layer 2 --n-head 4 --n-embd 64 --seq-len 64 --batch-size 4"
        " --max-steps 60 --lr 1e-2 --threads 1 --val-every 0 --sample-every 0 --data " +
        (dir / "corpus.txt") + " --out-dir " + (dir / "out"));
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
    const fs::path checkpoint = dir.path() / "out" / "model_000060.bin";
    LoadedModel loaded = load_model_file(checkpoint);
    // An untied head too: the trained embedding as the head's start, moved a little.
    ModelConfig untied = loaded.model.config;
    untied.arch.tied_head = false;
    Model model(untied);
    for (const TensorSpec& spec : model.layout.specs()) {
        const ParamTensor from = spec.id == ParamTensor::lmheadw ? ParamTensor::wte : spec.id;
        const std::span<const float> values =
            loaded.model.layout.tensor(loaded.model.weights(), from);
        std::copy(values.begin(), values.end(),
                  model.layout.tensor(model.params.span(), spec.id).begin());
    }
    for (float& w : model.layout.tensor(model.params.span(), ParamTensor::lmheadw))
        w *= 1.25f;
    const auto tokenizer = embedded_tokenizer(loaded);
    save_checkpoint(dir.path() / "untied.bin", model, loaded.extras);
    for (const auto& [name, m] :
         {std::pair<std::string, const Model*>{"model_000060", &loaded.model},
          {"untied", &model}}) {
        const fs::path source = name == "untied" ? dir.path() / "untied.bin" : checkpoint;
        const auto converted = run_command(test::build_path("convert_model") + " " +
                                           source.string() + " " + (dir / (name + ".gguf")));
        ASSERT_EQ(converted.exit_code, 0) << converted.output;
        const std::vector<std::int32_t> prompt = tokenizer->encode("the king ");
        constexpr int kNew = 40;
        std::vector<std::int32_t> ours = prompt;
        Rng rng(1);
        generate_recompute(*m, ours, kNew, SamplingParams{0.0f, 0, 1.0f}, rng);
        const std::vector<float> logits = our_logits(*m, ours);
        const auto V = static_cast<std::size_t>(m->config.vocab_size);
        std::size_t confident = 0;
        for (std::size_t row = prompt.size() - 1; row + 1 < ours.size(); ++row, ++confident) {
            std::vector<float> v(logits.begin() + static_cast<long>(row * V),
                                 logits.begin() + static_cast<long>((row + 1) * V));
            std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<>());
            if (v[0] - v[1] <= 1e-3f) break;
        }
        ASSERT_GE(confident, 10u) << name << ": too few confident steps to judge";
        const json jobs = {{{"model", dir / (name + ".gguf")},
                            {"mode", "greedy"},
                            {"ids", prompt},
                            {"count", kNew}}};
        const std::vector<std::vector<std::int32_t>> theirs = llama(dir.path(), jobs);
        ASSERT_EQ(theirs.size(), 1u);
        const auto n = static_cast<long>(confident);
        EXPECT_EQ(std::vector<std::int32_t>(theirs[0].begin(), theirs[0].begin() + n),
                  std::vector<std::int32_t>(ours.begin() + static_cast<long>(prompt.size()),
                                            ours.begin() + static_cast<long>(prompt.size()) + n))
            << name;
        // build/inference decodes the checkpoint with its KV cache as the training forward does.
        const auto inference =
            run_command(test::build_path("inference") + " " + source.string() +
                        " --prompt 'the king ' --temperature 0 --max-new-tokens " +
                        std::to_string(confident) + " --no-stream --threads 1 --log-level warn");
        ASSERT_EQ(inference.exit_code, 0) << inference.output;
        EXPECT_EQ(inference.output,
                  tokenizer->decode(std::span(ours).first(prompt.size() + confident)) + "\n")
            << name;
    }
}

// A Llama-family Hugging Face directory (the stand-in of docs/llama.md: SmolLM2's layout, BF16,
// random weights, 4 query heads over 2 key/value heads) converted to GGUF: llama.cpp continues a
// prompt greedily as our forward does, over the steps whose choice is clear.
TEST(LlamaCpp, RunsAHuggingFaceLlamaDirectoryAsWeDo) {
    if (!fs::exists(kLlamaModules / "node-llama-cpp")) {
        GTEST_SKIP() << "node-llama-cpp is not installed in " << kLlamaModules
                     << " (GPT2_WITH_LLAMA_CPP=1 scripts/setup.sh installs it)";
    }
    const ScratchDir dir("gpt2-formats-hf-llama");
    const fs::path standin = fs::path(GPT2_TEST_DATA_DIR) / "hf_llama_standin";
    const auto converted = run_command(test::build_path("convert_model") + " " + standin.string() +
                                       " " + (dir / "standin.gguf"));
    ASSERT_EQ(converted.exit_code, 0) << converted.output;
    const LoadedModel loaded = load_model_file(standin);
    const auto tokenizer = embedded_tokenizer(loaded);
    const std::vector<std::int32_t> prompt = tokenizer->encode("ROMEO: the ");
    constexpr int kNew = 24;
    std::vector<std::int32_t> ours = prompt;
    Rng rng(1);
    generate_recompute(loaded.model, ours, kNew, SamplingParams{0.0f, 0, 1.0f}, rng);
    const std::vector<float> logits = our_logits(loaded.model, ours);
    const auto V = static_cast<std::size_t>(loaded.model.config.vocab_size);
    std::size_t confident = 0;
    for (std::size_t row = prompt.size() - 1; row + 1 < ours.size(); ++row, ++confident) {
        std::vector<float> v(logits.begin() + static_cast<long>(row * V),
                             logits.begin() + static_cast<long>((row + 1) * V));
        std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<>());
        if (v[0] - v[1] <= 1e-3f) break;
    }
    ASSERT_GE(confident, 8u) << "too few confident steps to judge";
    const json jobs = {
        {{"model", dir / "standin.gguf"}, {"mode", "greedy"}, {"ids", prompt}, {"count", kNew}}};
    const std::vector<std::vector<std::int32_t>> theirs = llama(dir.path(), jobs);
    ASSERT_EQ(theirs.size(), 1u);
    const auto n = static_cast<long>(confident);
    EXPECT_EQ(std::vector<std::int32_t>(theirs[0].begin(), theirs[0].begin() + n),
              std::vector<std::int32_t>(ours.begin() + static_cast<long>(prompt.size()),
                                        ours.begin() + static_cast<long>(prompt.size()) + n));
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
