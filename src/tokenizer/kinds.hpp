// The tokenizer kinds behind tokenizer.hpp: their constructors, which deserialize_tokenizer() and
// the loaders dispatch to, and what they share (the serial format's version, the end-of-text
// text; bytes are read and written with core/bytes.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/bytes.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2::detail {

// Text that bpe and gpt2 always encode as the EOT token rather than as its 13 bytes.
inline constexpr std::string_view kEndOfText = "<|endoftext|>";
// Version 2 (a gpt2 tokenizer splitting digits first) adds the pre-tokenizer after the merges; the
// others keep writing version 1, which earlier builds read.
inline constexpr std::uint8_t kSerialFormatVersion = 1;
inline constexpr std::uint8_t kSerialFormatVersionPre = 2;

using gpt2::ByteReader;
using gpt2::ByteWriter;

[[nodiscard]] std::string describe_id(long long id, int vocab_size);

// Validating constructors (throw InputError). Merge r joins tokens left and right into one token;
// for TokenizerKind::Bpe the vocabulary is implied (bytes 0..255, then merge r is id 256 + r, then
// EOT), for Gpt2 it is given explicitly and each merge's result is looked up by its bytes.
[[nodiscard]] std::unique_ptr<Tokenizer> make_trained_bpe(
    std::vector<std::pair<std::int32_t, std::int32_t>> merges);
[[nodiscard]] std::unique_ptr<Tokenizer> make_gpt2_style_bpe(
    std::vector<std::string> vocab, std::vector<std::pair<std::int32_t, std::int32_t>> merges,
    int eot_id, PreTokenizer pre = PreTokenizer::Gpt2);

// A char tokenizer of these bytes: `alphabet` must be strictly increasing and non-empty
// (InputError naming `where` otherwise).
[[nodiscard]] std::unique_ptr<Tokenizer> make_char_from_alphabet(std::string alphabet,
                                                                 const std::string& where);

[[nodiscard]] std::unique_ptr<Tokenizer> deserialize_char(ByteReader& reader);
// `version`: the serial format's (2: the pre-tokenizer follows the merges).
[[nodiscard]] std::unique_ptr<Tokenizer> deserialize_bpe(ByteReader& reader, TokenizerKind kind,
                                                         std::uint8_t version);

}  // namespace gpt2::detail
