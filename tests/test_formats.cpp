// Model files in and out (src/formats/): safetensors' strict reader, Hugging Face GPT-2
// directories and llm.c's model files, judged where possible by the other side's own code: an
// independent NumPy reader (tests/hf_gpt2_reference.py; skips, saying why, without NumPy).
// GGUF is in test_gguf.cpp, the convert_model program in test_convert_model.cpp.
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
const std::string kReference = std::string(GPT2_SOURCE_DIR) + "/tests/hf_gpt2_reference.py";

// ---- Element types ---------------------------------------------------------------------------

TEST(ElementTypes, HalfConversionsMatchTheCompilersFloat16) {
#ifndef __FLT16_MANT_DIG__
    // clang 14 (the AddressSanitizer build) has no _Float16 on x86; GCC's builds run this test.
    GTEST_SKIP() << "this compiler has no _Float16 to compare with";
#else
    for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
        const auto h = static_cast<std::uint16_t>(bits);
        _Float16 reference;
        std::memcpy(&reference, &h, 2);
        const float widened = half_to_float(h);
        if (std::isnan(static_cast<float>(reference))) {
            EXPECT_TRUE(std::isnan(widened)) << bits;
            continue;
        }
        ASSERT_EQ(std::bit_cast<std::uint32_t>(widened),
                  std::bit_cast<std::uint32_t>(static_cast<float>(reference)))
            << "half " << bits;
        ASSERT_EQ(float_to_half(widened), h) << "half " << bits;
    }
    // Rounding: every exponent half can reach (and past it), ties included.
    std::mt19937 rng(7);
    for (int i = 0; i < 2'000'000; ++i) {
        const std::uint32_t bits = (static_cast<std::uint32_t>(rng() % 40 + 95) << 23) |
                                   (rng() & 0x807FFFFFu) | (i % 3 == 0 ? 0x1000u : 0u);
        const float value = std::bit_cast<float>(bits);
        const _Float16 reference = static_cast<_Float16>(value);
        std::uint16_t expected;
        std::memcpy(&expected, &reference, 2);
        ASSERT_EQ(float_to_half(value), expected) << value;
    }
#endif
}

// ---- safetensors -----------------------------------------------------------------------------

std::vector<std::uint8_t> safetensors_bytes(const std::string& header, std::size_t data_bytes,
                                            std::uint64_t declared = 0) {
    // Sized once and filled with memcpy: GCC 12 warns falsely on inserts into a small vector.
    std::vector<std::uint8_t> bytes(8 + header.size() + data_bytes);
    const std::uint64_t size = declared != 0 ? declared : header.size();
    std::memcpy(bytes.data(), &size, 8);
    std::memcpy(bytes.data() + 8, header.data(), header.size());
    for (std::size_t i = 0; i < data_bytes; ++i)
        bytes[8 + header.size() + i] = static_cast<std::uint8_t>(i);
    return bytes;
}

std::string parse_error(const std::vector<std::uint8_t>& bytes) {
    try {
        (void)SafetensorsFile::parse(bytes, "x.safetensors");
    } catch (const InputError& e) {
        return e.what();
    }
    return "(accepted)";
}

TEST(Safetensors, AWellFormedFileIsRead) {
    const std::string header =
        R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F16","shape":[2],"data_offsets":[8,12]},)"
        R"("a":{"dtype":"F32","shape":[2,1],"data_offsets":[0,8]}})";
    const SafetensorsFile file = SafetensorsFile::parse(safetensors_bytes(header, 12), "x");
    ASSERT_EQ(file.tensors().size(), 2u);
    EXPECT_EQ(file.tensors()[0].name, "a");  // in data order
    EXPECT_EQ(file.tensors()[1].shape, std::vector<std::int64_t>{2});
    EXPECT_EQ(file.tensors()[1].type, ElementType::F16);
    EXPECT_EQ(file.tensors()[1].bytes[0], 8);
    EXPECT_EQ(file.metadata().at("format"), "pt");
}

TEST(Safetensors, MalformedFilesGetOneErrorNamingTheFileAndTheField) {
    const auto tensor = [](const std::string& name, const std::string& dtype,
                           const std::string& shape, int begin, int end) {
        return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
               ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
    };
    struct Case {
        const char* what;
        std::vector<std::uint8_t> bytes;
        std::vector<std::string> expected;
    };
    const std::vector<Case> cases = {
        {"hole",
         safetensors_bytes(
             "{" + tensor("a", "F32", "[2]", 0, 8) + "," + tensor("b", "F32", "[2]", 12, 20) + "}",
             20),
         {"tensor b", "hole"}},
        {"overlap",
         safetensors_bytes(
             "{" + tensor("a", "F32", "[2]", 0, 8) + "," + tensor("b", "F32", "[2]", 4, 12) + "}",
             12),
         {"tensor b", "overlap"}},
        {"size",
         safetensors_bytes("{" + tensor("a", "F32", "[3]", 0, 8) + "}", 8),
         {"tensor a", "needs 12"}},
        {"trailing",
         safetensors_bytes("{" + tensor("a", "F32", "[2]", 0, 8) + "}", 12),
         {"4 trailing bytes"}},
        {"outside",
         safetensors_bytes("{" + tensor("a", "F32", "[4]", 0, 16) + "}", 8),
         {"tensor a", "outside"}},
        {"dtype",
         safetensors_bytes("{" + tensor("a", "F128", "[2]", 0, 8) + "}", 8),
         {"tensor a", "unknown dtype \"F128\""}},
        {"shape",
         safetensors_bytes("{" + tensor("a", "F32", "[-2]", 0, 8) + "}", 8),
         {"tensor a", "shape"}},
        {"offsets",
         safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2]}})", 8),
         {"tensor a", "data_offsets"}},
        {"json", safetensors_bytes("{\"a\":", 8), {"not valid JSON"}},
        {"huge header", safetensors_bytes("{}", 8, std::uint64_t{1} << 40), {"exceeds the limit"}},
        {"past the end", safetensors_bytes("{}", 0, 100), {"runs past the end"}},
        {"short", std::vector<std::uint8_t>(5, 0), {"too short"}},
        {"metadata",
         safetensors_bytes(R"({"__metadata__":{"format":1}})", 0),
         {"__metadata__.format"}},
    };
    for (const Case& c : cases) {
        const std::string message = parse_error(c.bytes);
        EXPECT_NE(message.find("x.safetensors: "), std::string::npos) << c.what << ": " << message;
        for (const std::string& part : c.expected)
            EXPECT_NE(message.find(part), std::string::npos) << c.what << ": " << message;
    }
}

// ---- Hugging Face ----------------------------------------------------------------------------

TEST(HuggingFace, ExportThenImportIsBitwiseWithTheTokenizer) {
    if (!has_gpt2_files()) GTEST_SKIP() << "no GPT-2 tokenizer files in " << kGpt2Dir;
    const ScratchDir dir("gpt2-formats-hf");
    const Model model = small_model(50257, 11);
    const auto tokenizer = load_gpt2_tokenizer(kGpt2Dir);
    write_hugging_face_model(dir.path() / "hf", model, tokenizer.get(), ElementType::F32);
    const LoadedModel back = load_model_file(dir.path() / "hf");
    EXPECT_EQ(back.model.config, model.config);
    expect_bitwise(back.model.weights(), model.weights());
    ASSERT_TRUE(back.extras.has_value());
    EXPECT_EQ(back.extras->tokenizer, tokenizer->serialize());  // vocab.json + merges.txt
    const json config = json::parse(read_text_file(dir.path() / "hf" / "config.json"));
    EXPECT_EQ(config["architectures"][0], "GPT2LMHeadModel");
    EXPECT_EQ(config["activation_function"], "gelu_new");
    EXPECT_EQ(config["n_ctx"], 64);
    EXPECT_EQ(config["eos_token_id"], 50256);
    EXPECT_EQ(config["bos_token_id"], 50256);
    const SafetensorsFile file = SafetensorsFile::read(dir.path() / "hf" / "model.safetensors");
    EXPECT_EQ(file.metadata().at("format"), "pt");
    // Vocabulary padding is dropped; Conv1D weights are (in, out).
    EXPECT_EQ(file.find("transformer.wte.weight")->shape, (std::vector<std::int64_t>{50257, 64}));
    const SafetensorsTensor* qkv = file.find("transformer.h.1.attn.c_attn.weight");
    ASSERT_NE(qkv, nullptr);
    EXPECT_EQ(qkv->shape, (std::vector<std::int64_t>{64, 192}));
    const float* ours = model.layout.layer(model.weights(), ParamTensor::qkvw, 1).data();
    for (const auto& [in, out] : {std::pair{0, 0}, {3, 100}, {63, 191}, {17, 5}}) {
        float stored;
        std::memcpy(&stored, qkv->bytes.data() + 4 * (in * 192 + out), 4);
        EXPECT_EQ(stored, ours[out * 64 + in]) << in << "," << out;
    }
}

TEST(HuggingFace, HalfAndBf16ExportsHoldTheRoundedWeights) {
    const ScratchDir dir("gpt2-formats-half");
    const Model model = small_model(300, 12);
    for (const ElementType type : {ElementType::F16, ElementType::Bf16}) {
        write_hugging_face_model(dir.path() / "hf", model, nullptr, type);
        const LoadedModel back = load_model_file(dir.path() / "hf" / "model.safetensors");
        const std::span<const float> a = back.model.weights(), w = model.weights();
        for (std::size_t i = 0; i < w.size(); ++i) {
            const float rounded = type == ElementType::F16 ? half_to_float(float_to_half(w[i]))
                                                           : to_float(to_bf16(w[i]));
            ASSERT_EQ(a[i], rounded) << element_type_name(type) << " element " << i;
        }
    }
}

// Rewrites an exported model.safetensors through `edit` (names and tensors as the test wishes).
void rewrite(const fs::path& file,
             const std::function<void(std::vector<SafetensorsOutput>&)>& edit) {
    std::vector<SafetensorsOutput> tensors;
    {
        const SafetensorsFile in = SafetensorsFile::read(file);
        for (const SafetensorsTensor& t : in.tensors())
            tensors.push_back({t.name, *t.type, t.shape, {t.bytes.begin(), t.bytes.end()}});
    }
    edit(tensors);
    write_safetensors(file, tensors, {});
}

std::string load_error(const fs::path& path) {
    try {
        (void)load_model_file(path);
    } catch (const InputError& e) {
        return e.what();
    }
    return "(accepted)";
}

TEST(HuggingFace, TheHubsLayoutIsReadAndUntiedOrForeignTensorsAreRefused) {
    const ScratchDir dir("gpt2-formats-hub");
    const Model model = small_model(300, 13);
    const fs::path hf = dir.path() / "hf", file = hf / "model.safetensors";
    write_hugging_face_model(hf, model, nullptr, ElementType::F32);
    // As openai-community/gpt2 stores it: no prefix, mask buffers, and lm_head (tied).
    rewrite(file, [](std::vector<SafetensorsOutput>& tensors) {
        std::vector<std::uint8_t> wte;
        for (SafetensorsOutput& t : tensors) {
            t.name.erase(0, std::string_view("transformer.").size());
            if (t.name == "wte.weight") wte = t.bytes;
        }
        for (int l = 0; l < 2; ++l) {
            std::vector<std::uint8_t> mask(64 * 64 * 4, 0);
            tensors.push_back(
                {"h." + std::to_string(l) + ".attn.bias", ElementType::F32, {1, 1, 64, 64}, mask});
            tensors.push_back({"h." + std::to_string(l) + ".attn.masked_bias",
                               ElementType::F32,
                               {},
                               std::vector<std::uint8_t>(4, 0)});
        }
        tensors.push_back({"lm_head.weight", ElementType::F32, {300, 64}, wte});
    });
    expect_bitwise(load_model_file(hf).model.weights(), model.weights());

    rewrite(file, [](std::vector<SafetensorsOutput>& tensors) {
        tensors.back().bytes[100] ^= 1;  // lm_head no longer equals wte
    });
    EXPECT_NE(load_error(hf).find("lm_head.weight differs from wte.weight"), std::string::npos)
        << load_error(hf);
    rewrite(file, [](std::vector<SafetensorsOutput>& tensors) {
        tensors.back() = {
            "score.weight", ElementType::F32, {2, 64}, std::vector<std::uint8_t>(512)};
    });
    EXPECT_NE(load_error(hf).find("unexpected tensor score.weight"), std::string::npos)
        << load_error(hf);
    rewrite(file, [](std::vector<SafetensorsOutput>& tensors) {
        tensors.pop_back();
        SafetensorsOutput copy = tensors.front();
        copy.name = "transformer." + copy.name;
        tensors.push_back(copy);
    });
    EXPECT_NE(load_error(hf).find("appears twice"), std::string::npos) << load_error(hf);
}

TEST(HuggingFace, AConfigThatDisagreesWithTheTensorsIsRefusedByName) {
    const ScratchDir dir("gpt2-formats-config");
    const Model model = small_model(300, 14);
    const fs::path hf = dir.path() / "hf";
    write_hugging_face_model(hf, model, nullptr, ElementType::F32);
    const json original = json::parse(read_text_file(hf / "config.json"));
    const auto with = [&](const std::string& key, const json& value) {
        json config = original;
        if (value.is_null()) {
            config.erase(key);
        } else {
            config[key] = value;
        }
        const std::string text = config.dump();
        write_file_atomically(
            hf / "config.json",
            std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
        return load_error(hf);
    };
    std::string e = with("n_embd", 32);
    EXPECT_NE(e.find("tensor transformer.wte.weight has shape [300, 64]"), std::string::npos) << e;
    EXPECT_NE(e.find("config.json"), std::string::npos) << e;
    e = with("n_head", nullptr);
    EXPECT_NE(e.find("config.json: n_head is missing"), std::string::npos) << e;
    e = with("activation_function", "relu");
    EXPECT_NE(e.find("config.json: activation_function \"relu\""), std::string::npos) << e;
    e = with("layer_norm_epsilon", 1e-6);
    EXPECT_NE(e.find("config.json: layer_norm_epsilon"), std::string::npos) << e;
    e = with("n_layer", 3);
    EXPECT_NE(e.find("tensor h.2.ln_1.weight is missing"), std::string::npos) << e;
    e = with("vocab_size", 299);
    EXPECT_NE(e.find("has shape [300, 64]"), std::string::npos) << e;
    with("n_embd", 64);
    fs::remove(hf / "config.json");
    EXPECT_NE(load_error(hf).find("config.json: missing"), std::string::npos) << load_error(hf);
}

TEST(HuggingFace, ShardedModelsAreReadThroughTheirIndex) {
    const ScratchDir dir("gpt2-formats-shards");
    const Model model = small_model(300, 15);
    const fs::path hf = dir.path() / "hf";
    write_hugging_face_model(hf, model, nullptr, ElementType::Bf16);
    const SafetensorsFile whole = SafetensorsFile::read(hf / "model.safetensors");
    json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
    std::vector<SafetensorsOutput> shards[2];
    for (std::size_t i = 0; i < whole.tensors().size(); ++i) {
        const SafetensorsTensor& t = whole.tensors()[i];
        const int shard = i % 2 == 0 ? 0 : 1;
        shards[shard].push_back({t.name, *t.type, t.shape, {t.bytes.begin(), t.bytes.end()}});
        index["weight_map"][t.name] = "part-" + std::to_string(shard) + ".safetensors";
    }
    for (int s = 0; s < 2; ++s)
        write_safetensors(hf / ("part-" + std::to_string(s) + ".safetensors"), shards[s], {});
    const auto write_index = [&](const json& value) {
        const std::string text = value.dump();
        write_file_atomically(
            hf / "model.safetensors.index.json",
            std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
    };
    write_index(index);
    const Model single = load_model_file(hf).model;
    fs::remove(hf / "model.safetensors");
    expect_bitwise(load_model_file(hf).model.weights(), single.weights());
    expect_bitwise(load_model_file(hf / "model.safetensors.index.json").model.weights(),
                   single.weights());
    index["weight_map"]["transformer.wte.weight"] = "part-1.safetensors";
    write_index(index);
    EXPECT_NE(load_error(hf).find("part-0.safetensors: tensor transformer.wte.weight is not in "
                                  "model.safetensors.index.json"),
              std::string::npos)
        << load_error(hf);
}

// ---- llm.c -----------------------------------------------------------------------------------

TEST(LlmC, Version3RoundTripsBitwiseAndVersion5HoldsBf16) {
    const ScratchDir dir("gpt2-formats-llmc");
    const Model model = small_model(300, 16);
    save_llmc_model(dir.path() / "v3.bin", model, kLlmcModelVersionFp32);
    const LoadedModel v3 = load_model_file(dir.path() / "v3.bin");
    EXPECT_FALSE(v3.extras.has_value());
    expect_bitwise(v3.model.weights(), model.weights());
    save_llmc_model(dir.path() / "v5.bin", model, kLlmcModelVersionBf16);
    EXPECT_EQ(fs::file_size(dir.path() / "v5.bin"), 1024 + 2 * model.params.size());
    const LoadedModel v5 = load_model_file(dir.path() / "v5.bin");
    for (std::size_t i = 0; i < model.params.size(); ++i)
        ASSERT_EQ(v5.model.params[i], to_float(to_bf16(model.params[i]))) << i;
}

// ---- Which tokenizer goes with a model file ---------------------------------------------------

TEST(ModelTokenizer, TheFilesOwnComesFirstThenTheRequestedThenGpt2sByVocabulary) {
    const auto tokenizer = make_char_tokenizer("abc");
    const auto loaded = [](int vocab, std::optional<CheckpointExtras> extras) {
        return LoadedModel{Model(ModelConfig{8, vocab, pad_vocab(vocab), 1, 2, 8}),
                           std::move(extras)};
    };
    const LoadedModel own = loaded(3, CheckpointExtras{tokenizer->serialize(), "{}"});
    EXPECT_EQ(model_tokenizer_source(own, false), ModelTokenizerSource::Embedded);
    EXPECT_EQ(model_tokenizer_source(own, true), ModelTokenizerSource::Embedded);
    ASSERT_TRUE(carries_tokenizer(own));
    EXPECT_EQ(embedded_tokenizer(own)->serialize(), tokenizer->serialize());
    // A checkpoint's empty tokenizer counts as none.
    for (const LoadedModel& none : {loaded(3, CheckpointExtras{}), loaded(3, std::nullopt)}) {
        EXPECT_FALSE(carries_tokenizer(none));
        EXPECT_EQ(embedded_tokenizer(none), nullptr);
        EXPECT_EQ(model_tokenizer_source(none, true), ModelTokenizerSource::Requested);
        EXPECT_EQ(model_tokenizer_source(none, false), ModelTokenizerSource::Unknown);
    }
    const LoadedModel gpt2_shaped = loaded(kGpt2VocabSize, std::nullopt);
    EXPECT_EQ(model_tokenizer_source(gpt2_shaped, false), ModelTokenizerSource::Gpt2);
    EXPECT_EQ(model_tokenizer_source(gpt2_shaped, true), ModelTokenizerSource::Requested);
}

// ---- Tokenizers as spellings -----------------------------------------------------------------

TEST(SpelledTokenizers, GptTwosFilesComeBackAsTheSameTokenizer) {
    if (!has_gpt2_files()) GTEST_SKIP() << "no GPT-2 tokenizer files in " << kGpt2Dir;
    const auto gpt2 = load_gpt2_tokenizer(kGpt2Dir);
    const SpelledBpe spelled = spell_byte_level_bpe(*gpt2);
    EXPECT_EQ(spelled.tokens.size(), 50257u);
    EXPECT_EQ(spelled.tokens[50256], "<|endoftext|>");
    EXPECT_EQ(spelled.tokens[220], "\xC4\xA0");  // " " spelled U+0120
    EXPECT_EQ(spelled.merges.front(), "\xC4\xA0 t");
    // OpenAI's files, line for line and token for token.
    std::vector<std::string> lines;
    std::istringstream merges(read_text_file(kGpt2Dir / "vocab.bpe"));
    for (std::string line; std::getline(merges, line);) {
        if (!line.empty() && !line.starts_with("#version")) lines.push_back(line);
    }
    EXPECT_EQ(lines, spelled.merges);
    const json encoder = json::parse(read_text_file(kGpt2Dir / "encoder.json"));
    for (const auto& [spelling, id] : encoder.items())
        ASSERT_EQ(spelled.tokens.at(id.get<std::size_t>()), spelling);
}

TEST(SpelledTokenizers, ATrainedBpeIsExportedExactly) {
    std::string corpus;
    for (int i = 0; i < 200; ++i)
        corpus +=
            "the theme of the thesis: then there were " + std::to_string(i * 37) + " cafés.\n";
    const auto bpe = train_bpe_tokenizer(corpus, 300);
    const ScratchDir dir("gpt2-formats-bpe");
    const Model model = small_model(bpe->vocab_size(), 17);
    write_hugging_face_model(dir.path() / "hf", model, bpe.get(), ElementType::F32);
    const LoadedModel back = load_model_file(dir.path() / "hf");
    ASSERT_TRUE(back.extras.has_value());
    const auto loaded = deserialize_tokenizer(back.extras->tokenizer);
    const std::string text = corpus.substr(0, 2000) + "unseen wörds <|endoftext|> 12345";
    EXPECT_EQ(loaded->encode(text), bpe->encode(text));
    EXPECT_EQ(loaded->vocab_size(), bpe->vocab_size());
}

// A char tokenizer is a byte-level BPE without merges or end-of-text: vocab.json spells its bytes
// as GPT-2 does, merges.txt is empty, bos/eos/unk are null; reading the directory back gives the
// same char tokenizer and weights.
TEST(SpelledTokenizers, ACharTokenizerIsExportedAsABpeWithoutMergesAndReadBack) {
    const std::string corpus = "First Citizen:\nBefore we proceed, hear me speak. naïve\t~\x01";
    const auto chars = make_char_tokenizer(corpus);
    const SpelledBpe spelled = spell_byte_level_bpe(*chars);
    EXPECT_FALSE(spelled.eot_id.has_value());
    EXPECT_TRUE(spelled.merges.empty());
    ASSERT_EQ(spelled.tokens.size(), static_cast<std::size_t>(chars->vocab_size()));
    EXPECT_EQ(spelled.tokens[0], "\xC4\x81");  // byte 0x01 spelled U+0101
    const auto id = [&](const std::string& text) {
        return static_cast<std::size_t>(chars->encode(text).at(0));
    };
    EXPECT_EQ(spelled.tokens[id("\n")], "\xC4\x8A");  // U+010A
    EXPECT_EQ(spelled.tokens[id(" ")], "\xC4\xA0");   // U+0120
    EXPECT_EQ(spelled.tokens[id("~")], "~");
    EXPECT_EQ(spelled.tokens[id("\xC3")], "\xC3\x83");  // the first byte of "ï": U+00C3

    const ScratchDir dir("gpt2-formats-char");
    const Model model = small_model(chars->vocab_size(), 18);
    write_hugging_face_model(dir.path() / "hf", model, chars.get(), ElementType::F32);
    const fs::path hf = dir.path() / "hf";
    const json vocab = json::parse(read_text_file(hf / "vocab.json"));
    ASSERT_EQ(vocab.size(), spelled.tokens.size());
    for (std::size_t i = 0; i < spelled.tokens.size(); ++i)
        EXPECT_EQ(vocab.at(spelled.tokens[i]), i);
    EXPECT_EQ(read_text_file(hf / "merges.txt"), "#version: 0.2\n");
    const json config = json::parse(read_text_file(hf / "config.json"));
    EXPECT_TRUE(config.at("bos_token_id").is_null());
    EXPECT_TRUE(config.at("eos_token_id").is_null());
    EXPECT_EQ(config.at("vocab_size"), chars->vocab_size());
    const json generation = json::parse(read_text_file(hf / "generation_config.json"));
    EXPECT_TRUE(generation.at("eos_token_id").is_null());
    const json tokenizer_config = json::parse(read_text_file(hf / "tokenizer_config.json"));
    for (const char* key : {"bos_token", "eos_token", "unk_token"})
        EXPECT_TRUE(tokenizer_config.at(key).is_null()) << key;
    EXPECT_EQ(tokenizer_config.at("tokenizer_class"), "GPT2Tokenizer");

    const LoadedModel back = load_model_file(hf);
    expect_bitwise(back.model.weights(), model.weights());
    ASSERT_TRUE(back.extras.has_value());
    EXPECT_EQ(back.extras->tokenizer, chars->serialize());
    // Files of that shape that are not a char tokenizer's (bytes out of order) are refused.
    std::ofstream(hf / "vocab.json") << R"({"b": 0, "a": 1})";
    EXPECT_NE(
        load_error(hf).find("vocab.json: a char tokenizer's bytes must be in increasing order"),
        std::string::npos)
        << load_error(hf);
    std::ofstream(hf / "vocab.json") << R"({"a": 0, "ab": 1})";
    EXPECT_NE(load_error(hf).find("has no <|endoftext|> token, and is not a char tokenizer's "
                                  "vocabulary either (token 1 is 2 bytes, not one)"),
              std::string::npos)
        << load_error(hf);
}

// Only a token of more than one byte keeps a char-kind tokenizer from the BPE form: the refusal
// names it. (make_char_tokenizer's tokens are single bytes; this one is not.)
TEST(SpelledTokenizers, ACharTokenOfSeveralBytesIsRefusedByName) {
    class WideChars final : public Tokenizer {
      public:
        [[nodiscard]] TokenizerKind kind() const override { return TokenizerKind::Char; }
        [[nodiscard]] int vocab_size() const override { return 3; }
        [[nodiscard]] std::optional<int> eot_id() const override { return std::nullopt; }
        [[nodiscard]] std::vector<std::int32_t> encode(std::string_view, EotInText) const override {
            return {};
        }
        [[nodiscard]] std::string decode(std::span<const std::int32_t>) const override {
            return {};
        }
        [[nodiscard]] std::string token_bytes(int id) const override {
            return id == 2 ? "é" : std::string(1, static_cast<char>('a' + id));
        }
        [[nodiscard]] std::vector<std::uint8_t> serialize() const override { return {}; }
    };
    const WideChars wide;
    try {
        (void)spell_byte_level_bpe(wide);
        ADD_FAILURE() << "a two-byte char token was spelled";
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("char tokenizer: token 2 \"é\" is 2 bytes"),
                  std::string::npos)
            << e.what();
    }
    const ScratchDir dir("gpt2-formats-wide");
    EXPECT_THROW(
        write_hugging_face_model(dir.path() / "hf", small_model(3, 18), &wide, ElementType::F32),
        InputError);
    EXPECT_FALSE(fs::exists(dir.path() / "hf"));  // refused before anything was written
}

// ---- The other side's own code ---------------------------------------------------------------

bool has_numpy() {
    return run_command("/usr/bin/python3 -c 'import numpy'").exit_code == 0;
}

TEST(IndependentReader, NumPysGpt2GivesOurLogitsAndWritesWhatWeReadBitwise) {
    if (!has_numpy())
        GTEST_SKIP()
            << "no NumPy for /usr/bin/python3 (GPT2_WITH_LLAMA_CPP=1 scripts/setup.sh installs it)";
    const ScratchDir dir("gpt2-formats-numpy");
    const Model model = small_model(1000, 20);
    write_hugging_face_model(dir.path() / "hf", model, nullptr, ElementType::F32);
    std::vector<std::int32_t> tokens;
    for (int i = 0; i < 50; ++i)
        tokens.push_back((i * 389 + 7) % 1000);
    write_file_atomically(
        dir.path() / "tokens",
        std::span(reinterpret_cast<const std::uint8_t*>(tokens.data()), tokens.size() * 4));
    const auto r = run_command("/usr/bin/python3 " + kReference + " logits " + (dir / "hf") + " " +
                               (dir / "tokens") + " " + (dir / "logits"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<std::uint8_t> bytes = read_file_bytes(dir.path() / "logits");
    std::vector<float> theirs(bytes.size() / 4);
    std::memcpy(theirs.data(), bytes.data(), bytes.size());
    EXPECT_TRUE(test::all_close(our_logits(model, tokens), theirs, 1e-4, 1e-5));

    // The Hub's layout written by NumPy (two shards, no prefix, mask buffers, lm_head) is read
    // back to our weights bit for bit.
    save_llmc_model(dir.path() / "model.bin", model, kLlmcModelVersionFp32);
    const auto w = run_command("/usr/bin/python3 " + kReference + " write " + (dir / "model.bin") +
                               " " + (dir / "hub"));
    ASSERT_EQ(w.exit_code, 0) << w.output;
    std::vector<std::string> notes;
    const LoadedModel hub = load_model_file(dir.path() / "hub", &notes);
    expect_bitwise(hub.model.weights(), model.weights());
    ASSERT_EQ(notes.size(), 1u);  // its dropout is reported, not applied
    EXPECT_NE(
        notes[0].find("embd_pdrop 0.1, attn_pdrop 0.1, resid_pdrop 0.1 (not applied from the file: "
                      "train_gpt2 --dropout P sets it)"),
        std::string::npos)
        << notes[0];
}

// A char model's directory, read by NumPy alone: its vocab.json and merges.txt tokenize a text as
// our char tokenizer does, and its weights give our logits for those tokens.
TEST(IndependentReader, NumPyTokenizesACharModelsDirectoryAsWeDoAndGivesOurLogits) {
    if (!has_numpy())
        GTEST_SKIP()
            << "no NumPy for /usr/bin/python3 (GPT2_WITH_LLAMA_CPP=1 scripts/setup.sh installs it)";
    // Within the model's 64 positions; "ï" is two tokens of its own.
    const std::string text = "First Citizen:\nBefore we proceed, naïve me.\n\nAll: Speak!";
    ASSERT_LE(text.size(), 64u);
    const auto chars = make_char_tokenizer(text + "XYZ");
    const ScratchDir dir("gpt2-formats-numpy-char");
    const Model model = small_model(chars->vocab_size(), 24);
    write_hugging_face_model(dir.path() / "hf", model, chars.get(), ElementType::F32);
    std::ofstream(dir.path() / "text.txt", std::ios::binary) << text;
    const auto t = run_command("/usr/bin/python3 " + kReference + " tokenize " + (dir / "hf") +
                               " " + (dir / "text.txt") + " " + (dir / "tokens"));
    ASSERT_EQ(t.exit_code, 0) << t.output;
    const std::vector<std::uint8_t> token_bytes = read_file_bytes(dir.path() / "tokens");
    std::vector<std::int32_t> tokens(token_bytes.size() / 4);
    std::memcpy(tokens.data(), token_bytes.data(), token_bytes.size());
    ASSERT_EQ(tokens, chars->encode(text));
    const auto r = run_command("/usr/bin/python3 " + kReference + " logits " + (dir / "hf") + " " +
                               (dir / "tokens") + " " + (dir / "logits"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<std::uint8_t> bytes = read_file_bytes(dir.path() / "logits");
    std::vector<float> theirs(bytes.size() / 4);
    std::memcpy(theirs.data(), bytes.data(), bytes.size());
    EXPECT_TRUE(test::all_close(our_logits(model, tokens), theirs, 1e-4, 1e-5));
}

}  // namespace
}  // namespace gpt2
