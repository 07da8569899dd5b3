// A tokenizer's bytes: our serialization (every kind round trips, little-endian, every truncation
// and corruption an input error) and llm.c's tokenizer file.
#include <gtest/gtest.h>

#include "tokenizer_support.hpp"

// ---------------------------------------------------------------------------------------------
// serialization

TEST(TokenizerSerialization, RoundTripsEveryKind) {
    const std::string sample = "Sample text, with <|endoftext|> and caf\xc3\xa9 \xff\n";
    std::vector<std::unique_ptr<Tokenizer>> tokenizers;
    tokenizers.push_back(gpt2::make_char_tokenizer(sample));
    tokenizers.push_back(gpt2::train_bpe_tokenizer(small_corpus(), 400));
    if (fs::exists(kGpt2Dir / "encoder.json")) {
        tokenizers.push_back(gpt2::load_gpt2_tokenizer(kGpt2Dir));
    }
    for (const auto& tokenizer : tokenizers) {
        const std::vector<std::uint8_t> bytes = tokenizer->serialize();
        ASSERT_GE(bytes.size(), 2u);
        EXPECT_EQ(bytes[0], static_cast<std::uint8_t>(tokenizer->kind()));
        const auto copy = gpt2::deserialize_tokenizer(bytes);
        expect_same_tokenizer(*tokenizer, *copy, sample);
    }
}

TEST(TokenizerSerialization, PortableLittleEndianLayout) {
    const auto tokenizer = gpt2::make_char_tokenizer("ba");
    EXPECT_EQ(tokenizer->serialize(), (std::vector<std::uint8_t>{1, 1, 2, 0, 0, 0, 'a', 'b'}));
    const auto bpe = gpt2::train_bpe_tokenizer("abab", 258);
    EXPECT_EQ(bpe->serialize(),
              (std::vector<std::uint8_t>{2, 1, 1, 0, 0, 0, 'a', 0, 0, 0, 'b', 0, 0, 0}));
}

TEST(TokenizerSerialization, EveryTruncationIsAnInputError) {
    std::vector<std::vector<std::uint8_t>> all = {
        gpt2::make_char_tokenizer("hello")->serialize(),
        gpt2::train_bpe_tokenizer(small_corpus(), 280)->serialize()};
    for (const auto& bytes : all) {
        for (std::size_t n = 0; n < bytes.size(); ++n) {
            EXPECT_THROW((void)gpt2::deserialize_tokenizer(std::span(bytes.data(), n)), InputError)
                << "prefix of " << n << " bytes";
        }
        std::vector<std::uint8_t> longer = bytes;
        longer.push_back(0);
        EXPECT_THROW((void)gpt2::deserialize_tokenizer(longer), InputError);
    }
}

TEST(TokenizerSerialization, CorruptBytesAreInputErrors) {
    const std::vector<std::uint8_t> good = gpt2::train_bpe_tokenizer("abab", 258)->serialize();
    auto corrupt = [&](std::size_t index, std::uint8_t value) {
        std::vector<std::uint8_t> bytes = good;
        bytes[index] = value;
        return error_message([&] { (void)gpt2::deserialize_tokenizer(bytes); });
    };
    EXPECT_NE(corrupt(0, 9).find("kind"), std::string::npos);
    EXPECT_NE(corrupt(1, 7).find("version"), std::string::npos);
    EXPECT_NE(corrupt(2, 200).find("merge count"), std::string::npos);
    EXPECT_NE(corrupt(9, 1).find("merge 0"), std::string::npos);  // left id 'a' + 2^24
    const std::string repeated = error_message([] {
        (void)gpt2::deserialize_tokenizer(std::vector<std::uint8_t>{
            2, 1, 2, 0, 0, 0, 'a', 0, 0, 0, 'b', 0, 0, 0, 'a', 0, 0, 0, 'b', 0, 0, 0});
    });
    EXPECT_NE(repeated.find("repeats merge 0"), std::string::npos) << repeated;
    EXPECT_THROW((void)gpt2::deserialize_tokenizer(std::vector<std::uint8_t>{}), InputError);
    // Char alphabets must be strictly increasing.
    EXPECT_THROW(
        (void)gpt2::deserialize_tokenizer(std::vector<std::uint8_t>{1, 1, 2, 0, 0, 0, 'b', 'a'}),
        InputError);
    // A gpt2 vocabulary without every single byte cannot encode arbitrary text.
    EXPECT_THROW((void)gpt2::deserialize_tokenizer(std::vector<std::uint8_t>{
                     3, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 'a', 0, 0, 0, 0}),
                 InputError);
}

TEST(TokenizerSerialization, RandomCorruptionNeverCrashes) {
    const std::vector<std::uint8_t> good =
        gpt2::train_bpe_tokenizer(small_corpus(), 300)->serialize();
    std::mt19937 rng(7);
    std::uniform_int_distribution<std::size_t> where(0, good.size() - 1);
    std::uniform_int_distribution<int> value(0, 255);
    for (int i = 0; i < 300; ++i) {
        std::vector<std::uint8_t> bytes = good;
        for (int k = 0; k < 3; ++k)
            bytes[where(rng)] = static_cast<std::uint8_t>(value(rng));
        try {
            const auto tokenizer = gpt2::deserialize_tokenizer(bytes);
            const std::string text = "the cat sat on the mat";
            EXPECT_EQ(tokenizer->decode(tokenizer->encode(text)), text);
        } catch (const InputError&) {
        }
    }
}

// ---------------------------------------------------------------------------------------------
// llm.c tokenizer file

class LlmcTokenizerFile : public ::testing::Test {
  protected:
    void SetUp() override {
        scratch_.emplace(std::string("llmc_tok_test_") +
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
        dir_ = scratch_->path();
    }
    std::optional<ScratchDir> scratch_;
    fs::path dir_;
};

TEST_F(LlmcTokenizerFile, RoundTripsEveryKind) {
    std::vector<std::unique_ptr<Tokenizer>> tokenizers;
    tokenizers.push_back(gpt2::make_char_tokenizer("hello world"));
    tokenizers.push_back(gpt2::train_bpe_tokenizer(small_corpus(), 400));
    if (fs::exists(kGpt2Dir / "encoder.json")) {
        tokenizers.push_back(gpt2::load_gpt2_tokenizer(kGpt2Dir));
    }
    for (const auto& tokenizer : tokenizers) {
        const fs::path path = dir_ / "tokenizer.bin";
        gpt2::write_llmc_tokenizer(*tokenizer, path);
        const std::vector<std::string> tokens = gpt2::read_llmc_tokenizer(path);
        ASSERT_EQ(tokens.size(), static_cast<std::size_t>(tokenizer->vocab_size()));
        for (int id = 0; id < tokenizer->vocab_size(); ++id) {
            ASSERT_EQ(tokens[id], tokenizer->token_bytes(id));
        }
        const std::string bytes = read_text_file(path);
        const auto word = [&](int i) {
            std::uint32_t value = 0;
            for (int b = 0; b < 4; ++b) {
                value |= std::uint32_t{static_cast<unsigned char>(bytes[4 * i + b])} << (8 * b);
            }
            return value;
        };
        EXPECT_EQ(word(0), 20240328u);
        EXPECT_EQ(word(1), 2u);
        EXPECT_EQ(word(2), static_cast<std::uint32_t>(tokenizer->vocab_size()));
        EXPECT_EQ(word(3), tokenizer->eot_id() ? static_cast<std::uint32_t>(*tokenizer->eot_id())
                                               : 0xFFFFFFFFu);
    }
}

TEST_F(LlmcTokenizerFile, BadFilesAreInputErrors) {
    const fs::path path = dir_ / "tokenizer.bin";
    EXPECT_NE(error_message([&] { (void)gpt2::read_llmc_tokenizer(path); }).find(path.string()),
              std::string::npos);
    EXPECT_THROW((void)gpt2::read_llmc_tokenizer(dir_), InputError);
    gpt2::write_llmc_tokenizer(*gpt2::make_char_tokenizer("abc"), path);
    const std::string good = read_text_file(path);
    const auto expect_error = [&](std::string bytes, std::string_view needle) {
        write_bytes(path, bytes);
        const std::string message = error_message([&] { (void)gpt2::read_llmc_tokenizer(path); });
        EXPECT_NE(message.find(needle), std::string::npos) << message;
    };
    std::string bad = good;
    bad[0] = 0;
    expect_error(bad, "magic");
    bad = good;
    bad[4] = 3;
    expect_error(bad, "version");
    bad = good;
    bad[8] = 100;
    expect_error(bad, "vocab size");
    expect_error(good.substr(0, good.size() - 1), "vocab size");
    expect_error(good + "x", "trailing");
    expect_error(good.substr(0, 100), "truncated");
    bad = good;
    bad[1024] = 0;
    expect_error(bad, "length 0");
}

TEST_F(LlmcTokenizerFile, TokensLongerThan255BytesCannotBeWritten) {
    // Merging a run of 'a' doubles the token each time: aa, aaaa, ..., 512 a's.
    const auto tokenizer = gpt2::train_bpe_tokenizer(std::string(512, 'a'), 266);
    ASSERT_EQ(tokenizer->token_bytes(256 + 8), std::string(512, 'a'));
    ASSERT_EQ(tokenizer->token_bytes(256 + 7), std::string(256, 'a'));
    const std::string message =
        error_message([&] { gpt2::write_llmc_tokenizer(*tokenizer, dir_ / "long.bin"); });
    EXPECT_NE(message.find("token 263"), std::string::npos) << message;
}
