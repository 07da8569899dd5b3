// Tests of the UTF-8 sanitizer: valid text passes unchanged whatever the cuts between pushes,
// ill-formed bytes become U+FFFD per maximal subpart, and the output is always valid UTF-8.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/utf8.hpp"

namespace gpt2 {
namespace {

const std::string kFffd(kReplacementCharacter);

std::string repeat_fffd(int n) {
    std::string out;
    for (int i = 0; i < n; ++i)
        out += kFffd;
    return out;
}

// Pushes `text` cut at `cuts` (sorted offsets), then finishes; returns everything emitted.
std::string pushed_in_pieces(std::string_view text, const std::vector<std::size_t>& cuts) {
    Utf8Sanitizer sanitizer;
    std::string out;
    std::size_t start = 0;
    for (const std::size_t cut : cuts) {
        const std::string piece = sanitizer.push(text.substr(start, cut - start));
        EXPECT_TRUE(is_valid_utf8(piece)) << "cut at " << cut;
        out += piece;
        start = cut;
    }
    out += sanitizer.push(text.substr(start));
    out += sanitizer.finish();
    return out;
}

TEST(Utf8, AsciiPassesUnchanged) {
    const std::string text = "To be, or not to be: that is the question.\n\t~\x01\x7f";
    Utf8Sanitizer sanitizer;
    EXPECT_EQ(sanitizer.push(text), text);
    EXPECT_EQ(sanitizer.pending(), 0u);
    EXPECT_EQ(sanitizer.finish(), "");
    EXPECT_EQ(sanitize_utf8(text), text);
    EXPECT_EQ(sanitize_utf8(""), "");
}

TEST(Utf8, WellFormedSequencesAtTheRangeBoundariesPassUnchanged) {
    for (const std::string_view s : {
             "\xC2\x80",          // U+0080, the first two-byte character
             "\xDF\xBF",          // U+07FF
             "\xE0\xA0\x80",      // U+0800, the first three-byte character
             "\xED\x9F\xBF",      // U+D7FF, just below the surrogates
             "\xEE\x80\x80",      // U+E000, just above them
             "\xEF\xBF\xBF",      // U+FFFF
             "\xF0\x90\x80\x80",  // U+10000, the first four-byte character
             "\xF4\x8F\xBF\xBF",  // U+10FFFF, the last code point
             "h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80",
         }) {
        EXPECT_TRUE(is_valid_utf8(s)) << s;
        EXPECT_EQ(sanitize_utf8(s), s);
    }
}

TEST(Utf8, CharacterSplitAcrossPushesIsHeldBackUntilComplete) {
    const std::string emoji = "\xF0\x9F\x98\x80";
    Utf8Sanitizer sanitizer;
    for (std::size_t i = 0; i + 1 < emoji.size(); ++i) {
        EXPECT_EQ(sanitizer.push(emoji.substr(i, 1)), "") << "byte " << i;
        EXPECT_EQ(sanitizer.pending(), i + 1);
    }
    EXPECT_EQ(sanitizer.push(emoji.substr(3)), emoji);
    EXPECT_EQ(sanitizer.pending(), 0u);
    // A push that completes one character and starts another emits the first only.
    EXPECT_EQ(sanitizer.push("a\xC3"), "a");
    EXPECT_EQ(sanitizer.push("\xA9\xE2\x82"), "\xC3\xA9");
    EXPECT_EQ(sanitizer.push("\xAC!"), "\xE2\x82\xAC!");
    EXPECT_EQ(sanitizer.finish(), "");
}

TEST(Utf8, EveryCutOfValidTextGivesTheTextBack) {
    const std::string text = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80z\xDF\xBF";
    for (std::size_t first = 0; first <= text.size(); ++first) {
        for (std::size_t second = first; second <= text.size(); ++second)
            EXPECT_EQ(pushed_in_pieces(text, {first, second}), text) << first << "," << second;
    }
}

TEST(Utf8, StrayAndImpossibleBytesBecomeOneReplacementEach) {
    EXPECT_EQ(sanitize_utf8("\x80"), kFffd);  // lone continuation byte
    EXPECT_EQ(sanitize_utf8("a\xBF"
                            "b"),
              "a" + kFffd + "b");
    EXPECT_EQ(sanitize_utf8("\xFF\xFE"), repeat_fffd(2));          // never in UTF-8
    EXPECT_EQ(sanitize_utf8("\xF5\x80\x80\x80"), repeat_fffd(4));  // beyond U+10FFFF leads
    EXPECT_EQ(sanitize_utf8("\xC3\xA9\x80"), "\xC3\xA9" + kFffd);  // one continuation too many
    for (int b = 0xF5; b <= 0xFF; ++b)
        EXPECT_EQ(sanitize_utf8(std::string(1, static_cast<char>(b))), kFffd) << b;
}

TEST(Utf8, OverlongEncodingsAreRejected) {
    // '/' as two, three and four bytes; C0 and C1 can only start overlongs.
    EXPECT_EQ(sanitize_utf8("\xC0\xAF"), repeat_fffd(2));
    EXPECT_EQ(sanitize_utf8("\xC1\xBF"), repeat_fffd(2));
    EXPECT_EQ(sanitize_utf8("\xE0\x80\xAF"), repeat_fffd(3));
    EXPECT_EQ(sanitize_utf8("\xE0\x9F\xBF"), repeat_fffd(3));  // U+07FF in three bytes
    EXPECT_EQ(sanitize_utf8("\xF0\x80\x80\xAF"), repeat_fffd(4));
    EXPECT_EQ(sanitize_utf8("\xF0\x8F\xBF\xBF"), repeat_fffd(4));  // U+FFFF in four bytes
    EXPECT_FALSE(is_valid_utf8("\xC0\xAF"));
    EXPECT_FALSE(is_valid_utf8("\xE0\x80\xAF"));
    EXPECT_FALSE(is_valid_utf8("\xF0\x8F\xBF\xBF"));
}

TEST(Utf8, SurrogatesAndCodePointsBeyondUnicodeAreRejected) {
    EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), repeat_fffd(3));  // U+D800
    EXPECT_EQ(sanitize_utf8("\xED\xBF\xBF"), repeat_fffd(3));  // U+DFFF
    // A surrogate pair encoded CESU-style is six bytes of nonsense, not one character.
    EXPECT_EQ(sanitize_utf8("\xED\xA0\xBD\xED\xB8\x80"), repeat_fffd(6));
    EXPECT_EQ(sanitize_utf8("\xF4\x90\x80\x80"), repeat_fffd(4));  // U+110000
    EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));
    EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));
}

TEST(Utf8, TruncatedSequenceIsOneReplacement) {
    // Cut short by the end of the text, by ASCII, or by the start of another character: the
    // valid prefix is one maximal subpart, and what broke it is kept.
    EXPECT_EQ(sanitize_utf8("abc\xE2\x82"), "abc" + kFffd);
    EXPECT_EQ(sanitize_utf8("\xF0\x9F\x98"), kFffd);
    EXPECT_EQ(sanitize_utf8("\xE2\x82"
                            "A"),
              kFffd + "A");
    EXPECT_EQ(sanitize_utf8("\xE2\xC3\xA9"), kFffd + "\xC3\xA9");
    EXPECT_EQ(sanitize_utf8("\xF0\x9F\xF0\x9F\x98\x80"), kFffd + "\xF0\x9F\x98\x80");
    EXPECT_FALSE(is_valid_utf8("abc\xE2\x82"));
    EXPECT_FALSE(is_valid_utf8("\xF0\x9F\x98"));
}

TEST(Utf8, TruncationFoundAcrossPushesAndAtFinish) {
    Utf8Sanitizer sanitizer;
    EXPECT_EQ(sanitizer.push("x\xE2\x82"), "x");
    EXPECT_EQ(sanitizer.push("A"), kFffd + "A");
    EXPECT_EQ(sanitizer.push("\xF0\x9F"), "");
    EXPECT_EQ(sanitizer.pending(), 2u);
    EXPECT_EQ(sanitizer.finish(), kFffd);
    EXPECT_EQ(sanitizer.pending(), 0u);
    // After finish() the sanitizer starts clean.
    EXPECT_EQ(sanitizer.push("\xC3\xA9"), "\xC3\xA9");
    EXPECT_EQ(sanitizer.finish(), "");
}

TEST(Utf8, StreamingEqualsOneShotOnArbitraryBytes) {
    // Random bytes biased towards the interesting ones (leads, continuations, ASCII), cut at
    // random places: the stream's output is the one-shot output, always valid, and valid input
    // is exactly the input that comes back unchanged.
    const std::string alphabet = "a\x7f\x80\x9f\xa0\xbf\xc0\xc2\xdf\xe0\xed\xef\xf0\xf4\xf5\xff";
    std::uint64_t state = 42;
    const auto next = [&state](std::uint64_t bound) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return (state >> 33) % bound;
    };
    int valid_inputs = 0;
    for (int trial = 0; trial < 3000; ++trial) {
        std::string text(next(12), '\0');
        for (char& c : text)
            c = alphabet[next(alphabet.size())];
        std::vector<std::size_t> cuts;
        for (std::size_t at = next(4); at < text.size(); at += 1 + next(4))
            cuts.push_back(at);
        const std::string whole = sanitize_utf8(text);
        ASSERT_TRUE(is_valid_utf8(whole)) << trial;
        ASSERT_EQ(pushed_in_pieces(text, cuts), whole) << trial;
        ASSERT_EQ(whole == text, is_valid_utf8(text)) << trial;
        valid_inputs += is_valid_utf8(text) ? 1 : 0;
    }
    // Both kinds of input occurred (the test is not vacuous).
    EXPECT_GT(valid_inputs, 10);
    EXPECT_LT(valid_inputs, 2990);
}

}  // namespace
}  // namespace gpt2
