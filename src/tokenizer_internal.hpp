// Internals shared by the tokenizer sources: portable little-endian (de)serialization helpers and
// the per-kind constructors that deserialize_tokenizer() and the loaders dispatch to.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpt2/tokenizer.hpp"

namespace gpt2::detail {

// Text that bpe and gpt2 always encode as the EOT token rather than as its 13 bytes.
inline constexpr std::string_view kEndOfText = "<|endoftext|>";
inline constexpr std::uint8_t kSerialFormatVersion = 1;

class ByteWriter {
  public:
    void u8(std::uint8_t value) { bytes_.push_back(value); }
    void u32(std::uint32_t value) {
        for (int shift = 0; shift < 32; shift += 8)
            bytes_.push_back((value >> shift) & 0xFF);
    }
    void raw(std::string_view data) { bytes_.insert(bytes_.end(), data.begin(), data.end()); }
    [[nodiscard]] std::vector<std::uint8_t> take() { return std::move(bytes_); }

  private:
    std::vector<std::uint8_t> bytes_;
};

// Bounds-checked reader: every failure is an InputError naming what was being read.
class ByteReader {
  public:
    ByteReader(std::span<const std::uint8_t> bytes, std::string context)
        : bytes_(bytes), context_(std::move(context)) {}
    [[nodiscard]] std::uint8_t u8(std::string_view field);
    [[nodiscard]] std::uint32_t u32(std::string_view field);
    [[nodiscard]] std::string_view raw(std::size_t size, std::string_view field);
    // A count of items that each need at least min_item_bytes more bytes: rejects huge counts
    // from corrupt data before anything is allocated for them.
    [[nodiscard]] std::uint32_t count(std::string_view field, std::size_t min_item_bytes);
    void expect_end() const;
    [[noreturn]] void fail(std::string_view what) const;

  private:
    void need(std::size_t size, std::string_view field) const;

    std::span<const std::uint8_t> bytes_;
    std::size_t pos_ = 0;
    std::string context_;
};

[[nodiscard]] std::string describe_id(long long id, int vocab_size);

// Validating constructors (throw InputError). Merge r joins tokens left and right into one token;
// for TokenizerKind::Bpe the vocabulary is implied (bytes 0..255, then merge r is id 256 + r, then
// EOT), for Gpt2 it is given explicitly and each merge's result is looked up by its bytes.
[[nodiscard]] std::unique_ptr<Tokenizer> make_trained_bpe(
    std::vector<std::pair<std::int32_t, std::int32_t>> merges);
[[nodiscard]] std::unique_ptr<Tokenizer> make_gpt2_style_bpe(
    std::vector<std::string> vocab, std::vector<std::pair<std::int32_t, std::int32_t>> merges,
    int eot_id);

[[nodiscard]] std::unique_ptr<Tokenizer> deserialize_char(ByteReader& reader);
[[nodiscard]] std::unique_ptr<Tokenizer> deserialize_bpe(ByteReader& reader, TokenizerKind kind);

}  // namespace gpt2::detail
