// The slow paths of the page decoders in parquet_encodings.hpp: run and block headers, a page's
// set-up for each encoding, and their error lines.
#include "data/parquet/parquet_encodings.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace gpt2::parquet {

namespace {

// Reads unsigned LEB128 varints from a span; false when it ends first (or runs past 10 bytes).
bool read_varint(std::span<const std::uint8_t> data, std::size_t& pos, std::uint64_t& value) {
    value = 0;
    for (int shift = 0; shift < 64 && pos < data.size(); shift += 7) {
        const std::uint8_t b = data[pos++];
        value |= static_cast<std::uint64_t>(b & 0x7F) << shift;
        if ((b & 0x80) == 0) return true;
    }
    return false;
}

std::int64_t unzigzag(std::uint64_t n) {
    return static_cast<std::int64_t>(n >> 1) ^ -static_cast<std::int64_t>(n & 1);
}

}  // namespace

bool HybridDecoder::start_run() {
    std::uint64_t header = 0;
    if (pos_ >= data_.size()) return false;
    if (!read_varint(data_, pos_, header)) fail("a run header cut short");
    if ((header & 1) != 0) {  // bit-packed: groups of 8 values
        const std::uint64_t groups = header >> 1;
        const std::uint64_t bytes = groups * static_cast<std::uint64_t>(width_);
        if (groups > data_.size() || bytes > data_.size() - pos_)
            fail("a bit-packed run longer than its data");
        packed_ = data_.data() + pos_;
        packed_bit_ = 0;
        pos_ += static_cast<std::size_t>(bytes);
        run_left_ = groups * 8;
        rle_ = false;
    } else {  // a run of one repeated value
        const std::size_t bytes = static_cast<std::size_t>(width_ + 7) / 8;
        if (bytes > data_.size() - pos_) fail("a run's value cut short");
        std::uint64_t value = 0;
        for (std::size_t i = 0; i < bytes; ++i)
            value |= static_cast<std::uint64_t>(data_[pos_ + i]) << (8 * i);
        pos_ += bytes;
        if (width_ < 32 && (value >> width_) != 0) fail("a run's value wider than its bits");
        rle_value_ = static_cast<std::uint32_t>(value);
        run_left_ = header >> 1;
        rle_ = true;
    }
    return true;
}

void HybridDecoder::fail(const std::string& what) const {
    throw InputError(*context_ + ": levels or indices: " + what);
}

DeltaDecoder::DeltaDecoder(std::span<const std::uint8_t> data, const std::string* context)
    : data_(data), context_(context) {
    std::uint64_t block = 0, miniblocks = 0, total = 0, first = 0;
    if (!read_varint(data_, pos_, block) || !read_varint(data_, pos_, miniblocks) ||
        !read_varint(data_, pos_, total) || !read_varint(data_, pos_, first))
        fail("a header cut short");
    if (block == 0 || block % 128 != 0 || block > (1u << 20) || miniblocks == 0 ||
        block % miniblocks != 0 || (block / miniblocks) % 32 != 0)
        fail("a block of " + std::to_string(block) + " values in " + std::to_string(miniblocks) +
             " miniblocks");
    if (total > INT32_MAX) fail(std::to_string(total) + " values");
    miniblocks_ = miniblocks;
    per_miniblock_ = block / miniblocks;
    total_ = total;
    left_ = total;
    last_ = static_cast<std::uint32_t>(unzigzag(first));
    header_end_ = pos_;
}

std::size_t DeltaDecoder::end() const {
    std::size_t pos = header_end_;
    std::uint64_t left = total_ > 0 ? total_ - 1 : 0;
    while (left > 0) {
        std::uint64_t min_delta = 0;
        if (!read_varint(data_, pos, min_delta)) fail("a block header cut short");
        if (miniblocks_ > data_.size() - pos) fail("bit widths cut short");
        const std::size_t widths = pos;
        pos += static_cast<std::size_t>(miniblocks_);
        for (std::uint64_t m = 0; m < miniblocks_ && left > 0; ++m) {
            const std::uint64_t bytes = miniblock_bytes(data_[widths + m]);
            if (bytes > data_.size() - pos) fail("a miniblock cut short");
            pos += static_cast<std::size_t>(bytes);
            left -= std::min(left, per_miniblock_);
        }
    }
    return pos;
}

void DeltaDecoder::next_miniblock() {
    if (miniblock_ == miniblocks_ || !in_block_) {
        std::uint64_t min_delta = 0;
        if (!read_varint(data_, pos_, min_delta)) fail("a block header cut short");
        min_delta_ = static_cast<std::uint32_t>(unzigzag(min_delta));
        if (miniblocks_ > data_.size() - pos_) fail("bit widths cut short");
        widths_ = pos_;
        pos_ += static_cast<std::size_t>(miniblocks_);
        miniblock_ = 0;
        in_block_ = true;
    }
    width_ = data_[widths_ + miniblock_];
    const std::uint64_t bytes = miniblock_bytes(static_cast<std::uint8_t>(width_));
    if (bytes > data_.size() - pos_) fail("a miniblock cut short");
    miniblock_data_ = pos_;
    miniblock_bit_ = 0;
    pos_ += static_cast<std::size_t>(bytes);
    in_miniblock_ = per_miniblock_;
    ++miniblock_;
}
std::uint64_t DeltaDecoder::miniblock_bytes(std::uint8_t width) const {
    if (width > 32) fail("a bit width of " + std::to_string(width));
    return per_miniblock_ * width / 8;
}
void DeltaDecoder::fail(const std::string& what) const {
    throw InputError(*context_ + ": DELTA_BINARY_PACKED lengths: " + what);
}

void ValueDecoder::plain(std::span<const std::uint8_t> data, const std::string* context) {
    kind_ = Kind::Plain;
    context_ = context;
    data_ = data;
    pos_ = 0;
}
void ValueDecoder::dictionary(std::span<const std::uint8_t> data,
                              std::span<const std::string_view> dictionary,
                              const std::string* context) {
    kind_ = Kind::Dictionary;
    context_ = context;
    if (data.empty()) {
        dictionary_ = dictionary;
        indices_ = HybridDecoder({}, 0, context);
        return;
    }
    const int width = data[0];
    if (width > 32) fail("dictionary indices of " + std::to_string(width) + " bits");
    dictionary_ = dictionary;
    indices_ = HybridDecoder(data.subspan(1), width, context);
}
void ValueDecoder::delta_length(std::span<const std::uint8_t> data, const std::string* context) {
    kind_ = Kind::DeltaLength;
    context_ = context;
    data_ = data;
    lengths_ = DeltaDecoder(data, context);
    pos_ = lengths_.end();
}
void ValueDecoder::delta_byte_array(std::span<const std::uint8_t> data,
                                    const std::string* context) {
    kind_ = Kind::DeltaByteArray;
    context_ = context;
    data_ = data;
    prefixes_ = DeltaDecoder(data, context);
    const std::size_t suffixes = prefixes_.end();
    lengths_ = DeltaDecoder(data.subspan(suffixes), context);
    pos_ = suffixes + lengths_.end();
    if (prefixes_.total() != lengths_.total())
        fail("DELTA_BYTE_ARRAY with " + std::to_string(prefixes_.total()) + " prefixes and " +
             std::to_string(lengths_.total()) + " suffixes");
    previous_.clear();
}

void ValueDecoder::fail(const std::string& what) const {
    throw InputError(*context_ + ": " + what);
}

}  // namespace gpt2::parquet
