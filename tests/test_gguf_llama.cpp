// GGUF's llama architecture in: what convert_model writes for the Llama family reads back as the
// weights its type holds (F32 bitwise, so Q's and K's rows come back from llama.cpp's rotary order
// exactly; F16, BF16 and Q8_0 as those types round them), tied and untied, with grouped-query
// heads; the programs take it as they take the checkpoint it came from; a Q8_0 file llama.cpp's
// own quantizer wrote reads as ours does; settings the block cannot compute are refused by key.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/file_io.hpp"
#include "formats/checkpoint.hpp"
#include "formats/gguf.hpp"
#include "formats/model_file.hpp"
#include "formats/model_tokenizer.hpp"
#include "formats_support.hpp"
#include "gguf_support.hpp"
#include "process_support.hpp"
#include "random_model.hpp"
#include "test_support.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {
namespace {

using namespace formats_test;  // fs, json, run_command, ScratchDir and the helpers

const std::string kText =
    "the king shall speak of love and war to thee my lord, what night is fair";

// The Llama family's block over `vocab` tokens: 4 query heads over 2 key/value heads of 16, a
// SwiGLU of 96, rotary theta 100000 (SmolLM2's), random.
Model llama_model(int vocab, bool tied, std::uint64_t seed) {
    Architecture a;
    a.norm = NormKind::RmsNorm;
    a.positions = PositionKind::Rotary;
    a.rope_theta = 100000.0f;
    a.mlp = MlpKind::SwiGlu;
    a.mlp_hidden = 96;
    a.biases = false;
    a.kv_heads = 2;
    a.tied_head = tied;
    const ModelConfig config(32, vocab, pad_vocab(vocab), 2, 4, 64, a);
    Model model = std::move(*test::random_model(config, seed, 3.0f));
    for (const ParamTensor t : {ParamTensor::wte, ParamTensor::lmheadw}) {
        if (!model.layout.has(t)) continue;
        const std::span<float> rows = model.layout.tensor(model.params.span(), t);
        std::fill(rows.begin() + static_cast<long>(vocab) * 64, rows.end(), 0.0f);  // padding
    }
    return model;
}

// Whether tensor `t` is a matrix GGUF stores in the file's type (1-D tensors stay F32).
bool stored_in_type(ParamTensor t) {
    return t == ParamTensor::wte || t == ParamTensor::lmheadw || is_layer_matrix(t);
}

TEST(GgufLlamaImport, EveryTypeReadsBackAsWrittenTiedAndUntied) {
    const ScratchDir dir("gpt2-gguf-llama-import");
    const auto tokenizer = train_bpe_tokenizer(kText, 300);
    for (const bool tied : {true, false}) {
        const Model model = llama_model(tokenizer->vocab_size(), tied, tied ? 41 : 42);
        for (const GgufWeights type :
             {GgufWeights::F32, GgufWeights::F16, GgufWeights::Bf16, GgufWeights::Q8_0}) {
            const fs::path file = dir.path() / "m.gguf";
            write_gguf(file, model, *tokenizer, type, "m");
            const LoadedModel loaded = load_model_file(file);
            ASSERT_EQ(loaded.model.config, model.config) << describe(loaded.model.config);
            EXPECT_EQ(embedded_tokenizer(loaded)->encode(kText), tokenizer->encode(kText));
            for (const TensorSpec& spec : model.layout.specs()) {
                const std::span<const float> written =
                    model.layout.tensor(model.weights(), spec.id);
                const std::span<const float> read =
                    loaded.model.layout.tensor(loaded.model.weights(), spec.id);
                SCOPED_TRACE(std::string(param_tensor_name(spec.id)) +
                             (tied ? " tied" : " untied"));
                expect_bitwise(
                    read, rounded_as(written, stored_in_type(spec.id) ? type : GgufWeights::F32));
            }
        }
    }
}

// The Hugging Face stand-in of docs/llama.md through GGUF and back: the same weights bit for bit,
// and inference, convert_model and --init-from take the GGUF as they take the directory.
TEST(GgufLlamaImport, TheProgramsReadALlamaGgufLikeTheDirectoryItCameFrom) {
    const ScratchDir dir("gpt2-gguf-llama-programs");
    const fs::path standin = fs::path(GPT2_TEST_DATA_DIR) / "hf_llama_standin";
    const auto converted = run_command(test::build_path("convert_model") + " " + standin.string() +
                                       " " + (dir / "standin.gguf"));
    ASSERT_EQ(converted.exit_code, 0) << converted.output;
    const LoadedModel original = load_model_file(standin);
    const LoadedModel read = load_model_file(dir.path() / "standin.gguf");
    ASSERT_EQ(read.model.config, original.model.config);
    expect_bitwise(read.model.weights(), original.model.weights());
    const auto generate = [&](const std::string& source) {
        const auto r = run_command(test::build_path("inference") + " " + source +
                                   " --prompt 'ROMEO: the ' --temperature 0 --max-new-tokens 12"
                                   " --no-stream --threads 1 --log-level warn");
        EXPECT_EQ(r.exit_code, 0) << r.output;
        return r.output;
    };
    EXPECT_EQ(generate(dir / "standin.gguf"), generate(standin.string()));
    const auto back = run_command(test::build_path("convert_model") + " " + (dir / "standin.gguf") +
                                  " " + (dir / "back-hf"));
    ASSERT_EQ(back.exit_code, 0) << back.output;
    EXPECT_EQ(
        json::parse(read_text_file(dir.path() / "back-hf/config.json")).at("architectures").at(0),
        "LlamaForCausalLM");
    test::write_corpus(dir.path() / "corpus.txt", 4000);
    const auto trained = run_command(
        test::build_path("train_gpt2") + " --init-from " + (dir / "standin.gguf") +
        " --seq-len 16 --batch-size 2 --max-steps 1 --val-every 0 --sample-every 0 --threads 1"
        " --data " +
        (dir / "corpus.txt") + " --out-dir " + (dir / "out") + " 2>&1");
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
}

// A Q8_0 llama GGUF that llama.cpp's quantizer (llama_model_quantize, in node-llama-cpp's
// libllama) wrote from our F32 file: every weight within one Q8_0 step of ours (ggml may take the
// other side of an exact tie; its blocks lie along rows, which the rotary reordering moves whole),
// and inference runs it.
TEST(GgufLlamaImport, AFileLlamaCppsQuantizerWroteReadsWithinItsRounding) {
    const fs::path lib =
        kLlamaModules / "@node-llama-cpp/linux-x64/bins/linux-x64/libllama.v0.4.0.so";
    if (!fs::exists(lib)) GTEST_SKIP() << "node-llama-cpp's libllama is not installed: " << lib;
#ifdef GPT2_SANITIZER_BUILD
    GTEST_SKIP() << "llama.cpp's library is not built for the sanitizers";
#endif
    const ScratchDir dir("gpt2-gguf-llama-quantized");
    const auto tokenizer = train_bpe_tokenizer(kText, 300);
    const Model model = llama_model(tokenizer->vocab_size(), false, 43);
    write_gguf(dir.path() / "f32.gguf", model, *tokenizer, GgufWeights::F32, "m");
    ASSERT_TRUE(llama_quantize_q8_0(lib, dir.path() / "f32.gguf", dir.path() / "llama-q8.gguf"));
    EXPECT_EQ(read_gguf(dir.path() / "llama-q8.gguf").tensors.at("blk.0.attn_q.weight").type, 8u);
    const LoadedModel theirs = load_model_file(dir.path() / "llama-q8.gguf");
    ASSERT_EQ(theirs.model.config, model.config);
    std::size_t differ = 0;
    for (const TensorSpec& spec : model.layout.specs()) {
        const std::span<const float> original = model.layout.tensor(model.weights(), spec.id);
        const std::span<const float> back =
            theirs.model.layout.tensor(theirs.model.weights(), spec.id);
        const std::vector<float> ours =
            rounded_as(original, stored_in_type(spec.id) ? GgufWeights::Q8_0 : GgufWeights::F32);
        for (std::size_t i = 0; i < original.size(); ++i) {
            if (back[i] == ours[i]) continue;
            ++differ;
            float amax = 0.0f;
            for (std::size_t k = i / 32 * 32; k < i / 32 * 32 + 32; ++k)
                amax = std::max(amax, std::abs(original[k]));
            ASSERT_LE(std::abs(back[i] - ours[i]), 1.01f * amax / 127.0f)
                << param_tensor_name(spec.id) << " " << i;
        }
    }
    EXPECT_LE(differ * 1000, model.layout.total()) << differ << " weights differ";
    const auto generated =
        run_command(test::build_path("inference") + " " + (dir / "llama-q8.gguf") +
                    " --prompt 'the king' --temperature 0 --max-new-tokens 8"
                    " --threads 1 --log-level warn");
    ASSERT_EQ(generated.exit_code, 0) << generated.output;
    EXPECT_EQ(generated.output.substr(0, 8), "the king") << generated.output;
}

// A llama GGUF whose settings the block cannot compute: refused naming the file and the key, in
// one line, by every program that reads a model.
TEST(GgufLlamaImport, SettingsTheBlockCannotComputeAreRefusedByKey) {
    const ScratchDir dir("gpt2-gguf-llama-refused");
    const auto tokenizer = train_bpe_tokenizer(kText, 300);
    const Model model = llama_model(tokenizer->vocab_size(), true, 44);
    write_gguf(dir.path() / "m.gguf", model, *tokenizer, GgufWeights::F32, "m");
    const std::vector<std::uint8_t> bytes = read_file_bytes(dir.path() / "m.gguf");
    // A u32 key's value replaced in place: the key's name is followed by its type (4) and value.
    const auto with_u32 = [&](const std::string& key, std::uint32_t value) {
        std::vector<std::uint8_t> edited = bytes;
        const auto at = std::search(edited.begin(), edited.end(), key.begin(), key.end());
        EXPECT_NE(at, edited.end()) << key;
        std::memcpy(&*(at + static_cast<long>(key.size()) + 4), &value, 4);
        return edited;
    };
    const std::vector<std::pair<std::vector<std::uint8_t>, std::string>> cases = {
        {with_u32("llama.rope.dimension_count", 8),
         ": llama.rope.dimension_count is 8, not the head size 16 (the programs' rotary turns "
         "every channel of a head)"},
        {with_u32("llama.attention.head_count_kv", 3),
         ": key/value heads must divide the number of heads"},
    };
    for (const auto& [edited, expected] : cases) {
        test::write_bytes(dir.path() / "x.gguf", edited);
        const auto r = run_command(test::build_path("inference") + " " + (dir / "x.gguf") +
                                   " --max-new-tokens 1");
        EXPECT_EQ(r.exit_code, 1) << r.output;
        EXPECT_NE(r.output.find(dir / "x.gguf" + expected), std::string::npos) << r.output;
        EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    }
}

}  // namespace
}  // namespace gpt2
