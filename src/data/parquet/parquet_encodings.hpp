// The encodings inside a Parquet data page, decoded on demand: the RLE/bit-packed hybrid (levels
// and dictionary indices), DELTA_BINARY_PACKED, and a page's strings (PLAIN, dictionary,
// DELTA_LENGTH_BYTE_ARRAY, DELTA_BYTE_ARRAY). parquet_column.cpp reads the pages they decode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace gpt2::parquet {

// `width` (0..64) bits starting at bit `bit` of data, least significant bit first, reading only
// the bytes that hold them.
[[nodiscard]] inline std::uint64_t extract_bits(const std::uint8_t* data, std::uint64_t bit,
                                                int width) {
    if (width == 0) return 0;
    const std::uint8_t* p = data + (bit >> 3);
    const int shift = static_cast<int>(bit & 7);
    std::uint64_t value = static_cast<std::uint64_t>(*p++) >> shift;
    for (int got = 8 - shift; got < width; got += 8)
        value |= static_cast<std::uint64_t>(*p++) << got;
    return width < 64 ? value & ((std::uint64_t{1} << width) - 1) : value;
}

// The bits a value of at most max_value needs (the levels' width).
[[nodiscard]] inline int bit_width(int max_value) {
    int width = 0;
    while (max_value >> width != 0)
        ++width;
    return width;
}

// A little-endian 32-bit length (PLAIN values, v1 level blocks).
[[nodiscard]] inline std::uint32_t le32(const std::uint8_t* p) {
    return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
           static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}

// The RLE / bit-packed hybrid encoding (levels and dictionary indices), decoded on demand.
class HybridDecoder {
  public:
    HybridDecoder() = default;
    HybridDecoder(std::span<const std::uint8_t> data, int width, const std::string* context)
        : data_(data), width_(width), context_(context) {}

    // The next value; false when the data holds no more.
    bool next(std::uint32_t& value) {
        while (run_left_ == 0) {
            if (!start_run()) return false;
        }
        --run_left_;
        if (rle_) {
            value = rle_value_;
        } else {
            value = static_cast<std::uint32_t>(extract_bits(packed_, packed_bit_, width_));
            packed_bit_ += static_cast<std::uint64_t>(width_);
        }
        return true;
    }

  private:
    bool start_run();
    [[noreturn]] void fail(const std::string& what) const;

    std::span<const std::uint8_t> data_;
    std::size_t pos_ = 0;
    int width_ = 0;
    const std::string* context_ = nullptr;
    std::uint64_t run_left_ = 0;
    bool rle_ = true;
    std::uint32_t rle_value_ = 0;
    const std::uint8_t* packed_ = nullptr;
    std::uint64_t packed_bit_ = 0;
};

// DELTA_BINARY_PACKED (the lengths inside both DELTA string encodings), decoded on demand as
// 32-bit integers (the lengths' type; arithmetic wraps as the writers' does).
class DeltaDecoder {
  public:
    DeltaDecoder() = default;
    DeltaDecoder(std::span<const std::uint8_t> data, const std::string* context);

    [[nodiscard]] std::uint64_t total() const { return total_; }

    bool next(std::int32_t& value) {
        if (left_ == 0) return false;
        const bool first = left_ == total_;
        --left_;
        if (!first) {
            if (in_miniblock_ == 0) next_miniblock();
            const std::uint64_t delta =
                extract_bits(data_.data() + miniblock_data_, miniblock_bit_, width_);
            miniblock_bit_ += static_cast<std::uint64_t>(width_);
            --in_miniblock_;
            last_ += min_delta_ + static_cast<std::uint32_t>(delta);
        }
        value = static_cast<std::int32_t>(last_);
        return true;
    }

    // Where the encoded values end (where what follows them starts), found without decoding.
    [[nodiscard]] std::size_t end() const;

  private:
    void next_miniblock();
    [[nodiscard]] std::uint64_t miniblock_bytes(std::uint8_t width) const;
    [[noreturn]] void fail(const std::string& what) const;

    std::span<const std::uint8_t> data_;
    const std::string* context_ = nullptr;
    std::size_t pos_ = 0;
    std::size_t header_end_ = 0;
    std::uint64_t miniblocks_ = 1, per_miniblock_ = 32, total_ = 0, left_ = 0;
    std::uint32_t last_ = 0, min_delta_ = 0;
    bool in_block_ = false;
    std::size_t widths_ = 0;
    std::uint64_t miniblock_ = 0;
    int width_ = 0;
    std::size_t miniblock_data_ = 0;
    std::uint64_t miniblock_bit_ = 0;
    std::uint64_t in_miniblock_ = 0;
};

// The values of one data page, whatever their encoding.
class ValueDecoder {
  public:
    enum class Kind { Plain, Dictionary, DeltaLength, DeltaByteArray };

    void plain(std::span<const std::uint8_t> data, const std::string* context);
    void dictionary(std::span<const std::uint8_t> data,
                    std::span<const std::string_view> dictionary, const std::string* context);
    void delta_length(std::span<const std::uint8_t> data, const std::string* context);
    void delta_byte_array(std::span<const std::uint8_t> data, const std::string* context);

    // The next value; false when the page holds no more.
    bool next(std::string_view& value) {
        switch (kind_) {
            case Kind::Plain: {
                if (pos_ == data_.size()) return false;
                if (data_.size() - pos_ < 4) fail("a PLAIN value's length cut short");
                const std::uint32_t length = le32(data_.data() + pos_);
                pos_ += 4;
                if (length > data_.size() - pos_) fail("a PLAIN value longer than its page");
                value = view(pos_, length);
                pos_ += length;
                return true;
            }
            case Kind::Dictionary: {
                std::uint32_t index = 0;
                if (!indices_.next(index)) return false;
                if (index >= dictionary_.size())
                    fail("dictionary index " + std::to_string(index) + " of a dictionary of " +
                         std::to_string(dictionary_.size()));
                value = dictionary_[index];
                return true;
            }
            case Kind::DeltaLength: {
                std::int32_t length = 0;
                if (!lengths_.next(length)) return false;
                if (length < 0 || static_cast<std::size_t>(length) > data_.size() - pos_)
                    fail("a DELTA_LENGTH_BYTE_ARRAY length of " + std::to_string(length) +
                         " with " + std::to_string(data_.size() - pos_) + " bytes left");
                value = view(pos_, static_cast<std::size_t>(length));
                pos_ += static_cast<std::size_t>(length);
                return true;
            }
            case Kind::DeltaByteArray: {
                std::int32_t prefix = 0, length = 0;
                if (!prefixes_.next(prefix) || !lengths_.next(length)) return false;
                if (prefix < 0 || static_cast<std::size_t>(prefix) > previous_.size())
                    fail("a DELTA_BYTE_ARRAY prefix of " + std::to_string(prefix) +
                         " bytes after a value of " + std::to_string(previous_.size()));
                if (length < 0 || static_cast<std::size_t>(length) > data_.size() - pos_)
                    fail("a DELTA_BYTE_ARRAY suffix longer than its page");
                previous_.resize(static_cast<std::size_t>(prefix));
                previous_.append(view(pos_, static_cast<std::size_t>(length)));
                pos_ += static_cast<std::size_t>(length);
                value = previous_;
                return true;
            }
        }
        return false;
    }

  private:
    [[nodiscard]] std::string_view view(std::size_t at, std::size_t size) const {
        return {reinterpret_cast<const char*>(data_.data() + at), size};
    }
    [[noreturn]] void fail(const std::string& what) const;

    Kind kind_ = Kind::Plain;
    const std::string* context_ = nullptr;
    std::span<const std::uint8_t> data_;
    std::size_t pos_ = 0;
    std::span<const std::string_view> dictionary_;
    HybridDecoder indices_;
    DeltaDecoder prefixes_, lengths_;
    std::string previous_;
};

}  // namespace gpt2::parquet
