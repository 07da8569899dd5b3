// The pre-tokenizer that splits every digit first (tokenizer.json's Sequence[Digits(individual_
// digits), ByteLevel], SmolLM2's; llama.cpp's "smollm"): by its definition, each numeric character
// (\p{N}: ASCII digits, other scripts' digits, fractions) is a piece of its own and GPT-2's
// pattern splits the text between them, so an encoding is the GPT-2 encoding of each stretch
// between digits with each digit's own token between; it travels in the serialized tokenizer
// (version 2; GPT-2's pattern keeps version 1's bytes), in a Hugging Face directory's
// tokenizer.json, out and in, and in GGUF's tokenizer.ggml.pre, out and in, where llama.cpp
// tokenizes as we do (skips without node-llama-cpp). Other pre-tokenizers are refused by name.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "formats/gguf.hpp"
#include "formats/hugging_face.hpp"
#include "formats/model_file.hpp"
#include "formats/model_tokenizer.hpp"
#include "formats_support.hpp"
#include "gguf_support.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {
namespace {

using namespace formats_test;  // fs, json, run_command, ScratchDir and the helpers

const fs::path kStandin = fs::path(GPT2_TEST_DATA_DIR) / "hf_llama_standin";

// A trained byte-level BPE whose merges join digits ("12", " 1", ...), as gpt2's kind of BPE
// splitting text `pre`'s way.
std::unique_ptr<Tokenizer> digit_merging_bpe(PreTokenizer pre) {
    std::string corpus;
    for (int i = 0; i < 40; ++i)
        corpus += "year 1212 and 12 of 2012, the king 1212 at 12:12 ";
    const auto trained = train_bpe_tokenizer(corpus, 300);
    SpelledBpe spelled = spell_byte_level_bpe(*trained);
    spelled.pre = pre;
    return tokenizer_from_spelling(spelled, "test");
}

// A numeric character of UTF-8 at text[i]: ASCII digits and the few others the texts below use.
std::size_t numeric_length(const std::string& text, std::size_t i) {
    if (text[i] >= '0' && text[i] <= '9') return 1;
    for (const std::string n : {"\u0663", "\u00bd", "\u2167"}) {  // Arabic-Indic 3, 1/2, VIII
        if (text.compare(i, n.size(), n) == 0) return n.size();
    }
    return 0;
}

TEST(DigitsPretokenizer, EachDigitIsItsOwnPieceAndGpt2sPatternSplitsTheTextBetween) {
    const auto gpt2 = digit_merging_bpe(PreTokenizer::Gpt2);
    const auto digits = digit_merging_bpe(PreTokenizer::DigitsThenGpt2);
    // The merges do join digits: GPT-2's pattern keeps " 1212" together and merges it.
    bool joined = false;
    for (const std::int32_t id : gpt2->encode(" 1212"))
        joined = joined || gpt2->token_bytes(id).size() > 1;
    ASSERT_TRUE(joined);
    for (const std::string text :
         {"year 1212 and 12", "abc  1", "  12  ", "x1y22z", "\u0663\u00bd \u2167 3rd", "12",
          "the king", "<|endoftext|>1<|endoftext|>"}) {
        std::vector<std::int32_t> expected;
        std::string between;
        const auto flush = [&] {
            for (const std::int32_t id : gpt2->encode(between))
                expected.push_back(id);
            between.clear();
        };
        for (std::size_t i = 0; i < text.size();) {
            if (text.compare(i, 13, "<|endoftext|>") == 0) {
                flush();
                expected.push_back(*gpt2->eot_id());
                i += 13;
            } else if (const std::size_t n = numeric_length(text, i); n > 0) {
                flush();
                const std::vector<std::int32_t> one = gpt2->encode(text.substr(i, n));
                expected.insert(expected.end(), one.begin(), one.end());  // its bytes, unmerged
                i += n;
            } else {
                between += text[i++];
            }
        }
        flush();
        const std::vector<std::int32_t> got = digits->encode(text);
        EXPECT_EQ(got, expected) << text;
        EXPECT_EQ(digits->decode(got), text);
    }
    EXPECT_NE(digits->encode(" 1212"), gpt2->encode(" 1212"));
}

TEST(DigitsPretokenizer, TheSerializedTokenizerCarriesItAndGpt2sKeepsItsBytes) {
    const auto gpt2 = digit_merging_bpe(PreTokenizer::Gpt2);
    const auto digits = digit_merging_bpe(PreTokenizer::DigitsThenGpt2);
    const std::vector<std::uint8_t> plain = gpt2->serialize(), split = digits->serialize();
    EXPECT_EQ(plain[1], 1u);  // version 1: what earlier builds wrote and read
    EXPECT_EQ(split[1], 2u);
    EXPECT_EQ(split.size(), plain.size() + 1);
    EXPECT_TRUE(std::equal(plain.begin() + 2, plain.end(), split.begin() + 2));
    const auto back = deserialize_tokenizer(split);
    EXPECT_EQ(back->pre_tokenizer(), PreTokenizer::DigitsThenGpt2);
    EXPECT_EQ(back->encode("year 1212"), digits->encode("year 1212"));
    EXPECT_EQ(deserialize_tokenizer(plain)->pre_tokenizer(), PreTokenizer::Gpt2);
    std::vector<std::uint8_t> bad = split;
    bad.back() = 7;
    EXPECT_THROW((void)deserialize_tokenizer(bad), InputError);
}

// The stand-in's tokenizer.json says digits first: read so, written so as LlamaForCausalLM's
// tokenizer.json (a GPT-2 tokenizer writes none), read back so; GGUF says "smollm", out and in.
TEST(DigitsPretokenizer, HuggingFaceAndGgufCarryItOutAndIn) {
    const ScratchDir dir("gpt2-digits-pre");
    const LoadedModel standin = load_model_file(kStandin);
    const auto tokenizer = embedded_tokenizer(standin);
    ASSERT_EQ(tokenizer->pre_tokenizer(), PreTokenizer::DigitsThenGpt2);
    const std::string text = "ROMEO: in 1597, act 2";
    write_hugging_face_model(dir.path() / "hf", standin.model, tokenizer.get(), ElementType::F32);
    const json written = json::parse(read_text_file(dir.path() / "hf/tokenizer.json"));
    EXPECT_EQ(written.at("pre_tokenizer").at("pretokenizers").at(0).at("type"), "Digits");
    EXPECT_EQ(written.at("model").at("merges").size(), 43u);
    const LoadedModel hf = load_model_file(dir.path() / "hf");
    EXPECT_EQ(embedded_tokenizer(hf)->pre_tokenizer(), PreTokenizer::DigitsThenGpt2);
    EXPECT_EQ(embedded_tokenizer(hf)->encode(text), tokenizer->encode(text));
    write_gguf(dir.path() / "m.gguf", standin.model, *tokenizer, GgufWeights::F32, "m");
    EXPECT_EQ(read_gguf(dir.path() / "m.gguf").kv.at("tokenizer.ggml.pre"), "smollm");
    const LoadedModel gguf = load_model_file(dir.path() / "m.gguf");
    EXPECT_EQ(embedded_tokenizer(gguf)->encode(text), tokenizer->encode(text));

    // Another pre-tokenizer, or a normalizer, is refused naming the file and the key.
    fs::create_directories(dir.path() / "other");
    for (const char* file : {"config.json", "model.safetensors", "vocab.json", "merges.txt"})
        fs::copy_file(kStandin / file, dir.path() / "other" / file);
    json other = json::parse(read_text_file(kStandin / "tokenizer.json"));
    other["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}};
    const auto refused = [&](const json& tokenizer_json) {
        const std::string dumped = tokenizer_json.dump();
        write_file_atomically(
            dir.path() / "other/tokenizer.json",
            std::span(reinterpret_cast<const std::uint8_t*>(dumped.data()), dumped.size()));
        try {
            (void)load_model_file(dir.path() / "other");
        } catch (const InputError& e) {
            return std::string(e.what());
        }
        return std::string("read");
    };
    const std::string path = (dir.path() / "other/tokenizer.json").string();
    EXPECT_EQ(refused(other).rfind(path + ": key 'pre_tokenizer' is ", 0), 0u) << refused(other);
    other = json::parse(read_text_file(kStandin / "tokenizer.json"));
    other["normalizer"] = {{"type", "NFC"}};
    EXPECT_EQ(refused(other).rfind(path + ": key 'normalizer' is {\"type\":\"NFC\"}", 0), 0u)
        << refused(other);
}

// llama.cpp (node-llama-cpp) tokenizes a text with numbers as we do through a GGUF of the
// stand-in's shape with a tokenizer whose merges join digits ("smollm"), which GPT-2's pattern
// alone would tokenize otherwise.
TEST(DigitsPretokenizer, LlamaCppTokenizesAGgufThatSplitsDigitsAsWeDo) {
    if (const std::string missing = llama_cpp_missing(); !missing.empty()) GTEST_SKIP() << missing;
    const ScratchDir dir("gpt2-digits-llama-cpp");
    const auto tokenizer = digit_merging_bpe(PreTokenizer::DigitsThenGpt2);
    ModelConfig c = load_model_file(kStandin).model.config;
    c.vocab_size = tokenizer->vocab_size();
    c.padded_vocab_size = pad_vocab(c.vocab_size);
    Model model(c);
    init_parameters(model, 1);
    write_gguf(dir.path() / "m.gguf", model, *tokenizer, GgufWeights::F32, "m");
    const std::string text = "In 1212 the king, aged 12, wrote 2012 letters: 1, 12 and 121.";
    ASSERT_NE(tokenizer->encode(text), digit_merging_bpe(PreTokenizer::Gpt2)->encode(text));
    const json jobs = {{{"model", dir / "m.gguf"}, {"mode", "tokenize"}, {"text", text}}};
    const std::vector<std::vector<std::int32_t>> theirs = llama(dir.path(), jobs);
    ASSERT_EQ(theirs.size(), 1u);
    EXPECT_EQ(theirs[0], tokenizer->encode(text));
}

}  // namespace
}  // namespace gpt2
