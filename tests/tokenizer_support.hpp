// What the tokenizer tests share: the test data, helpers that read and write files, random
// bytes, round-trip and equality checks, and a naive BPE to compare encodings with.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "scratch_files.hpp"
#include "tokenizer/tokenizer.hpp"

namespace fs = std::filesystem;
using gpt2::InputError;
using gpt2::Tokenizer;
using gpt2::TokenizerKind;

namespace tokenizer_test {

using gpt2::read_text_file;
using gpt2::test::ScratchDir;
using gpt2::test::write_bytes;

inline const fs::path kTestData = GPT2_TEST_DATA_DIR;
inline const fs::path kSharedData = GPT2_SHARED_DATA_DIR;
inline const fs::path kShakespeare = kSharedData / "tinyshakespeare.txt";
inline const fs::path kGpt2Dir = kSharedData / "gpt2";

inline std::vector<std::int32_t> read_u16_ids(const fs::path& path) {
    const std::string bytes = read_text_file(path);
    std::vector<std::int32_t> ids(bytes.size() / 2);
    for (std::size_t i = 0; i < ids.size(); ++i) {
        ids[i] = static_cast<unsigned char>(bytes[2 * i]) |
                 (static_cast<unsigned char>(bytes[2 * i + 1]) << 8);
    }
    return ids;
}

#define SKIP_WITHOUT(path)                                                                    \
    if (!fs::exists(path))                                                                    \
    GTEST_SKIP() << (path).string()                                                           \
                 << " is missing (tinyshakespeare.txt, or run scripts/get_gpt2_tokenizer.sh " \
                    "for GPT-2's files)"

// The GPT-2 tokenizer is loaded once for the whole program: loading takes ~0.1 s.
inline const Tokenizer& gpt2_tokenizer() {
    static const std::unique_ptr<Tokenizer> tokenizer = gpt2::load_gpt2_tokenizer(kGpt2Dir);
    return *tokenizer;
}

inline const std::string& shakespeare() {
    static const std::string text = read_text_file(kShakespeare);
    return text;
}

// A corpus that does not need the shared data files.
inline std::string small_corpus() {
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
inline std::string random_bytes(std::mt19937& rng, std::size_t max_pieces) {
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

inline void expect_round_trips(const Tokenizer& tokenizer, std::uint32_t seed, int cases) {
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

inline void expect_same_tokenizer(const Tokenizer& a, const Tokenizer& b, std::string_view sample) {
    EXPECT_EQ(a.kind(), b.kind());
    EXPECT_EQ(a.vocab_size(), b.vocab_size());
    EXPECT_EQ(a.eot_id(), b.eot_id());
    for (int id = 0; id < a.vocab_size(); ++id)
        ASSERT_EQ(a.token_bytes(id), b.token_bytes(id));
    EXPECT_EQ(a.encode(sample), b.encode(sample));
    EXPECT_EQ(a.serialize(), b.serialize());
}

template <typename F>
inline std::string error_message(F&& f) {
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
inline std::vector<std::int32_t> naive_bpe(const Tokenizer& tokenizer, std::string_view piece) {
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

}  // namespace tokenizer_test

using namespace tokenizer_test;  // NOLINT: the tests' own helpers
