// GPT-2's tokenizer: ids checked against js-tiktoken's. The expected ids were made with
//   node dev/make_tokenizer_reference.mjs TEXT_FILE tests/data/tokenizer_gpt2_NAME.u16
// for TEXT_FILE = ../shared/data/tinyshakespeare.txt and tests/data/tokenizer_stress.txt.
// The stress text avoids U+0085, U+FEFF and U+180E, on which JavaScript's \s (js-tiktoken) and
// PCRE2's \s disagree; it holds no invalid UTF-8, which JavaScript strings cannot carry (random
// round-trip tests cover that).
#include <gtest/gtest.h>

#include "tokenizer_support.hpp"

// ---------------------------------------------------------------------------------------------
// gpt2

TEST(Gpt2Tokenizer, Basics) {
    SKIP_WITHOUT(kGpt2Dir / "encoder.json");
    const Tokenizer& tokenizer = gpt2_tokenizer();
    EXPECT_EQ(tokenizer.kind(), TokenizerKind::Gpt2);
    EXPECT_EQ(tokenizer.vocab_size(), 50257);
    EXPECT_EQ(tokenizer.eot_id(), 50256);
    EXPECT_EQ(tokenizer.token_bytes(50256), "<|endoftext|>");
    EXPECT_EQ(tokenizer.encode("Hello world"), (std::vector<std::int32_t>{15496, 995}));
    EXPECT_EQ(tokenizer.encode("<|endoftext|>"), (std::vector<std::int32_t>{50256}));
    EXPECT_EQ(tokenizer.token_bytes(198), "\n");
    EXPECT_EQ(tokenizer.token_bytes(220), " ");
    EXPECT_TRUE(tokenizer.encode("").empty());
}

// Load speed is a benchmark figure (dev/bench_tokenizer.sh), not a test assertion: CI
// machines and sanitizer builds differ several-fold in speed.
TEST(Gpt2Tokenizer, LoadsTheWholeVocabulary) {
    SKIP_WITHOUT(kGpt2Dir / "encoder.json");
    const auto tokenizer = gpt2::load_gpt2_tokenizer(kGpt2Dir);
    EXPECT_EQ(tokenizer->vocab_size(), 50257);
    EXPECT_EQ(tokenizer->serialize(), gpt2_tokenizer().serialize());
}

TEST(Gpt2Tokenizer, TinyShakespeareMatchesJsTiktoken) {
    SKIP_WITHOUT(kGpt2Dir / "encoder.json");
    SKIP_WITHOUT(kShakespeare);
    const std::vector<std::int32_t> expected =
        read_u16_ids(kTestData / "tokenizer_gpt2_tinyshakespeare.u16");
    ASSERT_EQ(expected.size(), 338025u);
    const std::vector<std::int32_t> ids = gpt2_tokenizer().encode(shakespeare());
    ASSERT_EQ(ids.size(), expected.size());
    const auto mismatch = std::mismatch(ids.begin(), ids.end(), expected.begin());
    EXPECT_TRUE(mismatch.first == ids.end())
        << "first difference at token " << (mismatch.first - ids.begin());
    EXPECT_EQ(gpt2_tokenizer().decode(ids), shakespeare());
}

TEST(Gpt2Tokenizer, StressTextMatchesJsTiktoken) {
    SKIP_WITHOUT(kGpt2Dir / "encoder.json");
    const std::string text = read_text_file(kTestData / "tokenizer_stress.txt");
    const std::vector<std::int32_t> expected =
        read_u16_ids(kTestData / "tokenizer_gpt2_stress.u16");
    const std::vector<std::int32_t> ids = gpt2_tokenizer().encode(text);
    EXPECT_EQ(ids, expected);
    EXPECT_EQ(gpt2_tokenizer().decode(ids), text);
}

// A literal <|endoftext|>: the end-of-text token (tiktoken's allowed_special="all") or ordinary
// text (encode_ordinary), both checked against js-tiktoken's ids.
TEST(EotInText, Gpt2BothModesMatchJsTiktoken) {
    SKIP_WITHOUT(kGpt2Dir / "encoder.json");
    const std::string text = read_text_file(kTestData / "tokenizer_eot.txt");
    const Tokenizer& tokenizer = gpt2_tokenizer();
    const auto as_token = tokenizer.encode(text, gpt2::EotInText::Token);
    const auto as_text = tokenizer.encode(text, gpt2::EotInText::Text);
    EXPECT_EQ(as_token, read_u16_ids(kTestData / "tokenizer_gpt2_eot_token.u16"));
    EXPECT_EQ(as_text, read_u16_ids(kTestData / "tokenizer_gpt2_eot_text.u16"));
    EXPECT_EQ(std::count(as_token.begin(), as_token.end(), 50256), 6);
    EXPECT_EQ(std::count(as_text.begin(), as_text.end(), 50256), 0);
    EXPECT_EQ(tokenizer.decode(as_token), text);
    EXPECT_EQ(tokenizer.decode(as_text), text);
    EXPECT_EQ(tokenizer.encode(text), as_token) << "the default is the token";
    // encode_blocks honours the mode too.
    EXPECT_EQ(gpt2::encode_blocks(tokenizer, text, 2, {}, gpt2::EotInText::Text), as_text);
}

TEST(EotInText, BpeModesDifferAndBothDecodeBack) {
    const auto bpe = gpt2::train_bpe_tokenizer(small_corpus(), 400);
    const std::string text = "one<|endoftext|>two <|endoftext|> three";
    const auto as_token = bpe->encode(text, gpt2::EotInText::Token);
    const auto as_text = bpe->encode(text, gpt2::EotInText::Text);
    EXPECT_EQ(std::count(as_token.begin(), as_token.end(), *bpe->eot_id()), 2);
    EXPECT_EQ(std::count(as_text.begin(), as_text.end(), *bpe->eot_id()), 0);
    EXPECT_EQ(bpe->decode(as_token), text);
    EXPECT_EQ(bpe->decode(as_text), text);
    // The char tokenizer has no end-of-text token: both modes are the same bytes.
    const auto chars = gpt2::make_char_tokenizer(text);
    EXPECT_EQ(chars->encode(text, gpt2::EotInText::Token),
              chars->encode(text, gpt2::EotInText::Text));
    EXPECT_EQ(gpt2::parse_eot_in_text("text"), gpt2::EotInText::Text);
    EXPECT_EQ(gpt2::parse_eot_in_text("token"), gpt2::EotInText::Token);
    EXPECT_THROW((void)gpt2::parse_eot_in_text("special"), gpt2::InputError);
}

TEST(Gpt2Tokenizer, RoundTripsRandomBytesIncludingInvalidUtf8) {
    SKIP_WITHOUT(kGpt2Dir / "encoder.json");
    expect_round_trips(gpt2_tokenizer(), 5, 1000);
    // Invalid bytes are pre-tokens of their own, between the valid text around them.
    const Tokenizer& tokenizer = gpt2_tokenizer();
    EXPECT_EQ(tokenizer.encode("Hello\xffworld"),
              (std::vector<std::int32_t>{15496, tokenizer.encode("\xff")[0], 6894}));
}

TEST(Gpt2Tokenizer, EveryTokenEncodesToItself) {
    SKIP_WITHOUT(kGpt2Dir / "encoder.json");
    const Tokenizer& tokenizer = gpt2_tokenizer();
    std::vector<std::string> all;
    for (int id = 0; id < tokenizer.vocab_size(); ++id)
        all.push_back(tokenizer.token_bytes(id));
    std::sort(all.begin(), all.end());
    EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end()) << "duplicate token bytes";
    // Tokens that are one pre-token on their own (bytes, " word", "123"; not e.g. partial UTF-8,
    // which the pre-tokenizer splits) must come back as themselves.
    const auto single_pretoken = [](const std::string& token) {
        const std::size_t start = token.size() > 1 && token[0] == ' ' ? 1 : 0;
        const auto all = [&](auto predicate) {
            return std::all_of(token.begin() + start, token.end(),
                               [&](char c) { return predicate(static_cast<unsigned char>(c)); });
        };
        return token.size() == 1 || all(::isalpha) || all(::isdigit);
    };
    int checked = 0;
    for (int id = 0; id < tokenizer.vocab_size(); ++id) {
        const std::string token = tokenizer.token_bytes(id);
        if (!single_pretoken(token)) continue;
        ASSERT_EQ(tokenizer.encode(token), std::vector<std::int32_t>{id}) << "'" << token << "'";
        ++checked;
    }
    EXPECT_GT(checked, 30000);
}

TEST(Gpt2Tokenizer, MissingOrBrokenFilesAreInputErrors) {
    const ScratchDir scratch("gpt2_tok_test");
    const fs::path& dir = scratch.path();
    std::string message = error_message([&] { (void)gpt2::load_gpt2_tokenizer(dir); });
    EXPECT_NE(message.find("encoder.json"), std::string::npos) << message;
    write_bytes(dir / "encoder.json", "{\"a\": 0, \"<|endoftext|>\": ");
    write_bytes(dir / "vocab.bpe", "#version: 0.2\n");
    message = error_message([&] { (void)gpt2::load_gpt2_tokenizer(dir); });
    EXPECT_NE(message.find("encoder.json"), std::string::npos) << message;
    if (fs::exists(kGpt2Dir / "encoder.json")) {
        fs::copy_file(kGpt2Dir / "encoder.json", dir / "encoder.json",
                      fs::copy_options::overwrite_existing);
        write_bytes(dir / "vocab.bpe", "#version: 0.2\n\xc4\xa0 t\nno_such_token x\n");
        message = error_message([&] { (void)gpt2::load_gpt2_tokenizer(dir); });
        EXPECT_NE(message.find("vocab.bpe:3"), std::string::npos) << message;
    }
}
