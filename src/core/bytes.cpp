#include "core/bytes.hpp"

#include "core/error.hpp"

namespace gpt2 {

std::span<const std::uint8_t> ByteReader::take(std::size_t size, std::string_view field) {
    if (size > bytes_.size() - pos_) {
        fail("truncated: " + std::string(field) + " needs " + std::to_string(size) +
             " bytes at offset " + std::to_string(pos_) + " but only " +
             std::to_string(bytes_.size() - pos_) + " remain");
    }
    const auto out = bytes_.subspan(pos_, size);
    pos_ += size;
    return out;
}

std::string_view ByteReader::raw(std::size_t size, std::string_view field) {
    const auto bytes = take(size, field);
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

std::uint32_t ByteReader::count(std::string_view field, std::size_t min_item_bytes) {
    const std::uint32_t n = u32(field);
    if (min_item_bytes > 0 && n > remaining() / min_item_bytes) {
        fail(std::string(field) + " " + std::to_string(n) + " is more than the remaining " +
             std::to_string(remaining()) + " bytes can hold");
    }
    return n;
}

void ByteReader::expect_end() const {
    if (pos_ != bytes_.size()) {
        fail(std::to_string(bytes_.size() - pos_) + " unexpected trailing bytes at offset " +
             std::to_string(pos_));
    }
}

void ByteReader::fail(std::string_view what) const {
    throw InputError(context_ + ": " + std::string(what));
}

}  // namespace gpt2
