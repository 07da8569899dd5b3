// A LoRA adapter out to the ecosystem through convert_model --lora-from: merged into the weights of
// every format it writes (each read back equal to W + (alpha/r) B A), written alone as a GGUF LoRA
// adapter that llama.cpp itself (node-llama-cpp; skips, saying why, where absent) runs beside the
// base GGUF as our merged model runs, and the PEFT directory applied by an independent NumPy
// reference (tests/peft_lora_reference.py; skips without NumPy) giving our merged model's logits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "core/file_io.hpp"
#include "core/random.hpp"
#include "formats/checkpoint.hpp"
#include "formats/gguf.hpp"
#include "formats/hugging_face.hpp"
#include "formats/model_file.hpp"
#include "formats/peft.hpp"
#include "formats_support.hpp"
#include "gguf_support.hpp"
#include "model/generate.hpp"
#include "model/lora.hpp"
#include "test_support.hpp"

namespace gpt2 {
namespace {

using namespace formats_test;  // fs, json, run_command, ScratchDir and the helpers

const std::string kPeftReference = std::string(GPT2_SOURCE_DIR) + "/tests/peft_lora_reference.py";
const std::string kText = "the king shall speak\nof love and war to thee my lord";

// llama.cpp's names of the base weights each target adapts (its gpt2 architecture).
const std::array<std::string, kGpt2LoraTargets> kGgufNames = {"attn_qkv", "attn_output", "ffn_up",
                                                              "ffn_down"};

LoraConfig all_four(int rank, float alpha) {
    LoraConfig c;
    c.rank = rank;
    c.alpha = alpha;
    c.targets = all_lora_targets(ModelConfig{16, 101, 128, 2, 4, 64});
    return c;
}

// PEFT's initial A, and a B far from zero, so that the adapter changes what the model generates.
LoraAdapter trained_looking_adapter(const ModelConfig& model, const LoraConfig& config) {
    LoraAdapter adapter(model, config);
    init_lora(adapter, 11);
    for (int l = 0; l < model.num_layers; ++l) {
        for (int i = 0; i < kGpt2LoraTargets; ++i) {
            const auto t = static_cast<LoraTarget>(i);
            float* B = adapter.params.data() + adapter.layout.b_offset(l, t);
            for (std::size_t k = 0; k < adapter.layout.b_floats(t); ++k)
                B[k] = 0.5f * std::sin(0.37f * static_cast<float>(k) + static_cast<float>(l + i));
        }
    }
    return adapter;
}

// W + (alpha/r) B A for layer l's target t, in double, element by element.
std::vector<float> expected_merged(const Model& base, const LoraAdapter& adapter, int l,
                                   LoraTarget t) {
    const ProductShape s = lora_product_shape(base.config, t);
    const int r = adapter.config.rank;
    const double scale = static_cast<double>(adapter.config.alpha) / r;
    const auto W = base.layout.layer(base.weights(), lora_target_weight(t), l);
    const float* A = adapter.params.data() + adapter.layout.a_offset(l, t);
    const float* B = adapter.params.data() + adapter.layout.b_offset(l, t);
    std::vector<float> merged(W.size());
    for (int o = 0; o < s.out; ++o) {
        for (int c = 0; c < s.in; ++c) {
            double delta = 0.0;
            for (int k = 0; k < r; ++k)
                delta += static_cast<double>(B[o * r + k]) * A[k * s.in + c];
            const std::size_t at = static_cast<std::size_t>(o) * s.in + c;
            merged[at] = static_cast<float>(W[at] + scale * delta);
        }
    }
    return merged;
}

// A char model whose logits have clear winners (wte scaled up, as test_gguf's confident model),
// saved as a checkpoint with its tokenizer, and an adapter for it in PEFT's directory.
class LoraExport : public ::testing::Test {
  protected:
    LoraExport()
        : dir_("gpt2-lora-export"),
          tokenizer_(make_char_tokenizer(kText)),
          base_(small_model(tokenizer_->vocab_size(), 31)),
          adapter_(trained_looking_adapter(base_.config, all_four(4, 16.0f))) {
        for (float& w : base_.layout.tensor(base_.params.span(), ParamTensor::wte))
            w *= 25.0f;
        for (float& w : base_.layout.tensor(base_.params.span(), ParamTensor::wpe))
            w *= 25.0f;
        save_checkpoint(dir_.path() / "base.bin", base_,
                        CheckpointExtras{tokenizer_->serialize(), ""});
        (void)write_peft_adapter(dir_.path() / "adapter", adapter_, "base.bin");
    }
    // convert_model base.bin ARGS.
    [[nodiscard]] test::ProcessResult convert(const std::string& args) const {
        return run_command(test::build_path("convert_model") + " " + (dir_ / "base.bin") + " " +
                           args);
    }
    [[nodiscard]] std::string lora_from() const { return " --lora-from " + (dir_ / "adapter"); }

    ScratchDir dir_;
    std::unique_ptr<Tokenizer> tokenizer_;
    Model base_;
    LoraAdapter adapter_;
};

TEST_F(LoraExport, MergedOutputsInEveryFormatHoldWPlusScaledBA) {
    for (const char* out : {"merged.bin", "merged_hf", "merged.gguf"}) {
        const auto r = convert((dir_ / out) + lora_from());
        ASSERT_EQ(r.exit_code, 0) << r.output;
        EXPECT_NE(r.output.find("LoRA r=4, alpha 16 (scale 4), targets c_attn,c_proj,c_fc"),
                  std::string::npos)
            << r.output;
        EXPECT_NE(r.output.find("into the weights: W + (alpha/r) B A"), std::string::npos)
            << r.output;
    }
    const GgufFile gguf = read_gguf(dir_.path() / "merged.gguf");
    const Model llmc = load_model_file(dir_.path() / "merged.bin").model;
    const Model hf = load_model_file(dir_.path() / "merged_hf").model;
    for (int l = 0; l < base_.config.num_layers; ++l) {
        for (int i = 0; i < kGpt2LoraTargets; ++i) {
            const auto t = static_cast<LoraTarget>(i);
            const std::vector<float> expected = expected_merged(base_, adapter_, l, t);
            const auto where =
                "layer " + std::to_string(l) + " " + std::string(lora_target_module(t));
            for (const Model* m : {&llmc, &hf}) {
                EXPECT_TRUE(test::all_close(m->layout.layer(m->weights(), lora_target_weight(t), l),
                                            expected, 1e-6, 1e-7))
                    << where;
            }
            const std::string name = "blk." + std::to_string(l) + "." +
                                     kGgufNames[static_cast<std::size_t>(i)] + ".weight";
            EXPECT_TRUE(test::all_close(gguf_floats(gguf, name), expected, 1e-6, 1e-7)) << name;
        }
        // What the adapter does not touch is the base's, bit for bit.
        for (const ParamTensor kept : {ParamTensor::ln1w, ParamTensor::qkvb, ParamTensor::fcprojb})
            expect_bitwise(llmc.layout.layer(llmc.weights(), kept, l),
                           base_.layout.layer(base_.weights(), kept, l));
    }
    expect_bitwise(hf.layout.tensor(hf.weights(), ParamTensor::wte),
                   base_.layout.tensor(base_.weights(), ParamTensor::wte));
}

TEST_F(LoraExport, TheGgufAdapterHoldsLlamaCppsKeysAndPeftsMatrices) {
    const auto r = convert((dir_ / "adapter.gguf") + " --to gguf-lora" + lora_from());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("GGUF v3 LoRA adapter for llama.cpp's gpt2, r=4, alpha 16, f32"),
              std::string::npos)
        << r.output;
    const GgufFile f = read_gguf(dir_.path() / "adapter.gguf");
    EXPECT_EQ(f.kv.at("general.architecture"), "gpt2");
    EXPECT_EQ(f.kv.at("general.type"), "adapter");
    EXPECT_EQ(f.kv.at("adapter.type"), "lora");
    EXPECT_EQ(f.kv.at("adapter.lora.alpha"), 16.0f);
    EXPECT_EQ(f.tensors.size(), 2u * kGpt2LoraTargets * base_.config.num_layers);
    const auto C = static_cast<std::uint64_t>(base_.config.channels);
    const std::array<std::pair<std::uint64_t, std::uint64_t>, kGpt2LoraTargets> in_out = {
        {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}}};
    for (int l = 0; l < base_.config.num_layers; ++l) {
        for (int i = 0; i < kGpt2LoraTargets; ++i) {
            const auto t = static_cast<LoraTarget>(i);
            const std::string name = "blk." + std::to_string(l) + "." +
                                     kGgufNames[static_cast<std::size_t>(i)] + ".weight";
            // llama.cpp's shape check: lora_a ne {base ne[0], r}, lora_b ne {r, base ne[1]}.
            const auto [in, out] = in_out[static_cast<std::size_t>(i)];
            EXPECT_EQ(f.tensors.at(name + ".lora_a").ne, (std::vector<std::uint64_t>{in, 4}));
            EXPECT_EQ(f.tensors.at(name + ".lora_b").ne, (std::vector<std::uint64_t>{4, out}));
            expect_bitwise(gguf_floats(f, name + ".lora_a"),
                           adapter_.params.span().subspan(adapter_.layout.a_offset(l, t),
                                                          adapter_.layout.a_floats(t)));
            expect_bitwise(gguf_floats(f, name + ".lora_b"),
                           adapter_.params.span().subspan(adapter_.layout.b_offset(l, t),
                                                          adapter_.layout.b_floats(t)));
        }
    }
    const auto f16 =
        convert((dir_ / "adapter16.gguf") + " --to gguf-lora --dtype f16" + lora_from());
    ASSERT_EQ(f16.exit_code, 0) << f16.output;
    EXPECT_EQ(
        read_gguf(dir_.path() / "adapter16.gguf").tensors.at("blk.1.ffn_down.weight.lora_b").type,
        1u);
}

// Each refusal: one line, the exit status for its kind, nothing written.
TEST_F(LoraExport, BadAdaptersAndFlagsAreRefusedInOneLineNamingThem) {
    const auto refused = [&](const std::string& args, int code, const std::string& message) {
        const auto r = convert(args);
        EXPECT_EQ(r.exit_code, code) << args << "\n" << r.output;
        EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
        EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << r.output;
        EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
        EXPECT_FALSE(fs::exists(dir_.path() / "out.gguf")) << args;
        EXPECT_FALSE(fs::exists(dir_.path() / "out")) << args;
    };
    refused((dir_ / "out.gguf") + " --to gguf-lora", 2,
            "--to gguf-lora writes an adapter: name it with --lora-from DIR");
    refused((dir_ / "out.gguf") + " --to gguf-lora --dtype q8_0" + lora_from(), 2,
            "--dtype q8_0 is not available for gguf-lora output (f32, f16, bf16)");
    refused((dir_ / "out") + " --lora-from " + (dir_ / "nowhere"), 1,
            "--lora-from " + (dir_ / "nowhere") + ": no such directory");
    fs::create_directories(dir_.path() / "empty");
    refused((dir_ / "out.gguf") + " --lora-from " + (dir_ / "empty"), 1,
            "--lora-from " + (dir_ / "empty") + ": no adapter_config.json");
    // An adapter made for a 32-channel model, given to this 64-channel one.
    (void)write_peft_adapter(dir_.path() / "narrow",
                             LoraAdapter(ModelConfig{64, base_.config.vocab_size,
                                                     base_.config.padded_vocab_size, 2, 4, 32},
                                         all_four(4, 16.0f)),
                             "other");
    for (const char* args : {" --to gguf-lora", ""}) {
        refused((dir_ / "out.gguf") + args + " --lora-from " + (dir_ / "narrow"), 1,
                (dir_ / "narrow/adapter_model.safetensors") +
                    ": tensor 'base_model.model.transformer.h.0.attn.c_attn.lora_A.weight' is "
                    "not 4 x 64");
    }
}

// llama.cpp loading the base GGUF plus our adapter GGUF generates greedily what our merged model
// generates, as it does from our GGUF of the merged weights and build/inference from the merged
// Hugging Face directory; the base alone generates something else.
TEST_F(LoraExport, LlamaCppRunsTheBaseWithOurAdapterAsOurMergedModel) {
    if (const std::string missing = llama_cpp_missing(); !missing.empty()) GTEST_SKIP() << missing;
    for (const std::string& args :
         {(dir_ / "base.gguf"), (dir_ / "adapter.gguf") + " --to gguf-lora" + lora_from(),
          (dir_ / "merged.gguf") + lora_from(), (dir_ / "merged_hf") + lora_from()}) {
        const auto r = convert(args);
        ASSERT_EQ(r.exit_code, 0) << r.output;
    }
    const Model merged = load_model_file(dir_.path() / "merged_hf").model;
    const std::string prompt_text = "the king ";
    const std::vector<std::int32_t> prompt = tokenizer_->encode(prompt_text);
    constexpr int kNew = 32;
    // Our greedy continuation, which means something only where our top-1 is clear of the
    // runner-up by more than two implementations' float rounding.
    const auto greedy = [&](const Model& model) {
        std::vector<std::int32_t> tokens = prompt;
        Rng rng(1);
        generate_recompute(model, tokens, kNew, SamplingParams{0.0f, 0, 1.0f}, rng);
        const std::vector<float> logits = our_logits(model, tokens);
        const auto V = static_cast<std::size_t>(model.config.vocab_size);
        for (std::size_t row = prompt.size() - 1; row + 1 < tokens.size(); ++row) {
            std::vector<float> v(logits.begin() + static_cast<long>(row * V),
                                 logits.begin() + static_cast<long>((row + 1) * V));
            std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<>());
            EXPECT_GT(v[0] - v[1], 1e-3f) << "a near tie at position " << row;
        }
        return std::vector<std::int32_t>(tokens.begin() + static_cast<long>(prompt.size()),
                                         tokens.end());
    };
    const std::vector<std::int32_t> ours = greedy(merged);
    const std::vector<std::int32_t> ours_base = greedy(base_);
    ASSERT_NE(ours, ours_base) << "the adapter does not change what the model generates";

    const std::string base_gguf = (dir_ / "base.gguf");
    const std::vector<std::int32_t> text = tokenizer_->encode(kText);
    const json jobs = {
        {{"model", base_gguf},
         {"mode", "greedy"},
         {"ids", prompt},
         {"count", kNew},
         {"lora", {dir_ / "adapter.gguf"}}},
        {{"model", dir_ / "merged.gguf"}, {"mode", "greedy"}, {"ids", prompt}, {"count", kNew}},
        {{"model", base_gguf}, {"mode", "greedy"}, {"ids", prompt}, {"count", kNew}},
        {{"model", base_gguf},
         {"mode", "teacher"},
         {"ids", text},
         {"lora", {dir_ / "adapter.gguf"}}},
    };
    const std::vector<std::vector<std::int32_t>> theirs = llama(dir_.path(), jobs);
    ASSERT_EQ(theirs.size(), jobs.size());
    EXPECT_EQ(theirs[0], ours) << "base + adapter";
    EXPECT_EQ(theirs[1], ours) << "merged GGUF";
    EXPECT_EQ(theirs[2], ours_base) << "base alone";
    // The top-1 after each prefix of a text (contexts greedy decoding does not reach): llama.cpp's
    // with the adapter is our merged model's wherever ours is clear of the runner-up.
    const std::vector<float> logits = our_logits(merged, text);
    const auto V = static_cast<std::size_t>(merged.config.vocab_size);
    ASSERT_EQ(theirs[3].size(), text.size());
    std::size_t clear = 0;
    for (std::size_t t = 0; t < text.size(); ++t) {
        std::vector<float> row(logits.begin() + static_cast<long>(t * V),
                               logits.begin() + static_cast<long>((t + 1) * V));
        const auto top = std::max_element(row.begin(), row.end()) - row.begin();
        std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<>());
        if (row[0] - row[1] <= 1e-3f) continue;
        ++clear;
        EXPECT_EQ(theirs[3][t], top) << "position " << t;
    }
    EXPECT_GE(clear * 10, text.size() * 9) << clear << " of " << text.size();

    const auto inference =
        run_command(test::build_path("inference") + " " + (dir_ / "merged_hf") + " --prompt '" +
                    prompt_text + "' --temperature 0 --max-new-tokens " + std::to_string(kNew) +
                    " --no-stream --threads 1 --log-level warn");
    ASSERT_EQ(inference.exit_code, 0) << inference.output;
    std::vector<std::int32_t> continued = prompt;
    continued.insert(continued.end(), ours.begin(), ours.end());
    EXPECT_EQ(inference.output, tokenizer_->decode(continued) + "\n");
    // scripts/llama_generate.sh --lora prints it too; an adapter that does not fit the model, or
    // is not there, is one error line.
    const std::string script = std::string(GPT2_SOURCE_DIR) + "/scripts/llama_generate.sh ";
    const auto generated =
        run_command(script + base_gguf + " --lora " + (dir_ / "adapter.gguf") + " --prompt '" +
                    prompt_text + "' --temperature 0 --max-new-tokens " + std::to_string(kNew));
    ASSERT_EQ(generated.exit_code, 0) << generated.output;
    EXPECT_EQ(generated.output, inference.output);
    write_gguf(dir_.path() / "narrow.gguf", small_model(tokenizer_->vocab_size(), 5, 32),
               *tokenizer_, GgufWeights::F32, "narrow");
    for (const auto& [model, lora, message] :
         {std::tuple{dir_ / "narrow.gguf", dir_ / "adapter.gguf",
                     "--lora " + (dir_ / "adapter.gguf") + ": llama.cpp cannot apply it to " +
                         (dir_ / "narrow.gguf")},
          std::tuple{base_gguf, dir_ / "nowhere.gguf",
                     "--lora " + (dir_ / "nowhere.gguf") + ": no such file"}}) {
        const auto r = run_command(script + model + " --lora " + lora + " --prompt 'the'");
        EXPECT_EQ(r.exit_code, 1) << r.output;
        EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
        EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
    }
}

// NumPy applies PEFT's formula to the base's Hugging Face directory and the PEFT directory, and
// gets the logits our forward gives on the merged model convert_model wrote (at the tolerances of
// test_formats' Hugging Face logits); the base's own logits are far from them.
TEST_F(LoraExport, NumPyApplyingPeftsFormulaGivesOurMergedModelsLogits) {
    if (run_command("/usr/bin/python3 -c 'import numpy'").exit_code != 0) {
        GTEST_SKIP()
            << "no NumPy for /usr/bin/python3 (GPT2_WITH_LLAMA_CPP=1 scripts/setup.sh installs it)";
    }
    ASSERT_EQ(convert(dir_ / "base_hf").exit_code, 0);
    const auto merged_run = convert((dir_ / "merged.bin") + lora_from());
    ASSERT_EQ(merged_run.exit_code, 0) << merged_run.output;
    const std::vector<std::int32_t> tokens = tokenizer_->encode(kText);
    write_file_atomically(
        dir_.path() / "tokens",
        std::span(reinterpret_cast<const std::uint8_t*>(tokens.data()), tokens.size() * 4));
    const auto r =
        run_command("/usr/bin/python3 " + kPeftReference + " logits " + (dir_ / "base_hf") + " " +
                    (dir_ / "adapter") + " " + (dir_ / "tokens") + " " + (dir_ / "logits"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<std::uint8_t> bytes = read_file_bytes(dir_.path() / "logits");
    std::vector<float> theirs(bytes.size() / 4);
    std::memcpy(theirs.data(), bytes.data(), bytes.size());
    const Model merged = load_model_file(dir_.path() / "merged.bin").model;
    EXPECT_TRUE(test::all_close(our_logits(merged, tokens), theirs, 1e-4, 1e-5));
    EXPECT_FALSE(test::all_close(our_logits(base_, tokens), theirs, 1e-2, 1e-2));
}

}  // namespace
}  // namespace gpt2
