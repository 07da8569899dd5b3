// Tests of the char, bpe and gpt2 tokenizers: round trips, training, serialization, llm.c's
// tokenizer file, and GPT-2 ids checked against js-tiktoken's. The expected ids were made with
//   node scripts/make_tokenizer_reference.mjs TEXT_FILE tests/data/tokenizer_gpt2_NAME.u16
// for TEXT_FILE = ../shared/data/tinyshakespeare.txt and tests/data/tokenizer_stress.txt.
// The stress text avoids U+0085, U+FEFF and U+180E, on which JavaScript's \s (js-tiktoken) and
// PCRE2's \s disagree; it holds no invalid UTF-8, which JavaScript strings cannot carry (random
// round-trip tests cover that).
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "tokenizer/tokenizer.hpp"

namespace fs = std::filesystem;
using gpt2::InputError;
using gpt2::Tokenizer;
using gpt2::TokenizerKind;

namespace {

const fs::path kTestData = GPT2_TEST_DATA_DIR;
const fs::path kSharedData = GPT2_SHARED_DATA_DIR;
const fs::path kShakespeare = kSharedData / "tinyshakespeare.txt";
const fs::path kGpt2Dir = kSharedData / "gpt2";

std::string read_file(const fs::path& path) {
    std::ifstream file(path, std::ios::binary);
    if (!file) throw std::runtime_error("cannot open " + path.string());
    return {std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
}

std::vector<std::int32_t> read_u16_ids(const fs::path& path) {
    const std::string bytes = read_file(path);
    std::vector<std::int32_t> ids(bytes.size() / 2);
    for (std::size_t i = 0; i < ids.size(); ++i) {
        ids[i] = static_cast<unsigned char>(bytes[2 * i]) |
                 (static_cast<unsigned char>(bytes[2 * i + 1]) << 8);
    }
    return ids;
}

void write_file(const fs::path& path, std::string_view data) {
    std::ofstream file(path, std::ios::binary | std::ios::trunc);
    file.write(data.data(), static_cast<std::streamsize>(data.size()));
}

#define SKIP_WITHOUT(path)                                                                    \
    if (!fs::exists(path))                                                                    \
    GTEST_SKIP() << (path).string()                                                           \
                 << " is missing (tinyshakespeare.txt, or run scripts/get_gpt2_tokenizer.sh " \
                    "for GPT-2's files)"

// The GPT-2 tokenizer is loaded once for the whole program: loading takes ~0.1 s.
const Tokenizer& gpt2_tokenizer() {
    static const std::unique_ptr<Tokenizer> tokenizer = gpt2::load_gpt2_tokenizer(kGpt2Dir);
    return *tokenizer;
}

const std::string& shakespeare() {
    static const std::string text = read_file(kShakespeare);
    return text;
}

// A corpus that does not need the shared data files.
std::string small_corpus() {
    std::string corpus;
    const char* const lines[] = {
        "the cat sat on the mat, and the dog sat on the log.\n",
        "The rain in Spain stays mainly in the plain; isn't it? It's 2024 now.\n",
        "she sells sea shells by the sea shore    with  spaces\tand\ttabs\n",
        "caf\xc3\xa9 na\xc3\xafve \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80 aaaa bbbb abab\n",
    };
    for (int repeat = 0; repeat < 20; ++repeat) {
        for (const char* line : lines)
            corpus += line;
    }
    return corpus;
}

// Random bytes biased towards hard cases: valid multi-byte UTF-8, truncated and overlong
// sequences, encoded surrogates, bytes that never occur in UTF-8, whitespace runs, contractions
// and <|endoftext|>.
std::string random_bytes(std::mt19937& rng, std::size_t max_pieces) {
    static const std::vector<std::string> pieces = {"a",
                                                    "Z",
                                                    " ",
                                                    "  ",
                                                    "\t",
                                                    "\n",
                                                    "\r\n",
                                                    "'s",
                                                    "'ll",
                                                    "'",
                                                    "9",
                                                    "42",
                                                    "!",
                                                    "...",
                                                    "\xc3\xa9",
                                                    "\xe4\xb8\xad",
                                                    "\xf0\x9f\x98\x80",
                                                    "\xd9\xa1",
                                                    "\xc2\xa0",
                                                    "\xe3\x80\x80",
                                                    "\xc3",
                                                    "\xe4\xb8",
                                                    "\xf0\x9f\x98",
                                                    "\x80",
                                                    "\xbf",
                                                    "\xc0\xaf",
                                                    "\xe0\x80\xaf",
                                                    "\xed\xa0\x80",
                                                    "\xf5\x80\x80\x80",
                                                    "\xfe",
                                                    "\xff",
                                                    "<|endoftext|>",
                                                    "<|endof",
                                                    "\0"};
    std::uniform_int_distribution<std::size_t> count(0, max_pieces);
    std::uniform_int_distribution<std::size_t> pick(0, pieces.size() - 1);
    std::uniform_int_distribution<int> byte(0, 255);
    std::bernoulli_distribution raw(0.3);
    std::string text;
    const std::size_t n = count(rng);
    for (std::size_t i = 0; i < n; ++i) {
        if (raw(rng)) {
            text += static_cast<char>(byte(rng));
        } else {
            text += pieces[pick(rng)];
        }
    }
    return text;
}

void expect_round_trips(const Tokenizer& tokenizer, std::uint32_t seed, int cases) {
    std::mt19937 rng(seed);
    for (int i = 0; i < cases; ++i) {
        const std::string text = random_bytes(rng, 60);
        const std::vector<std::int32_t> ids = tokenizer.encode(text);
        for (const std::int32_t id : ids) {
            ASSERT_GE(id, 0);
            ASSERT_LT(id, tokenizer.vocab_size());
        }
        ASSERT_EQ(tokenizer.decode(ids), text) << "case " << i;
        std::string streamed;
        for (const std::int32_t id : ids)
            streamed += tokenizer.token_bytes(id);
        ASSERT_EQ(streamed, text);
    }
}

void expect_same_tokenizer(const Tokenizer& a, const Tokenizer& b, std::string_view sample) {
    EXPECT_EQ(a.kind(), b.kind());
    EXPECT_EQ(a.vocab_size(), b.vocab_size());
    EXPECT_EQ(a.eot_id(), b.eot_id());
    for (int id = 0; id < a.vocab_size(); ++id)
        ASSERT_EQ(a.token_bytes(id), b.token_bytes(id));
    EXPECT_EQ(a.encode(sample), b.encode(sample));
    EXPECT_EQ(a.serialize(), b.serialize());
}

template <typename F>
std::string error_message(F&& f) {
    try {
        f();
    } catch (const InputError& e) {
        return e.what();
    }
    ADD_FAILURE() << "no InputError thrown";
    return {};
}

// GPT-2's reference merge loop (encoder.py): repeatedly merge every occurrence of the
// lowest-ranked adjacent pair. Quadratic, but obviously right.
std::vector<std::int32_t> naive_bpe(const Tokenizer& tokenizer, std::string_view piece) {
    std::map<std::string, std::int32_t> id_of;
    for (int id = 0; id < tokenizer.vocab_size(); ++id) {
        if (id != tokenizer.eot_id()) id_of.emplace(tokenizer.token_bytes(id), id);
    }
    // Rank of a pair = the id it merges into minus 256 for our trained BPE (ids follow ranks).
    std::vector<std::string> parts;
    for (const char c : piece)
        parts.emplace_back(1, c);
    for (;;) {
        int best = -1;
        for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
            const auto it = id_of.find(parts[i] + parts[i + 1]);
            if (it != id_of.end() && (best < 0 || it->second < best)) best = it->second;
        }
        if (best < 0) break;
        const std::string joined = tokenizer.token_bytes(best);
        std::vector<std::string> next;
        for (std::size_t i = 0; i < parts.size(); ++i) {
            if (i + 1 < parts.size() && parts[i] + parts[i + 1] == joined) {
                next.push_back(joined);
                ++i;
            } else {
                next.push_back(parts[i]);
            }
        }
        parts = std::move(next);
    }
    std::vector<std::int32_t> ids;
    for (const auto& part : parts)
        ids.push_back(id_of.at(part));
    return ids;
}

}  // namespace

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

// Load speed is a benchmark figure (scripts/bench_tokenizer.sh), not a test assertion: CI
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
    const std::string text = read_file(kTestData / "tokenizer_stress.txt");
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
    const std::string text = read_file(kTestData / "tokenizer_eot.txt");
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
    const fs::path dir = fs::temp_directory_path() / ("gpt2_tok_test_" + std::to_string(getpid()));
    fs::create_directories(dir);
    std::string message = error_message([&] { (void)gpt2::load_gpt2_tokenizer(dir); });
    EXPECT_NE(message.find("encoder.json"), std::string::npos) << message;
    write_file(dir / "encoder.json", "{\"a\": 0, \"<|endoftext|>\": ");
    write_file(dir / "vocab.bpe", "#version: 0.2\n");
    message = error_message([&] { (void)gpt2::load_gpt2_tokenizer(dir); });
    EXPECT_NE(message.find("encoder.json"), std::string::npos) << message;
    if (fs::exists(kGpt2Dir / "encoder.json")) {
        fs::copy_file(kGpt2Dir / "encoder.json", dir / "encoder.json",
                      fs::copy_options::overwrite_existing);
        write_file(dir / "vocab.bpe", "#version: 0.2\n\xc4\xa0 t\nno_such_token x\n");
        message = error_message([&] { (void)gpt2::load_gpt2_tokenizer(dir); });
        EXPECT_NE(message.find("vocab.bpe:3"), std::string::npos) << message;
    }
    fs::remove_all(dir);
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
    const std::string text = read_file(kTestData / "tokenizer_stress.txt") +
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
        dir_ = fs::temp_directory_path() /
               ("llmc_tok_test_" + std::to_string(getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
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
        const std::string bytes = read_file(path);
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
    const std::string good = read_file(path);
    const auto expect_error = [&](std::string bytes, std::string_view needle) {
        write_file(path, bytes);
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
