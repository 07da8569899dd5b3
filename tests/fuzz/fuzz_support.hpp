// Shared by the fuzz targets: scratch files, crashing property checks, a tokenizer workout.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "../scratch_files.hpp"
#include "core/error.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2::fuzz {

// Inputs above this are rejected early (kept out of the corpus): the formats' real sizes that
// matter for parsing are far below, and large inputs only slow the fuzzer down.
inline constexpr std::size_t kMaxInputBytes = std::size_t{1} << 20;

// A property the library promises was broken: report it and abort, which libFuzzer saves as a
// crash.
[[noreturn]] inline void property_failed(const char* what, const char* file, int line) {
    std::fprintf(stderr, "\n*** fuzz property failed at %s:%d: %s\n", file, line, what);
    std::abort();
}
#define FUZZ_CHECK(condition) \
    ((condition) ? (void)0 : ::gpt2::fuzz::property_failed(#condition, __FILE__, __LINE__))

// A normal rejection. With GPT2_FUZZ_VERBOSE=1 in the environment its message is printed, to see
// why a seed or a replayed input was refused.
inline void rejected(const std::exception& error) {
    static const bool verbose = std::getenv("GPT2_FUZZ_VERBOSE") != nullptr;
    if (verbose) std::fprintf(stderr, "rejected: %s\n", error.what());
}

// A directory of this process's own under $TMPDIR (or /tmp), removed at normal exit.
[[nodiscard]] inline const std::filesystem::path& scratch_dir() {
    static const test::ScratchDir dir("gpt2_fuzz");
    return dir.path();
}

// Replaces a scratch file with exactly the given bytes (throws if it cannot: the harness failing,
// which the fuzzer reports as a crash, not the library).
using test::write_bytes;

[[nodiscard]] inline std::span<const std::uint8_t> as_bytes(std::string_view text) {
    return {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()};
}

// Uses a tokenizer the way training and generation do and checks what tokenizer.hpp promises:
// ids in range, decode(encode(text)) == text (bpe and gpt2 accept any bytes; char may refuse a
// byte with InputError), out-of-range ids refused with InputError, and serialize() reloadable.
// `sample` is extra text to encode (part of the fuzz input).
inline void exercise_tokenizer(const Tokenizer& tokenizer, std::string_view sample) {
    constexpr std::string_view kEndOfText = "<|endoftext|>";
    const int vocab = tokenizer.vocab_size();
    FUZZ_CHECK(vocab > 0);
    const std::optional<int> eot = tokenizer.eot_id();
    FUZZ_CHECK(!eot || (*eot >= 0 && *eot < vocab));
    FUZZ_CHECK(tokenizer.kind() == TokenizerKind::Char || eot.has_value());
    const bool eot_round_trips = eot && tokenizer.token_bytes(*eot) == kEndOfText;

    const std::string texts[] = {
        "hello world",
        "  First Citizen:\nWe're 42 d\xC3\xA9j\xC3\xA0 vu's\t\t!!\n\n",
        "a<|endoftext|>b<|endoftext|>",
        "\xFF\xFE\x80 x \xE2\x82",
        std::string(sample.substr(0, 256)),
    };
    for (const std::string& text : texts) {
        std::vector<std::int32_t> ids;
        if (tokenizer.kind() == TokenizerKind::Char) {
            try {
                ids = tokenizer.encode(text);
            } catch (const InputError&) {
                continue;  // a byte outside the alphabet
            }
        } else {
            ids = tokenizer.encode(text);  // must accept any bytes
        }
        for (const std::int32_t id : ids)
            FUZZ_CHECK(id >= 0 && id < vocab);
        const std::string decoded = tokenizer.decode(ids);
        if (eot_round_trips || text.find(kEndOfText) == std::string::npos) {
            FUZZ_CHECK(decoded == text);
        }
    }

    for (const std::int32_t bad : {-1, vocab}) {
        bool refused = false;
        try {
            (void)tokenizer.decode(std::span(&bad, 1));
        } catch (const InputError&) {
            refused = true;
        }
        FUZZ_CHECK(refused);
    }
    const int shown = std::min(vocab, 300);
    for (int id = 0; id < shown; ++id)
        FUZZ_CHECK(!tokenizer.token_bytes(id).empty());
    FUZZ_CHECK(!tokenizer.token_bytes(vocab - 1).empty());

    const std::vector<std::uint8_t> serialized = tokenizer.serialize();
    const std::unique_ptr<Tokenizer> again = deserialize_tokenizer(serialized);
    FUZZ_CHECK(again->kind() == tokenizer.kind() && again->vocab_size() == vocab);
    FUZZ_CHECK(again->serialize() == serialized);
}

}  // namespace gpt2::fuzz
