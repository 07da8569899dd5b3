#include "data/parquet/thrift_compact.hpp"

#include <cstring>

namespace gpt2::thrift {

namespace {

const char* type_name(Type type) {
    switch (type) {
        case Type::Stop:
            return "stop";
        case Type::True:
        case Type::False:
            return "bool";
        case Type::Byte:
            return "byte";
        case Type::I16:
            return "i16";
        case Type::I32:
            return "i32";
        case Type::I64:
            return "i64";
        case Type::Double:
            return "double";
        case Type::Binary:
            return "binary";
        case Type::List:
            return "list";
        case Type::Set:
            return "set";
        case Type::Map:
            return "map";
        case Type::Struct:
            return "struct";
    }
    return "unknown";
}

std::int64_t unzigzag(std::uint64_t n) {
    return static_cast<std::int64_t>(n >> 1) ^ -static_cast<std::int64_t>(n & 1);
}

}  // namespace

void CompactReader::fail(const std::string& what) const {
    throw InputError(context_ + ": " + what + " (at byte " + std::to_string(pos_) + ")");
}

std::uint8_t CompactReader::byte() {
    if (pos_ >= bytes_.size()) throw OutOfBytes(context_ + ": cut short");
    return bytes_[pos_++];
}

std::uint64_t CompactReader::varint() {
    std::uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        const std::uint8_t b = byte();
        value |= static_cast<std::uint64_t>(b & 0x7F) << shift;
        if ((b & 0x80) == 0) return value;
    }
    fail("a variable-length integer longer than 10 bytes");
}

std::int16_t CompactReader::short_id() {
    const std::int64_t id = unzigzag(varint());
    if (id < INT16_MIN || id > INT16_MAX) fail("field id " + std::to_string(id) + " out of range");
    return static_cast<std::int16_t>(id);
}

void CompactReader::expect(Type type, Type wanted, std::string_view field) const {
    const bool both_bool = (type == Type::True || type == Type::False) &&
                           (wanted == Type::True || wanted == Type::False);
    if (type != wanted && !both_bool) {
        fail(std::string(field) + " is a " + type_name(type) + ", not a " + type_name(wanted));
    }
}

bool CompactReader::boolean(Type type, std::string_view field) {
    expect(type, Type::True, field);
    return type == Type::True;
}

std::int32_t CompactReader::i32(Type type, std::string_view field) {
    if (type == Type::Byte) return static_cast<std::int8_t>(byte());
    if (type != Type::I16) expect(type, Type::I32, field);
    const std::int64_t value = unzigzag(varint());
    if (value < INT32_MIN || value > INT32_MAX)
        fail(std::string(field) + " " + std::to_string(value) + " does not fit 32 bits");
    return static_cast<std::int32_t>(value);
}

std::int64_t CompactReader::i64(Type type, std::string_view field) {
    if (type == Type::I16 || type == Type::I32 || type == Type::Byte) return i32(type, field);
    expect(type, Type::I64, field);
    return unzigzag(varint());
}

std::string_view CompactReader::binary(Type type, std::string_view field) {
    expect(type, Type::Binary, field);
    const std::uint64_t size = varint();
    if (size > bytes_.size() - pos_) throw OutOfBytes(context_ + ": cut short");
    const std::string_view value(reinterpret_cast<const char*>(bytes_.data() + pos_),
                                 static_cast<std::size_t>(size));
    pos_ += static_cast<std::size_t>(size);
    return value;
}

std::pair<Type, std::size_t> CompactReader::list(Type type, std::string_view field) {
    if (type != Type::Set) expect(type, Type::List, field);
    const std::uint8_t header = byte();
    const auto element = static_cast<Type>(header & 0x0F);
    if (element == Type::Stop || static_cast<std::uint8_t>(element) > 12)
        fail(std::string(field) + ": unknown element type " + std::to_string(header & 0x0F));
    std::uint64_t size = header >> 4;
    if (size == 15) size = varint();
    // Every element takes at least a byte: a larger count is corrupt, or the bytes are cut short.
    if (size > bytes_.size() - pos_) throw OutOfBytes(context_ + ": cut short");
    return {element, static_cast<std::size_t>(size)};
}

void CompactReader::skip(Type type, bool in_container) {
    switch (type) {
        case Type::True:
        case Type::False:
            if (in_container) (void)byte();  // a field's bool is in its header
            return;
        case Type::Byte:
            (void)byte();
            return;
        case Type::I16:
        case Type::I32:
        case Type::I64:
            (void)varint();
            return;
        case Type::Double:
            for (int i = 0; i < 8; ++i)
                (void)byte();
            return;
        case Type::Binary:
            (void)binary(type, "binary");
            return;
        case Type::List:
        case Type::Set: {
            const DepthGuard guard(*this);
            const auto [element, size] = list(type, "list");
            for (std::size_t i = 0; i < size; ++i)
                skip(element, true);
            return;
        }
        case Type::Map: {
            const DepthGuard guard(*this);
            const std::uint64_t size = varint();
            if (size == 0) return;
            if (size > (bytes_.size() - pos_) / 2) throw OutOfBytes(context_ + ": cut short");
            const std::uint8_t types = byte();
            const auto key = static_cast<Type>(types >> 4);
            const auto value = static_cast<Type>(types & 0x0F);
            if (key == Type::Stop || value == Type::Stop || static_cast<std::uint8_t>(key) > 12 ||
                static_cast<std::uint8_t>(value) > 12)
                fail("unknown map element type");
            for (std::uint64_t i = 0; i < size; ++i) {
                skip(key, true);
                skip(value, true);
            }
            return;
        }
        case Type::Struct:
            read_struct([](std::int16_t, Type) { return false; });
            return;
        case Type::Stop:
            break;
    }
    fail("cannot skip a value of type stop");
}

}  // namespace gpt2::thrift
