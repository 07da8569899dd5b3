// What the BPE encoder (bpe.cpp) and its trainer (bpe_training.cpp) share: GPT-2's pre-tokenizer
// (PCRE2), the end-of-text split, and the keys of a merge's pair.
#pragma once

// 8-bit code units: every file of the tokenizer that names PCRE2 includes it through here.
#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "tokenizer/kinds.hpp"

namespace gpt2::detail {

using Merge = std::pair<std::int32_t, std::int32_t>;

// GPT-2's pre-tokenization pattern, as in its encoder.py.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// One numeric character: tokenizer.json's Digits(individual_digits) (Rust's char::is_numeric is
// the Unicode categories Nd, Nl and No, which \p{N} is).
inline constexpr std::string_view kDigitPattern = R"(\p{N})";

inline constexpr int kNumBytes = 256;
inline constexpr int kMaxTrainedVocab = 1 << 20;

[[nodiscard]] constexpr std::uint64_t pair_key(std::int32_t left, std::int32_t right) {
    return (std::uint64_t{static_cast<std::uint32_t>(left)} << 32) |
           static_cast<std::uint32_t>(right);
}

struct TransparentHash {
    using is_transparent = void;
    [[nodiscard]] std::size_t operator()(std::string_view s) const {
        return std::hash<std::string_view>{}(s);
    }
};

// Splits text into GPT-2 pre-tokens (or the pieces another pattern matches).
// PCRE2_MATCH_INVALID_UTF makes invalid UTF-8 legal input that no pattern item matches; the bytes
// between two matches (always invalid UTF-8 for GPT-2's pattern) become a pre-token of their own,
// so every input byte lands in exactly one piece and encoding round-trips.
class Pretokenizer {
  public:
    explicit Pretokenizer(std::string_view pattern = kGpt2Pattern) {
        int error = 0;
        PCRE2_SIZE offset = 0;
        code_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                  PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset,
                                  nullptr));
        if (!code_) {
            std::array<PCRE2_UCHAR, 256> message{};
            pcre2_get_error_message(error, message.data(), message.size());
            throw std::runtime_error("PCRE2 cannot compile the pre-tokenizer's pattern: " +
                                     std::string(reinterpret_cast<const char*>(message.data())));
        }
        // Without JIT (unsupported platform) pcre2_match falls back to the interpreter.
        (void)pcre2_jit_compile(code_.get(), PCRE2_JIT_COMPLETE);
    }

    template <typename OnPiece>
    void split(std::string_view text, OnPiece&& on_piece) const {
        scan(text, [&](std::string_view piece, bool) { on_piece(piece); });
    }

    // split's pieces with whether the pattern matched each (else it lies between matches).
    template <typename OnPiece>
    void scan(std::string_view text, OnPiece&& on_piece) const {
        const std::unique_ptr<pcre2_match_data, MatchDataDeleter> match(
            pcre2_match_data_create_from_pattern(code_.get(), nullptr));
        if (!match) throw std::bad_alloc();
        const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
        std::size_t pos = 0;
        while (pos < text.size()) {
            int rc = pcre2_match(code_.get(), subject, text.size(), pos, 0, match.get(), nullptr);
            if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
                rc = pcre2_match(code_.get(), subject, text.size(), pos, PCRE2_NO_JIT, match.get(),
                                 nullptr);
            }
            if (rc == PCRE2_ERROR_NOMATCH) {
                on_piece(text.substr(pos), false);
                return;
            }
            if (rc < 0) {
                throw std::runtime_error("PCRE2 match failed with error " + std::to_string(rc));
            }
            const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
            const std::size_t start = ovector[0];
            const std::size_t end = ovector[1];
            if (end <= start) throw std::logic_error("the pattern matched an empty string");
            if (start > pos) on_piece(text.substr(pos, start - pos), false);
            on_piece(text.substr(start, end - start), true);
            pos = end;
        }
    }

  private:
    struct CodeDeleter {
        void operator()(pcre2_code* code) const { pcre2_code_free(code); }
    };
    struct MatchDataDeleter {
        void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
    };
    std::unique_ptr<pcre2_code, CodeDeleter> code_;
};

// Calls on_text for the ordinary text between occurrences of <|endoftext|> and on_eot for each.
template <typename OnText, typename OnEot>
void split_end_of_text(std::string_view text, OnText&& on_text, OnEot&& on_eot) {
    std::size_t pos = 0;
    for (std::size_t found; (found = text.find(kEndOfText, pos)) != std::string_view::npos;
         pos = found + kEndOfText.size()) {
        if (found > pos) on_text(text.substr(pos, found - pos));
        on_eot();
    }
    if (pos < text.size()) on_text(text.substr(pos));
}

}  // namespace gpt2::detail
