// Byte serialisation for the binary formats: values are written one field at a time in the
// machine's (little-endian) byte order, never as raw structs, so no padding byte reaches a file,
// and a reader that runs out of bytes says which file is truncated.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "gpt2/error.hpp"

namespace gpt2 {

class ByteWriter {
  public:
    template <typename T>
    void put(const T& value) {
        static_assert(std::is_arithmetic_v<T>, "write fields one by one");
        const auto* p = reinterpret_cast<const std::uint8_t*>(&value);
        bytes_.insert(bytes_.end(), p, p + sizeof(T));
    }
    template <typename T, std::size_t N>
    void put_array(const std::array<T, N>& values) {
        for (const T& v : values)
            put(v);
    }
    void put_bytes(std::span<const std::uint8_t> bytes) {
        bytes_.insert(bytes_.end(), bytes.begin(), bytes.end());
    }
    [[nodiscard]] const std::vector<std::uint8_t>& bytes() const { return bytes_; }
    [[nodiscard]] std::vector<std::uint8_t> take() { return std::move(bytes_); }

  private:
    std::vector<std::uint8_t> bytes_;
};

// Reads fields in order; InputError "<what>: truncated" when the bytes run out.
class ByteReader {
  public:
    ByteReader(std::span<const std::uint8_t> bytes, std::string what)
        : bytes_(bytes), what_(std::move(what)) {}

    template <typename T>
    [[nodiscard]] T get() {
        static_assert(std::is_arithmetic_v<T>, "read fields one by one");
        T value;
        std::memcpy(&value, take(sizeof(T)).data(), sizeof(T));
        return value;
    }
    template <typename T, std::size_t N>
    [[nodiscard]] std::array<T, N> get_array() {
        std::array<T, N> values{};
        for (T& v : values)
            v = get<T>();
        return values;
    }
    [[nodiscard]] std::span<const std::uint8_t> take(std::size_t count) {
        if (count > bytes_.size() - offset_) throw InputError(what_ + ": truncated");
        const auto out = bytes_.subspan(offset_, count);
        offset_ += count;
        return out;
    }
    void skip(std::size_t count) { (void)take(count); }
    [[nodiscard]] std::size_t offset() const { return offset_; }
    [[nodiscard]] std::size_t remaining() const { return bytes_.size() - offset_; }

  private:
    std::span<const std::uint8_t> bytes_;
    std::size_t offset_ = 0;
    std::string what_;
};

}  // namespace gpt2
