// Hugging Face's LlamaForCausalLM in and out. tests/data/hf_llama_standin/ stands in for a
// downloaded Llama-family directory (SmolLM2's layout: config.json, BF16 model.safetensors with
// Hugging Face's tensor names, tied embeddings, grouped-query attention; dev/make_reference.py),
// with the logits LlamaForCausalLM's definition gives in float64 over its BF16 weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "formats/gguf.hpp"
#include "formats/hugging_face.hpp"
#include "model/forward_backward.hpp"
#include "model/model.hpp"
#include "model/training_context.hpp"
#include "ops/gemm.hpp"
#include "random_model.hpp"
#include "reference_fixture.hpp"
#include "scratch_files.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {
namespace {

const std::filesystem::path kStandIn =
    std::filesystem::path(GPT2_TEST_DATA_DIR) / "hf_llama_standin";

TEST(HuggingFaceLlama, AStandInDirectoryReadsAndGivesLlamaForCausalLMsLogits) {
    HuggingFaceNotes notes;
    const LoadedModel loaded = load_hugging_face_model(kStandIn, &notes);
    const ModelConfig& c = loaded.model.config;
    EXPECT_EQ(c.num_layers, 2);
    EXPECT_EQ(c.num_heads, 4);
    EXPECT_EQ(c.kv_heads(), 2);
    EXPECT_EQ(c.channels, 64);
    EXPECT_EQ(c.mlp_hidden(), 160);
    EXPECT_EQ(c.vocab_size, 300);
    EXPECT_EQ(c.max_seq_len, 64);
    EXPECT_EQ(c.arch.norm, NormKind::RmsNorm);
    EXPECT_EQ(c.arch.mlp, MlpKind::SwiGlu);
    EXPECT_EQ(c.arch.rope_theta, 100000.0f);
    EXPECT_EQ(c.arch.norm_eps, 1e-5f);
    EXPECT_TRUE(c.arch.tied_head);
    EXPECT_FALSE(c.arch.biases);
    // Its byte-level BPE (vocab.json + merges.txt, <|endoftext|> at 0 as SmolLM2's) is the
    // model's tokenizer, splitting every digit first as tokenizer.json's pre-tokenizer says, and
    // the log says so.
    ASSERT_TRUE(loaded.extras.has_value());
    const auto tokenizer = deserialize_tokenizer(loaded.extras->tokenizer);
    EXPECT_EQ(tokenizer->vocab_size(), 300);
    EXPECT_EQ(tokenizer->pre_tokenizer(), PreTokenizer::DigitsThenGpt2);
    EXPECT_EQ(tokenizer->decode(tokenizer->encode("ROMEO: the sun 1597")), "ROMEO: the sun 1597");
    ASSERT_EQ(notes.lines.size(), 1u);
    EXPECT_NE(notes.lines[0].find("tokenizer.json: its pre-tokenizer splits every digit on its own "
                                  "before GPT-2's byte-level pattern"),
              std::string::npos)
        << notes.lines[0];
    const test::ReferenceFixture fixture = test::ReferenceFixture::load(
        std::string(GPT2_TEST_DATA_DIR) + "/hf_llama_standin_logits.bin");
    const std::vector<std::int32_t>& inputs = fixture.at("inputs").i32;
    const std::vector<float>& expected = fixture.at("logits").f32;
    const std::vector<float> logits = test::training_logits(loaded.model, inputs);
    // The weights are the same BF16 values on both sides; the difference is fp32 arithmetic
    // against float64: relative rounding of about 6e-8 per operation over sums of at most 160
    // terms in 2 layers, a few 1e-5 of logits of order 1 at most: 2e-4 + 1e-4 |x| bounds it with
    // room, while a Q/K/V or gate/up piece read from another tensor's rows is off by order 1.
    double worst = 0.0;
    for (std::size_t t = 0; t < inputs.size(); ++t) {
        for (int v = 0; v < c.vocab_size; ++v) {
            const double ours = logits[t * static_cast<std::size_t>(c.padded_vocab_size) +
                                       static_cast<std::size_t>(v)];
            const double ref =
                expected[t * static_cast<std::size_t>(c.vocab_size) + static_cast<std::size_t>(v)];
            worst = std::max(worst, std::abs(ours - ref) / (2e-4 + 1e-4 * std::abs(ref)));
        }
    }
    EXPECT_LE(worst, 1.0) << "the worst logit's error over its bound";
}

// Ours out as LlamaForCausalLM and back: the same configuration and the same bits, tied and
// untied; the files carry Hugging Face's names.
TEST(HuggingFaceLlama, ExportThenImportIsBitwiseTiedAndUntied) {
    const test::ScratchDir dir("gpt2-hf-llama");
    for (const bool tied : {true, false}) {
        ModelConfig c = test::small_config();
        c.arch.norm = NormKind::RmsNorm;
        c.arch.positions = PositionKind::Rotary;
        c.arch.rope_theta = 500.0f;
        c.arch.mlp = MlpKind::SwiGlu;
        c.arch.mlp_hidden = 96;
        c.arch.biases = false;
        c.arch.kv_heads = 2;
        c.arch.tied_head = tied;
        const auto model = test::random_model(c, 17);
        // The padded vocabulary's rows are zero in a real model (and not exported).
        for (const ParamTensor t : {ParamTensor::wte, ParamTensor::lmheadw}) {
            const std::span<float> rows = model->layout.tensor(model->params.span(), t);
            if (!rows.empty()) {
                std::fill(rows.begin() + static_cast<std::ptrdiff_t>(c.vocab_size) * c.channels,
                          rows.end(), 0.0f);
            }
        }
        const auto out = dir.path() / (tied ? "tied" : "untied");
        write_hugging_face_model(out, *model, nullptr, ElementType::F32);
        const std::string config = read_text_file(out / "config.json");
        EXPECT_NE(config.find("\"LlamaForCausalLM\""), std::string::npos) << config;
        EXPECT_NE(config.find("\"rms_norm_eps\": 1e-05"), std::string::npos) << config;
        const std::string tensors = read_text_file(out / "model.safetensors").substr(0, 4096);
        EXPECT_NE(tensors.find("model.layers.1.mlp.gate_proj.weight"), std::string::npos);
        EXPECT_EQ(tensors.find("lm_head.weight") != std::string::npos, !tied);
        const LoadedModel back = load_hugging_face_model(out);
        EXPECT_EQ(back.model.config, c);
        const std::span<const float> a = model->weights(), b = back.model.weights();
        ASSERT_EQ(a.size(), b.size());
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
            << (tied ? "tied" : "untied");
    }
}

TEST(HuggingFaceLlama, WhatItCannotComputeOrWriteIsRefusedByName) {
    const test::ScratchDir dir("gpt2-hf-llama-refused");
    // A block Hugging Face's Llama cannot express (the speedrun's) is not exported.
    ModelConfig speedrun = test::small_config();
    speedrun.arch.norm = NormKind::RmsNorm;
    speedrun.arch.norm_gains = false;
    speedrun.arch.positions = PositionKind::Rotary;
    speedrun.arch.mlp = MlpKind::ReluSquared;
    speedrun.arch.biases = false;
    speedrun.arch.qk_norm = true;
    const auto model = test::random_model(speedrun, 3);
    try {
        write_hugging_face_model(dir.path() / "speedrun", *model, nullptr, ElementType::F32);
        ADD_FAILURE() << "the speedrun's block was written as a Llama";
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("is not a LlamaForCausalLM"), std::string::npos)
            << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(dir.path() / "speedrun" / "model.safetensors"));
    // Nor as llama.cpp's llama, even where only the embeddings' norm differs from the Llama block.
    ModelConfig normed = speedrun;
    normed.arch = Architecture{};
    normed.arch.norm = NormKind::RmsNorm;
    normed.arch.positions = PositionKind::Rotary;
    normed.arch.mlp = MlpKind::SwiGlu;
    normed.arch.biases = false;
    normed.arch.embedding_norm = true;
    const auto tokenizer = make_char_tokenizer(std::string(101, 'a') + "bcdefghij");
    for (const ModelConfig& c : {speedrun, normed}) {
        const auto refused_model = test::random_model(c, 5);
        try {
            write_gguf(dir.path() / "x.gguf", *refused_model, *tokenizer, GgufWeights::F32, "x");
            ADD_FAILURE() << describe(c.arch) << " was written as GGUF";
        } catch (const InputError& e) {
            EXPECT_NE(std::string(e.what()).find("not " + describe(c.arch)), std::string::npos)
                << e.what();
        }
    }
    // config.json settings our block does not compute, each named.
    const std::string base = read_text_file(kStandIn / "config.json");
    const auto refused = [&](const std::string& from, const std::string& to,
                             const std::string& says) {
        const auto copy = dir.path() / "copy";
        std::filesystem::remove_all(copy);
        std::filesystem::create_directories(copy);
        std::filesystem::copy_file(kStandIn / "model.safetensors", copy / "model.safetensors");
        std::string text = base;
        ASSERT_NE(text.find(from), std::string::npos) << from;
        text.replace(text.find(from), from.size(), to);
        write_file_atomically(
            copy / "config.json",
            std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
        try {
            (void)load_hugging_face_model(copy);
            ADD_FAILURE() << to << " was read";
        } catch (const InputError& e) {
            EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
        }
    };
    refused("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "hidden_act \"gelu\"");
    refused("\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}",
            "rope_scaling");
    refused("\"attention_bias\": false", "\"attention_bias\": true", "attention_bias true");
    refused("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3", "divide");
    refused("\"intermediate_size\": 160", "\"intermediate_size\": 161",
            "model.layers.0.mlp.gate_proj.weight");
}

}  // namespace
}  // namespace gpt2
