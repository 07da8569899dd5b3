// Byte serialisation, the one way every binary format is written and read (checkpoint trailers,
// resume state, tokenizers, sample messages): fields one at a time in little-endian order, never
// raw structs (no padding byte reaches a file), and a reader that names the file and field when
// the bytes run out.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace gpt2 {

// Fields are copied in the machine's order, which the formats define as little-endian.
static_assert(std::endian::native == std::endian::little, "the binary formats are little-endian");

class ByteWriter {
  public:
    template <typename T>
    void put(const T& value) {
        static_assert(std::is_arithmetic_v<T>, "write fields one by one");
        // resize + memcpy rather than insert: GCC 12 at -O3 with -march=sapphirerapids warns
        // (-Wstringop-overflow, a known false positive) on a small insert into an empty vector.
        const std::size_t at = bytes_.size();
        bytes_.resize(at + sizeof(T));
        std::memcpy(bytes_.data() + at, &value, sizeof(T));
    }
    template <typename T, std::size_t N>
    void put_array(const std::array<T, N>& values) {
        for (const T& v : values)
            put(v);
    }
    void u8(std::uint8_t value) { put(value); }
    void u32(std::uint32_t value) { put(value); }
    void raw(std::string_view data) { bytes_.insert(bytes_.end(), data.begin(), data.end()); }
    void raw(std::span<const std::uint8_t> data) {
        bytes_.insert(bytes_.end(), data.begin(), data.end());
    }
    [[nodiscard]] const std::vector<std::uint8_t>& bytes() const { return bytes_; }
    [[nodiscard]] std::vector<std::uint8_t> take() { return std::move(bytes_); }

  private:
    std::vector<std::uint8_t> bytes_;
};

// Bounds-checked reader: every failure is an InputError "<context>: <what>" naming the field.
class ByteReader {
  public:
    ByteReader(std::span<const std::uint8_t> bytes, std::string context)
        : bytes_(bytes), context_(std::move(context)) {}

    template <typename T>
    [[nodiscard]] T get(std::string_view field) {
        static_assert(std::is_arithmetic_v<T>, "read fields one by one");
        T value;
        std::memcpy(&value, take(sizeof(T), field).data(), sizeof(T));
        return value;
    }
    template <typename T, std::size_t N>
    [[nodiscard]] std::array<T, N> get_array(std::string_view field) {
        std::array<T, N> values{};
        for (T& v : values)
            v = get<T>(field);
        return values;
    }
    [[nodiscard]] std::uint8_t u8(std::string_view field) { return get<std::uint8_t>(field); }
    [[nodiscard]] std::uint32_t u32(std::string_view field) { return get<std::uint32_t>(field); }
    [[nodiscard]] std::span<const std::uint8_t> take(std::size_t size, std::string_view field);
    [[nodiscard]] std::string_view raw(std::size_t size, std::string_view field);
    void skip(std::size_t size, std::string_view field) { (void)take(size, field); }
    // A count of items that each need at least min_item_bytes more bytes: rejects huge counts
    // from corrupt data before anything is allocated for them.
    [[nodiscard]] std::uint32_t count(std::string_view field, std::size_t min_item_bytes);
    void expect_end() const;
    [[noreturn]] void fail(std::string_view what) const;
    [[nodiscard]] std::size_t offset() const { return pos_; }
    [[nodiscard]] std::size_t remaining() const { return bytes_.size() - pos_; }

  private:
    std::span<const std::uint8_t> bytes_;
    std::size_t pos_ = 0;
    std::string context_;
};

}  // namespace gpt2
