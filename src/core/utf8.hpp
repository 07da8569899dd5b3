// UTF-8 hygiene for text the programs print: generated token bytes may split a character across
// tokens or be invalid outright, and nothing downstream (terminal, pipe, JSON) should see that.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace gpt2 {

// U+FFFD REPLACEMENT CHARACTER, what every ill-formed piece of input becomes.
inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";

// Turns a stream of bytes, pushed in pieces of any size, into valid UTF-8. Complete well-formed
// sequences pass through unchanged; an incomplete sequence at the end of a piece is held back
// until a later piece completes (or breaks) it; each maximal ill-formed subpart (a stray byte, an
// overlong or surrogate encoding, a sequence cut short) becomes one U+FFFD, as Unicode recommends
// and as WHATWG and Python decoders do. Pushing a text in pieces gives exactly the output of
// sanitize_utf8() on the whole, wherever the cuts fall.
class Utf8Sanitizer {
  public:
    // The valid text that `bytes` completes (possibly empty while a character is incomplete).
    [[nodiscard]] std::string push(std::string_view bytes);
    // Ends the stream: a held incomplete sequence becomes U+FFFD. The sanitizer can be reused.
    [[nodiscard]] std::string finish();
    // Bytes held back waiting for the rest of their character (0 to 3).
    [[nodiscard]] std::size_t pending() const { return pending_size_; }

  private:
    std::array<char, 3> pending_{};
    std::uint8_t pending_size_ = 0;
    std::uint8_t needed_ = 0;  // total length of the sequence pending_ begins
};

// The whole of `bytes` as valid UTF-8 (same rules as Utf8Sanitizer; a cut-off end becomes U+FFFD).
[[nodiscard]] std::string sanitize_utf8(std::string_view bytes);

// Whether `bytes` is well-formed UTF-8 (no overlongs, surrogates, or code points above U+10FFFF).
[[nodiscard]] bool is_valid_utf8(std::string_view bytes);

}  // namespace gpt2
