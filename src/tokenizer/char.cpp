// The char tokenizer: one token per distinct byte of the training corpus, in byte order.
#include <array>
#include <cstdio>

#include "core/error.hpp"
#include "tokenizer/kinds.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {
namespace {

[[nodiscard]] std::string byte_name(unsigned char byte) {
    std::array<char, 32> text{};
    if (byte >= 0x20 && byte < 0x7F) {
        std::snprintf(text.data(), text.size(), "%u (0x%02X '%c')", byte, byte, byte);
    } else {
        std::snprintf(text.data(), text.size(), "%u (0x%02X)", byte, byte);
    }
    return text.data();
}

class CharTokenizer final : public Tokenizer {
  public:
    // alphabet must be strictly increasing and non-empty (checked by the callers).
    explicit CharTokenizer(std::string alphabet) : alphabet_(std::move(alphabet)) {
        ids_.fill(-1);
        for (std::size_t i = 0; i < alphabet_.size(); ++i) {
            ids_[static_cast<unsigned char>(alphabet_[i])] = static_cast<std::int32_t>(i);
        }
    }

    [[nodiscard]] TokenizerKind kind() const override { return TokenizerKind::Char; }
    [[nodiscard]] int vocab_size() const override { return static_cast<int>(alphabet_.size()); }
    [[nodiscard]] std::optional<int> eot_id() const override { return std::nullopt; }

    // No end-of-text token: every byte is ordinary text whatever `eot` says.
    [[nodiscard]] std::vector<std::int32_t> encode(std::string_view text,
                                                   EotInText /*eot*/) const override {
        std::vector<std::int32_t> ids;
        ids.reserve(text.size());
        for (std::size_t i = 0; i < text.size(); ++i) {
            const auto byte = static_cast<unsigned char>(text[i]);
            const std::int32_t id = ids_[byte];
            if (id < 0) {
                throw InputError("char tokenizer: byte " + byte_name(byte) + " at offset " +
                                 std::to_string(i) + " is not in its " +
                                 std::to_string(alphabet_.size()) + "-symbol vocabulary");
            }
            ids.push_back(id);
        }
        return ids;
    }

    [[nodiscard]] std::string decode(std::span<const std::int32_t> ids) const override {
        std::string text;
        text.reserve(ids.size());
        for (const std::int32_t id : ids)
            text += alphabet_[index(id)];
        return text;
    }

    [[nodiscard]] std::string token_bytes(int id) const override {
        return std::string(1, alphabet_[index(id)]);
    }

    [[nodiscard]] std::vector<std::uint8_t> serialize() const override {
        detail::ByteWriter out;
        out.u8(static_cast<std::uint8_t>(TokenizerKind::Char));
        out.u8(detail::kSerialFormatVersion);
        out.u32(static_cast<std::uint32_t>(alphabet_.size()));
        out.raw(alphabet_);
        return out.take();
    }

  private:
    [[nodiscard]] std::size_t index(std::int32_t id) const {
        if (id < 0 || static_cast<std::size_t>(id) >= alphabet_.size()) {
            throw InputError("char tokenizer: " + detail::describe_id(id, vocab_size()));
        }
        return static_cast<std::size_t>(id);
    }

    std::string alphabet_;
    std::array<std::int32_t, 256> ids_{};
};

}  // namespace

std::unique_ptr<Tokenizer> make_char_tokenizer(std::string_view corpus) {
    std::array<bool, 256> seen{};
    for (const char c : corpus)
        seen[static_cast<unsigned char>(c)] = true;
    std::string alphabet;
    for (int byte = 0; byte < 256; ++byte) {
        if (seen[byte]) alphabet += static_cast<char>(byte);
    }
    if (alphabet.empty()) throw InputError("char tokenizer: the training corpus is empty");
    return std::make_unique<CharTokenizer>(std::move(alphabet));
}

namespace detail {

std::unique_ptr<Tokenizer> make_char_from_alphabet(std::string alphabet, const std::string& where) {
    if (alphabet.empty()) throw InputError(where + ": a char tokenizer needs at least one byte");
    for (std::size_t i = 1; i < alphabet.size(); ++i) {
        if (static_cast<unsigned char>(alphabet[i - 1]) >=
            static_cast<unsigned char>(alphabet[i])) {
            throw InputError(where + ": a char tokenizer's bytes must be in increasing order; " +
                             byte_name(static_cast<unsigned char>(alphabet[i])) + " at index " +
                             std::to_string(i) + " is not");
        }
    }
    return std::make_unique<CharTokenizer>(std::move(alphabet));
}

std::unique_ptr<Tokenizer> deserialize_char(ByteReader& reader) {
    const std::uint32_t size = reader.count("char alphabet size", 1);
    if (size == 0 || size > 256) {
        reader.fail("char alphabet size " + std::to_string(size) + " is not in 1..256");
    }
    const std::string_view alphabet = reader.raw(size, "char alphabet");
    for (std::size_t i = 1; i < alphabet.size(); ++i) {
        if (static_cast<unsigned char>(alphabet[i - 1]) >=
            static_cast<unsigned char>(alphabet[i])) {
            reader.fail("char alphabet is not strictly increasing at index " + std::to_string(i));
        }
    }
    return std::make_unique<CharTokenizer>(std::string(alphabet));
}

}  // namespace detail
}  // namespace gpt2
