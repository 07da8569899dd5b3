// LoRA on the Llama family with PEFT's Llama names, out to the ecosystem from docs/llama.md's
// Hugging Face stand-in (SmolLM2's layout, 4 query heads over 2 key/value heads, tied): the PEFT
// directory's names and shapes (q_proj ... down_proj under base_model.model.model.layers), read
// back bitwise; merged into a Hugging Face directory, each projection equal to the stand-in's own
// plus (alpha/r) B A computed here from the two files' tensors; the GGUF adapter in llama.cpp's
// names with B's rows of Q and K in its rotary order; and an adapter trained by train_gpt2 run by
// llama.cpp beside the base GGUF as our merged checkpoint runs (skips without node-llama-cpp).
// The adapter's gradient against PEFT's formula in PyTorch: tests/test_llama_reference.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "formats/model_file.hpp"
#include "formats/model_tokenizer.hpp"
#include "formats/peft.hpp"
#include "formats/safetensors.hpp"
#include "formats_support.hpp"
#include "gguf_support.hpp"
#include "model/generate.hpp"
#include "model/lora.hpp"
#include "process_support.hpp"
#include "test_support.hpp"

namespace gpt2 {
namespace {

using namespace formats_test;  // fs, json, run_command, ScratchDir and the helpers

const fs::path kStandin = fs::path(GPT2_TEST_DATA_DIR) / "hf_llama_standin";

// The seven projections' adapter of rank 4 with PEFT's initial A and a B far from zero, so that
// the adapter changes what the model generates.
LoraAdapter every_projection(const ModelConfig& config) {
    LoraConfig c;
    c.rank = 4;
    c.alpha = 16.0f;
    c.targets = all_lora_targets(config);
    LoraAdapter adapter(config, c);
    init_lora(adapter, 5);
    for (int l = 0; l < config.num_layers; ++l) {
        for (int i = 0; i < kLoraTargets; ++i) {
            const auto t = static_cast<LoraTarget>(i);
            if (!c.adapts(t)) continue;
            float* B = adapter.params.data() + adapter.layout.b_offset(l, t);
            for (std::size_t k = 0; k < adapter.layout.b_floats(t); ++k)
                B[k] = 0.3f * std::sin(0.41f * static_cast<float>(k) + static_cast<float>(l + i));
        }
    }
    return adapter;
}

// A tensor of a safetensors file as floats, by its name.
std::vector<float> tensor_floats(const SafetensorsFile& file, const std::string& name) {
    const SafetensorsTensor* t = file.find(name);
    if (t == nullptr || !t->type) throw std::runtime_error(file.name() + ": no float " + name);
    std::size_t n = 1;
    for (const std::int64_t d : t->shape)
        n *= static_cast<std::size_t>(d);
    std::vector<float> out(n);
    read_elements(out, t->bytes, *t->type);
    return out;
}

class LlamaLora : public ::testing::Test {
  protected:
    LlamaLora()
        : dir_("gpt2-lora-llama"),
          loaded_(load_model_file(kStandin)),
          adapter_(every_projection(loaded_.model.config)) {
        (void)write_peft_adapter(dir_.path() / "adapter", adapter_, kStandin.string());
    }
    // convert_model STANDIN ARGS.
    [[nodiscard]] test::ProcessResult convert(const std::string& args) const {
        return run_command(test::build_path("convert_model") + " " + kStandin.string() + " " +
                           args);
    }
    ScratchDir dir_;
    LoadedModel loaded_;
    LoraAdapter adapter_;
};

TEST_F(LlamaLora, ThePeftDirectoryHoldsPeftsLlamaNamesAndReadsBackBitwise) {
    const ModelConfig& c = loaded_.model.config;
    const auto config = json::parse(read_text_file(dir_.path() / "adapter/adapter_config.json"));
    EXPECT_EQ(config.at("target_modules"),
              json({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}));
    EXPECT_EQ(config.at("fan_in_fan_out"), false);  // nn.Linear's (out, in)
    const SafetensorsFile file =
        SafetensorsFile::read(dir_.path() / "adapter/adapter_model.safetensors");
    EXPECT_EQ(file.tensors().size(), 2u * 7u * static_cast<std::size_t>(c.num_layers));
    const std::int64_t C = c.channels, KV = c.kv_heads() * c.head_size(), H = c.mlp_hidden();
    const std::string p = "base_model.model.model.layers.1.";
    for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<std::int64_t>>>{
             {"self_attn.q_proj.lora_A.weight", {4, C}},
             {"self_attn.k_proj.lora_B.weight", {KV, 4}},
             {"self_attn.v_proj.lora_B.weight", {KV, 4}},
             {"self_attn.o_proj.lora_B.weight", {C, 4}},
             {"mlp.gate_proj.lora_B.weight", {H, 4}},
             {"mlp.up_proj.lora_A.weight", {4, C}},
             {"mlp.down_proj.lora_A.weight", {4, H}}}) {
        const SafetensorsTensor* t = file.find(p + name);
        ASSERT_NE(t, nullptr) << name;
        EXPECT_EQ(t->shape, shape) << name;
    }
    const auto read = read_peft_adapter(dir_.path() / "adapter", c);
    EXPECT_EQ(read->config, adapter_.config);
    expect_bitwise(read->params.span(), adapter_.params.span());

    // PEFT's "all-linear" is every projection; GPT-2's names and a transposing adapter are refused
    // naming the file and the key.
    const auto with_config = [&](const json& edited) {
        const std::string text = edited.dump();
        write_file_atomically(
            dir_.path() / "adapter/adapter_config.json",
            std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
        try {
            return read_peft_adapter(dir_.path() / "adapter", c)->config.targets ==
                           adapter_.config.targets
                       ? std::string("read")
                       : std::string("other targets");
        } catch (const InputError& e) {
            return std::string(e.what());
        }
    };
    const std::string file_name = (dir_.path() / "adapter/adapter_config.json").string();
    json edited = config;
    edited["target_modules"] = "all-linear";
    EXPECT_EQ(with_config(edited), "read");
    edited["target_modules"] = json({"c_attn"});
    EXPECT_EQ(with_config(edited),
              file_name +
                  ": target module: 'c_attn' is a projection of GPT-2, not of this model (choose "
                  "from q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, all)");
    edited = config;
    edited["fan_in_fan_out"] = true;
    EXPECT_EQ(with_config(edited), file_name +
                                       ": key 'fan_in_fan_out' is true, but this model's "
                                       "projections are nn.Linear's (out, in): PEFT would add "
                                       "the transposed update");
}

// Merged by convert_model into a Hugging Face directory: each projection is the stand-in's own
// tensor (BF16) plus (alpha/r) B A from the adapter's file, by Hugging Face's and PEFT's names
// alone, so our fused layout is checked from outside.
TEST_F(LlamaLora, MergedIntoHuggingFaceEachProjectionIsItsWeightPlusScaledBA) {
    const auto merged = convert((dir_ / "merged_hf") + " --lora-from " + (dir_ / "adapter"));
    ASSERT_EQ(merged.exit_code, 0) << merged.output;
    const SafetensorsFile base = SafetensorsFile::read(kStandin / "model.safetensors");
    const SafetensorsFile out = SafetensorsFile::read(dir_.path() / "merged_hf/model.safetensors");
    const SafetensorsFile lora =
        SafetensorsFile::read(dir_.path() / "adapter/adapter_model.safetensors");
    const double scale = 16.0 / 4;
    int checked = 0;
    for (int l = 0; l < loaded_.model.config.num_layers; ++l) {
        for (const std::string module :
             {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
              "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
            const std::string name = "model.layers." + std::to_string(l) + "." + module;
            const std::vector<float> W = tensor_floats(base, name + ".weight");
            const std::vector<float> got = tensor_floats(out, name + ".weight");
            const std::vector<float> A =
                tensor_floats(lora, "base_model.model." + name + ".lora_A.weight");
            const std::vector<float> B =
                tensor_floats(lora, "base_model.model." + name + ".lora_B.weight");
            const std::size_t in = A.size() / 4, rows = B.size() / 4;
            ASSERT_EQ(W.size(), rows * in) << name;
            ASSERT_EQ(got.size(), W.size()) << name;
            for (std::size_t o = 0; o < rows; ++o) {
                for (std::size_t k = 0; k < in; ++k) {
                    double delta = 0.0;
                    for (std::size_t j = 0; j < 4; ++j)
                        delta += static_cast<double>(B[o * 4 + j]) * A[j * in + k];
                    const double expected = W[o * in + k] + scale * delta;
                    ASSERT_NEAR(got[o * in + k], expected, 1e-6 * (1.0 + std::abs(expected)))
                        << name << " row " << o << " column " << k;
                }
            }
            ++checked;
        }
    }
    EXPECT_EQ(checked, 7 * loaded_.model.config.num_layers);
}

// The GGUF adapter: llama.cpp's llama names, A and B as PEFT has them except B's rows of Q and K,
// which follow the base GGUF's rows (llama.cpp's rotary pairs adjacent channels: each head's rows
// from (first half, second half) to interleaved, as the base's Q and K).
TEST_F(LlamaLora, TheGgufAdapterHoldsLlamaCppsNamesAndQAndKRowsInItsRotaryOrder) {
    const auto written =
        convert((dir_ / "adapter.gguf") + " --to gguf-lora --lora-from " + (dir_ / "adapter"));
    ASSERT_EQ(written.exit_code, 0) << written.output;
    EXPECT_NE(written.output.find("GGUF v3 LoRA adapter for llama.cpp's llama, r=4, alpha 16"),
              std::string::npos)
        << written.output;
    const GgufFile f = read_gguf(dir_.path() / "adapter.gguf");
    EXPECT_EQ(f.kv.at("general.architecture"), "llama");
    EXPECT_EQ(f.kv.at("adapter.type"), "lora");
    const ModelConfig& c = loaded_.model.config;
    EXPECT_EQ(f.tensors.size(), 2u * 7u * static_cast<std::size_t>(c.num_layers));
    const auto C = static_cast<std::uint64_t>(c.channels);
    const auto KV = static_cast<std::uint64_t>(c.kv_heads() * c.head_size());
    const int hs = c.head_size(), half = hs / 2;
    for (int l = 0; l < c.num_layers; ++l) {
        const std::string blk = "blk." + std::to_string(l) + ".";
        for (const auto& [name, target, out, heads] :
             std::vector<std::tuple<std::string, LoraTarget, std::uint64_t, int>>{
                 {"attn_q", LoraTarget::QProj, C, c.num_heads},
                 {"attn_k", LoraTarget::KProj, KV, c.kv_heads()},
                 {"attn_v", LoraTarget::VProj, KV, 0},
                 {"ffn_gate", LoraTarget::GateProj, static_cast<std::uint64_t>(c.mlp_hidden()),
                  0}}) {
            const std::string base = blk + name + ".weight";
            EXPECT_EQ(f.tensors.at(base + ".lora_a").ne, (std::vector<std::uint64_t>{C, 4}));
            EXPECT_EQ(f.tensors.at(base + ".lora_b").ne, (std::vector<std::uint64_t>{4, out}));
            expect_bitwise(gguf_floats(f, base + ".lora_a"),
                           adapter_.params.span().subspan(adapter_.layout.a_offset(l, target),
                                                          adapter_.layout.a_floats(target)));
            const std::vector<float> b = gguf_floats(f, base + ".lora_b");
            const float* ours = adapter_.params.data() + adapter_.layout.b_offset(l, target);
            for (std::size_t row = 0; row < out; ++row) {
                std::size_t from = row;  // V and the gate: PEFT's rows as they are
                if (heads > 0) {
                    const int h = static_cast<int>(row) / hs, within = static_cast<int>(row) % hs;
                    from = static_cast<std::size_t>(h * hs + (within % 2) * half + within / 2);
                }
                for (std::size_t k = 0; k < 4; ++k)
                    ASSERT_EQ(b[row * 4 + k], ours[from * 4 + k]) << base << " row " << row;
            }
        }
    }
}

// From the Hugging Face directory through LoRA fine-tuning to llama.cpp (docs/llama.md): an adapter
// train_gpt2 trained on every projection, and the one above, each written as a GGUF adapter and
// applied by llama.cpp to the base GGUF, continue a prompt greedily as our merged model does, and
// give our merged model's top-1 after each prefix of a text wherever ours is clear.
TEST_F(LlamaLora, LlamaCppRunsTheStandinWithOurAdaptersAsOurMergedModel) {
    if (const std::string missing = llama_cpp_missing(); !missing.empty()) GTEST_SKIP() << missing;
    test::write_corpus(dir_.path() / "corpus.txt", 20000);
    const auto trained = run_command(
        test::build_path("train_gpt2") + " --init-from " + kStandin.string() +
        " --seq-len 64 --batch-size 8 --max-steps 200 --val-every 0 --sample-every 0 --threads 2"
        " --lora-rank 8 --lora-alpha 16 --data " +
        (dir_ / "corpus.txt") + " --out-dir " + (dir_ / "out") + " 2>&1");
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
    ASSERT_EQ(convert((dir_ / "base.gguf")).exit_code, 0);
    const fs::path checkpoint = dir_.path() / "out/model_000200.bin";
    for (const std::string& args :
         {(dir_ / "trained.gguf") + " --to gguf-lora --lora-from " +
              (dir_ / "out/model_000200.adapter"),
          (dir_ / "adapter.gguf") + " --to gguf-lora --lora-from " + (dir_ / "adapter")}) {
        const auto r = convert(args);
        ASSERT_EQ(r.exit_code, 0) << r.output;
    }
    Model merged_random = load_model_file(kStandin).model;
    merge_lora(merged_random, adapter_);
    const Model merged_trained = load_model_file(checkpoint).model;
    const auto tokenizer = embedded_tokenizer(loaded_);
    const std::vector<std::int32_t> prompt = tokenizer->encode("And ");
    const std::vector<std::int32_t> text =
        tokenizer->encode(read_text_file(dir_.path() / "corpus.txt").substr(1000, 72));
    ASSERT_LE(text.size(), 64u) << "the stand-in's context";
    constexpr int kNew = 24;
    for (const auto& [name, merged] :
         {std::pair<std::string, const Model*>{"trained", &merged_trained},
          {"adapter", &merged_random}}) {
        std::vector<std::int32_t> ours = prompt, base = prompt;
        Rng rng(1);
        generate_recompute(*merged, ours, kNew, SamplingParams{0.0f, 0, 1.0f}, rng);
        generate_recompute(loaded_.model, base, kNew, SamplingParams{0.0f, 0, 1.0f}, rng);
        EXPECT_NE(ours, base) << name << ": the adapter does not change the text";
        const std::vector<float> logits = our_logits(*merged, text);
        const auto V = static_cast<std::size_t>(merged->config.vocab_size);
        const auto clear_top = [&](const std::vector<float>& all, std::size_t row) -> int {
            std::vector<float> v(all.begin() + static_cast<long>(row * V),
                                 all.begin() + static_cast<long>((row + 1) * V));
            const auto top = std::max_element(v.begin(), v.end()) - v.begin();
            std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<>());
            return v[0] - v[1] > 1e-3f ? static_cast<int>(top) : -1;
        };
        const std::vector<float> greedy_logits = our_logits(*merged, ours);
        std::size_t confident = 0;
        for (std::size_t row = prompt.size() - 1;
             row + 1 < ours.size() && clear_top(greedy_logits, row) >= 0; ++row)
            ++confident;
        ASSERT_GE(confident, 8u) << name << ": too few confident steps to judge";
        const std::string adapter = dir_ / (name + ".gguf");
        const json jobs = {{{"model", dir_ / "base.gguf"},
                            {"mode", "greedy"},
                            {"ids", prompt},
                            {"count", kNew},
                            {"lora", {adapter}}},
                           {{"model", dir_ / "base.gguf"},
                            {"mode", "teacher"},
                            {"ids", text},
                            {"lora", {adapter}}}};
        const std::vector<std::vector<std::int32_t>> theirs = llama(dir_.path(), jobs);
        ASSERT_EQ(theirs.size(), 2u);
        const auto n = static_cast<long>(confident);
        EXPECT_EQ(std::vector<std::int32_t>(theirs[0].begin(), theirs[0].begin() + n),
                  std::vector<std::int32_t>(ours.begin() + static_cast<long>(prompt.size()),
                                            ours.begin() + static_cast<long>(prompt.size()) + n))
            << name;
        ASSERT_EQ(theirs[1].size(), text.size());
        std::size_t clear = 0;
        for (std::size_t t = 0; t < text.size(); ++t) {
            const int top = clear_top(logits, t);
            if (top < 0) continue;
            ++clear;
            EXPECT_EQ(theirs[1][t], top) << name << " position " << t;
        }
        EXPECT_GE(clear * 10, text.size() * 9) << name << ": " << clear << " of " << text.size();
    }
    // build/inference decodes the trained checkpoint (the merged weights) as generate does.
    std::vector<std::int32_t> ours = prompt;
    Rng rng(1);
    generate_recompute(merged_trained, ours, 12, SamplingParams{0.0f, 0, 1.0f}, rng);
    const auto inference = run_command(test::build_path("inference") + " " + checkpoint.string() +
                                       " --prompt 'And ' --temperature 0 --max-new-tokens 12"
                                       " --no-stream --threads 1 --log-level warn");
    ASSERT_EQ(inference.exit_code, 0) << inference.output;
    EXPECT_EQ(inference.output, tokenizer->decode(ours) + "\n");
}

}  // namespace
}  // namespace gpt2
