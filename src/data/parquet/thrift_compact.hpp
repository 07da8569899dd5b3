// The Thrift compact protocol, read only: the encoding of Parquet's footer and page headers.
// Every length and count is checked against the bytes present and nesting is limited, so that
// corrupt or hostile bytes end in an InputError, never in a crash or a huge allocation.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "core/error.hpp"

namespace gpt2::thrift {

// The compact protocol's type ids (field headers and container element types).
enum class Type : std::uint8_t {
    Stop = 0,
    True = 1,  // a bool field's value is its type; in containers both mean "a bool"
    False = 2,
    Byte = 3,
    I16 = 4,
    I32 = 5,
    I64 = 6,
    Double = 7,
    Binary = 8,
    List = 9,
    Set = 10,
    Map = 11,
    Struct = 12,
};

// The bytes ran out before the value did: the caller may retry with more bytes (a page header
// read through a window of the file), or report the data as cut short.
class OutOfBytes : public InputError {
  public:
    using InputError::InputError;
};

class CompactReader {
  public:
    // `context` starts every error message ("FILE: footer").
    CompactReader(std::span<const std::uint8_t> bytes, std::string context)
        : bytes_(bytes), context_(std::move(context)) {}

    // Reads a struct's fields up to its stop byte: on_field(id, type) reads the value with the
    // methods below and returns true, or returns false to have it skipped.
    template <typename OnField>
    void read_struct(OnField&& on_field) {
        const DepthGuard guard(*this);
        std::int16_t last_id = 0;
        for (;;) {
            const std::uint8_t header = byte();
            if (header == 0) return;
            const auto type = static_cast<Type>(header & 0x0F);
            if (type == Type::Stop || static_cast<std::uint8_t>(type) > 12)
                fail("unknown field type " + std::to_string(header & 0x0F));
            const int delta = header >> 4;
            last_id = delta != 0 ? static_cast<std::int16_t>(last_id + delta) : short_id();
            if (!on_field(last_id, type)) skip(type);
        }
    }

    [[nodiscard]] bool boolean(Type type, std::string_view field);  // a bool field
    [[nodiscard]] std::int32_t i32(Type type, std::string_view field);
    [[nodiscard]] std::int64_t i64(Type type, std::string_view field);
    [[nodiscard]] std::string_view binary(Type type, std::string_view field);
    // A list's element type and size (at most the bytes left: every element takes one or more).
    [[nodiscard]] std::pair<Type, std::size_t> list(Type type, std::string_view field);
    // A struct-typed field: checks the type, then reads it as read_struct does.
    template <typename OnField>
    void read_struct(Type type, std::string_view field, OnField&& on_field) {
        expect(type, Type::Struct, field);
        read_struct(std::forward<OnField>(on_field));
    }
    // Skips a value of this type (a field's, or an element's when in_container).
    void skip(Type type, bool in_container = false);

    [[nodiscard]] std::size_t offset() const { return pos_; }
    [[noreturn]] void fail(const std::string& what) const;

  private:
    // Structs nest (a field of a field ...) only a few levels in Parquet; deeper is corrupt data,
    // refused before it can exhaust the stack.
    static constexpr int kMaxDepth = 32;
    struct DepthGuard {
        explicit DepthGuard(CompactReader& r) : reader(r) {
            if (++reader.depth_ > kMaxDepth) reader.fail("structures nested too deeply");
        }
        ~DepthGuard() { --reader.depth_; }
        DepthGuard(const DepthGuard&) = delete;
        DepthGuard& operator=(const DepthGuard&) = delete;
        CompactReader& reader;
    };

    std::uint8_t byte();
    std::uint64_t varint();
    std::int16_t short_id();
    void expect(Type type, Type wanted, std::string_view field) const;

    std::span<const std::uint8_t> bytes_;
    std::size_t pos_ = 0;
    int depth_ = 0;
    std::string context_;
};

}  // namespace gpt2::thrift
