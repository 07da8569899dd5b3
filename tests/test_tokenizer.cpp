// Tests of the char and bpe tokenizers: alphabets, training (deterministic, incremental counts
// equal to full recounts), encoding against a naive merge loop, round trips, and encoding in
// blocks equal to encoding the whole text.
#include <gtest/gtest.h>

#include "tokenizer_support.hpp"

// ---------------------------------------------------------------------------------------------
// char

TEST(CharTokenizer, AlphabetIsTheSortedSetOfCorpusBytes) {
    const auto tokenizer = gpt2::make_char_tokenizer("hello, world");
    EXPECT_EQ(tokenizer->kind(), TokenizerKind::Char);
    EXPECT_EQ(tokenizer->vocab_size(), 9);  // ' ' ',' d e h l o r w
    EXPECT_FALSE(tokenizer->eot_id().has_value());
    EXPECT_EQ(tokenizer->token_bytes(0), " ");
    EXPECT_EQ(tokenizer->token_bytes(8), "w");
    EXPECT_EQ(tokenizer->encode("hello"), (std::vector<std::int32_t>{4, 3, 5, 5, 6}));
    EXPECT_EQ(tokenizer->decode(std::vector<std::int32_t>{8, 6, 7, 5, 2}), "world");
}

TEST(CharTokenizer, TinyShakespeareHas65Symbols) {
    SKIP_WITHOUT(kShakespeare);
    const auto tokenizer = gpt2::make_char_tokenizer(shakespeare());
    EXPECT_EQ(tokenizer->vocab_size(), 65);
    EXPECT_EQ(tokenizer->token_bytes(0), "\n");
    EXPECT_EQ(tokenizer->decode(tokenizer->encode(shakespeare())), shakespeare());
}

TEST(CharTokenizer, UnknownByteIsAnInputErrorNamingTheByte) {
    const auto tokenizer = gpt2::make_char_tokenizer("abc");
    const std::string message = error_message([&] { (void)tokenizer->encode("abz"); });
    EXPECT_NE(message.find("122"), std::string::npos) << message;
    EXPECT_NE(message.find("offset 2"), std::string::npos) << message;
    const std::string high = error_message([&] { (void)tokenizer->encode("\xff"); });
    EXPECT_NE(high.find("255"), std::string::npos) << high;
}

TEST(CharTokenizer, RejectsEmptyCorpusAndBadIds) {
    EXPECT_THROW((void)gpt2::make_char_tokenizer(""), InputError);
    const auto tokenizer = gpt2::make_char_tokenizer("abc");
    EXPECT_THROW((void)tokenizer->decode(std::vector<std::int32_t>{3}), InputError);
    EXPECT_THROW((void)tokenizer->decode(std::vector<std::int32_t>{-1}), InputError);
    EXPECT_THROW((void)tokenizer->token_bytes(3), InputError);
}

TEST(CharTokenizer, RoundTripsRandomBytes) {
    std::string all_bytes;
    for (int b = 0; b < 256; ++b)
        all_bytes += static_cast<char>(b);
    const auto tokenizer = gpt2::make_char_tokenizer(all_bytes);
    EXPECT_EQ(tokenizer->vocab_size(), 256);
    expect_round_trips(*tokenizer, 1, 300);
}

// ---------------------------------------------------------------------------------------------
// bpe

TEST(BpeTokenizer, VocabularyLayout) {
    const auto tokenizer = gpt2::train_bpe_tokenizer(small_corpus(), 300);
    EXPECT_EQ(tokenizer->kind(), TokenizerKind::Bpe);
    EXPECT_EQ(tokenizer->vocab_size(), 300);
    EXPECT_EQ(tokenizer->eot_id(), 299);
    EXPECT_EQ(tokenizer->token_bytes(299), "<|endoftext|>");
    for (int b = 0; b < 256; ++b)
        EXPECT_EQ(tokenizer->token_bytes(b), std::string(1, char(b)));
    // Merges never cross pre-token boundaries, and pre-tokens never hold a letter followed by a
    // space, so no token does either.
    for (int id = 256; id < 299; ++id) {
        const std::string token = tokenizer->token_bytes(id);
        EXPECT_GE(token.size(), 2u);
        for (std::size_t i = 0; i + 1 < token.size(); ++i) {
            EXPECT_FALSE(std::isalpha(static_cast<unsigned char>(token[i])) && token[i + 1] == ' ')
                << "token " << id << " '" << token << "'";
        }
    }
}

TEST(BpeTokenizer, FirstMergeIsTheMostFrequentPair) {
    // Pre-tokens: "aaab" x3 -> pairs aa:6 ab:3; " ab" x2 -> " a":2 ab:2. "aa" wins with 6.
    const auto tokenizer = gpt2::train_bpe_tokenizer("aaab aaab aaab ab ab", 258);
    EXPECT_EQ(tokenizer->token_bytes(256), "aa");
    EXPECT_EQ(tokenizer->encode("aaab"), (std::vector<std::int32_t>{256, 'a', 'b'}));
}

TEST(BpeTokenizer, TiesBreakTowardsTheSmallestPairIds) {
    // "ba" and "dc" both occur twice: ('b','a') = (98, 97) sorts before ('d','c').
    const auto tokenizer = gpt2::train_bpe_tokenizer("dc\nba\ndc\nba", 258);
    EXPECT_EQ(tokenizer->token_bytes(256), "ba");
}

TEST(BpeTokenizer, StopsEarlyWhenTheCorpusHasNoPairsLeft) {
    const auto tokenizer = gpt2::train_bpe_tokenizer("abab", 1000);
    // "abab" -> ab, then abab: two merges, then nothing is left to merge.
    EXPECT_EQ(tokenizer->vocab_size(), 256 + 2 + 1);
    EXPECT_EQ(tokenizer->encode("abab"), (std::vector<std::int32_t>{257}));
}

TEST(BpeTokenizer, RejectsBadVocabSizes) {
    EXPECT_THROW((void)gpt2::train_bpe_tokenizer("abc", 256), InputError);
    EXPECT_THROW((void)gpt2::train_bpe_tokenizer("abc", -1), InputError);
    EXPECT_THROW((void)gpt2::train_bpe_tokenizer("abc", 1 << 30), InputError);
    EXPECT_EQ(gpt2::train_bpe_tokenizer("abc", 257)->vocab_size(), 257);
}

TEST(BpeTokenizer, TrainingIsDeterministic) {
    const std::string corpus = small_corpus();
    const auto a = gpt2::train_bpe_tokenizer(corpus, 400);
    const auto b = gpt2::train_bpe_tokenizer(corpus, 400);
    EXPECT_EQ(a->serialize(), b->serialize());
}

// Reference trainer: recounts every pair of every word before each merge. The corpus is
// lowercase words joined by single spaces, so its pre-tokens are simply "w1", " w2", " w3", ...
TEST(BpeTokenizer, IncrementalTrainingMatchesFullRecounts) {
    std::mt19937 rng(8);
    std::uniform_int_distribution<int> letter('a', 'e');
    std::uniform_int_distribution<int> length(1, 9);
    std::vector<std::string> words;
    std::string corpus;
    for (int i = 0; i < 3000; ++i) {
        std::string word = i == 0 ? "" : " ";
        for (int n = length(rng); n > 0; --n)
            word += static_cast<char>(letter(rng));
        corpus += word;
        words.push_back(word);
    }
    const int num_merges = 150;
    const auto trained = gpt2::train_bpe_tokenizer(corpus, 257 + num_merges);
    ASSERT_EQ(trained->vocab_size(), 257 + num_merges);

    std::vector<std::vector<int>> state;  // each word as token ids
    for (const auto& word : words)
        state.emplace_back(word.begin(), word.end());
    for (int merge = 0; merge < num_merges; ++merge) {
        std::map<std::pair<int, int>, long> counts;
        for (const auto& parts : state) {
            for (std::size_t i = 0; i + 1 < parts.size(); ++i)
                ++counts[{parts[i], parts[i + 1]}];
        }
        ASSERT_FALSE(counts.empty());
        auto best = counts.begin();  // map order: the smallest pair wins among equal counts
        for (auto it = counts.begin(); it != counts.end(); ++it) {
            if (it->second > best->second) best = it;
        }
        const auto [left, right] = best->first;
        const int id = 256 + merge;
        ASSERT_EQ(trained->token_bytes(id),
                  trained->token_bytes(left) + trained->token_bytes(right))
            << "merge " << merge;
        for (auto& parts : state) {
            std::vector<int> next;
            for (std::size_t i = 0; i < parts.size(); ++i) {
                if (i + 1 < parts.size() && parts[i] == left && parts[i + 1] == right) {
                    next.push_back(id);
                    ++i;
                } else {
                    next.push_back(parts[i]);
                }
            }
            parts = std::move(next);
        }
    }
    // Encoding a training word applies the same merges.
    for (std::size_t w = 0; w < 50; ++w) {
        EXPECT_EQ(trained->encode(words[w]),
                  std::vector<std::int32_t>(state[w].begin(), state[w].end()));
    }
}

TEST(BpeTokenizer, EncodingMatchesNaiveMergeLoop) {
    const auto tokenizer = gpt2::train_bpe_tokenizer(small_corpus(), 400);
    // Long single pre-tokens exercise the heap-based merge; short ones the common case.
    const std::vector<std::string> pieces = {"the",
                                             " the",
                                             "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
                                             std::string(300, ' '),
                                             "abababababababababababababab",
                                             " sea",
                                             "shells",
                                             std::string(1000, 'a'),
                                             " thethethethethethecatcatmatmat"};
    for (const auto& piece : pieces) {
        EXPECT_EQ(tokenizer->encode(piece), naive_bpe(*tokenizer, piece)) << "'" << piece << "'";
    }
}

TEST(BpeTokenizer, EndOfTextInTextIsTheEotToken) {
    const auto tokenizer = gpt2::train_bpe_tokenizer(small_corpus(), 300);
    const std::vector<std::int32_t> ids = tokenizer->encode("a<|endoftext|>b<|endoftext|>");
    EXPECT_EQ(ids, (std::vector<std::int32_t>{'a', 299, 'b', 299}));
    EXPECT_EQ(tokenizer->decode(ids), "a<|endoftext|>b<|endoftext|>");
    // Training treats it as a document separator, never as text to learn merges from.
    const auto separated =
        gpt2::train_bpe_tokenizer("<|endoftext|><|endoftext|><|endoftext|>xy<|endoftext|>xy", 1000);
    EXPECT_EQ(separated->vocab_size(), 256 + 1 + 1);
    EXPECT_EQ(separated->token_bytes(256), "xy");
}

TEST(BpeTokenizer, RoundTripsRandomBytes) {
    const auto tokenizer = gpt2::train_bpe_tokenizer(small_corpus(), 400);
    expect_round_trips(*tokenizer, 2, 500);
    // Trained on random bytes, including invalid UTF-8.
    std::mt19937 rng(9);
    const auto byte_trained = gpt2::train_bpe_tokenizer(random_bytes(rng, 3000), 500);
    expect_round_trips(*byte_trained, 3, 300);
}

TEST(BpeTokenizer, TinyShakespeareTo4096TokensIsExact) {
    SKIP_WITHOUT(kShakespeare);
    const auto tokenizer = gpt2::train_bpe_tokenizer(shakespeare(), 4096);
    EXPECT_EQ(tokenizer->vocab_size(), 4096);
    const std::vector<std::int32_t> ids = tokenizer->encode(shakespeare());
    EXPECT_LT(ids.size(), shakespeare().size() / 3);
    EXPECT_EQ(tokenizer->decode(ids), shakespeare());
    expect_round_trips(*tokenizer, 4, 300);
    // Deterministic on a real corpus too.
    EXPECT_EQ(gpt2::train_bpe_tokenizer(shakespeare(), 4096)->serialize(), tokenizer->serialize());
}

// ---------------------------------------------------------------------------------------------
// encode_blocks

TEST(TokenizerEncodeBlocks, EqualsWholeTextEncoding) {
    // Over 1 MiB so that it is cut into blocks, with lines ending in space runs, CRLF, and
    // <|endoftext|> near the cuts.
    std::string text;
    std::mt19937 rng(6);
    while (text.size() < (std::size_t{5} << 19)) {
        text += small_corpus();
        text += "x  \nY\n\nZ \r\nq<|endoftext|>\nw.\n" + random_bytes(rng, 20) + "\n";
    }
    const auto bpe = gpt2::train_bpe_tokenizer(small_corpus(), 350);
    std::vector<std::size_t> progress;
    const std::vector<std::int32_t> blocked =
        gpt2::encode_blocks(*bpe, text, 2, [&](std::size_t done) { progress.push_back(done); });
    EXPECT_EQ(blocked, bpe->encode(text));
    ASSERT_FALSE(progress.empty());
    EXPECT_EQ(progress.back(), text.size());
    EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));
    EXPECT_EQ(gpt2::encode_blocks(*bpe, text, 1), blocked);
    EXPECT_TRUE(gpt2::encode_blocks(*bpe, "", 2).empty());
}

TEST(TokenizerEncodeBlocks, Gpt2OnTinyShakespeare) {
    SKIP_WITHOUT(kGpt2Dir / "encoder.json");
    SKIP_WITHOUT(kShakespeare);
    EXPECT_EQ(gpt2::encode_blocks(gpt2_tokenizer(), shakespeare(), 2),
              read_u16_ids(kTestData / "tokenizer_gpt2_tinyshakespeare.u16"));
}

// Every position is_safe_cut accepts splits the text without changing its tokens, for non-ASCII
// text too (Cyrillic, CJK, emoji, combining marks), while the whitespace that could join a run
// (NBSP, ideographic space, CR) and broken UTF-8 are never cut next to.
TEST(TokenizerSafeCuts, BothSidesEncodeAsTheWhole) {
    const std::string text = read_text_file(kTestData / "tokenizer_stress.txt") +
                             "\n\xD0\x9F\xD1\x80\xD0\xB8\n\xE4\xB8\xAD\xE6\x96\x87\n"
                             "\xF0\x9F\x98\x80!\ne\xCC\x81t\xC3\xA9\n\xC2\xA0x\nx\xC2\xA0\n"
                             "y\xE3\x80\x80\ny\r\nz\n\xFF\x80\nq\n\xE4\xB8\n<|endoftext|>\nend";
    std::vector<std::size_t> cuts;
    for (std::size_t p = 0; p <= text.size(); ++p) {
        if (gpt2::is_safe_cut(text, p)) cuts.push_back(p);
    }
    // The position just after the '\n' of `around` (which must occur in the text).
    const auto after_newline = [&](std::string_view around) {
        const std::size_t found = text.find(around);
        EXPECT_NE(found, std::string::npos) << around;
        return found + around.find('\n') + 1;
    };
    for (const char* around : {"\xD0\xB8\n\xE4", "\x87\n\xF0", "!\ne", "\xA9\n\xC2"}) {
        if (std::string_view(around) == "\xA9\n\xC2") {
            EXPECT_FALSE(gpt2::is_safe_cut(text, after_newline(around)));  // NBSP after the cut
        } else {
            EXPECT_TRUE(gpt2::is_safe_cut(text, after_newline(around))) << around;
        }
    }
    for (const char* around : {"\xA0\ny\xE3", "\x80\ny", "\r\nz", "\x80\nq", "\xB8\n<"})
        EXPECT_FALSE(gpt2::is_safe_cut(text, after_newline(around))) << around;
    ASSERT_GT(cuts.size(), 20u);
    const auto bpe = gpt2::train_bpe_tokenizer(text, 400);
    std::vector<const Tokenizer*> tokenizers = {bpe.get()};
    if (fs::exists(kGpt2Dir / "encoder.json")) tokenizers.push_back(&gpt2_tokenizer());
    for (const Tokenizer* tokenizer : tokenizers) {
        const std::vector<std::int32_t> whole = tokenizer->encode(text);
        for (const std::size_t p : cuts) {
            std::vector<std::int32_t> parts =
                tokenizer->encode(std::string_view(text).substr(0, p));
            const std::vector<std::int32_t> rest =
                tokenizer->encode(std::string_view(text).substr(p));
            parts.insert(parts.end(), rest.begin(), rest.end());
            EXPECT_EQ(parts, whole) << "cut at " << p;
        }
    }
}

TEST(TokenizerEncodeBlocks, PropagatesErrors) {
    const auto tokenizer = gpt2::make_char_tokenizer("abc\n");
    std::string text;
    while (text.size() < (std::size_t{3} << 20))
        text += "abc\nabc\n";
    text += "z";
    EXPECT_THROW((void)gpt2::encode_blocks(*tokenizer, text, 2), InputError);
}
