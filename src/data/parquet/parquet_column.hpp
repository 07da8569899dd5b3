// One Parquet column chunk read value by value, streaming page after page: page headers,
// decompression (UNCOMPRESSED, SNAPPY, GZIP, ZSTD), data pages v1 and v2, the RLE/bit-packed
// hybrid levels, and the string encodings PLAIN, dictionary (with PLAIN pages after it when a
// writer fell back), DELTA_LENGTH_BYTE_ARRAY and DELTA_BYTE_ARRAY. Memory holds one page and the
// chunk's dictionary, never the chunk.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "data/parquet/parquet_format.hpp"

namespace gpt2::parquet {

// A file read at offsets (pread); remembers how far into it reading has reached.
class ParquetFile {
  public:
    // Opens it; InputError naming it if it cannot be read.
    explicit ParquetFile(std::filesystem::path path);
    ~ParquetFile();
    ParquetFile(const ParquetFile&) = delete;
    ParquetFile& operator=(const ParquetFile&) = delete;

    [[nodiscard]] std::uint64_t size() const { return size_; }
    [[nodiscard]] const std::filesystem::path& path() const { return path_; }
    // Exactly out.size() bytes at `offset` (InputError if the file ends before).
    void read(std::uint64_t offset, std::span<std::uint8_t> out) const;
    // The end of the furthest byte read so far (progress).
    [[nodiscard]] std::uint64_t furthest_read() const { return furthest_; }

  private:
    std::filesystem::path path_;
    int fd_ = -1;
    std::uint64_t size_ = 0;
    mutable std::uint64_t furthest_ = 0;
};

// What the pages read so far were: which writers' features a file exercised (the tests check that
// their fixtures cover every variant read).
struct ParquetReadStats {
    std::uint64_t dictionary_pages = 0;
    std::uint64_t data_pages_v1 = 0;
    std::uint64_t data_pages_v2 = 0;
    std::array<std::uint64_t, 10> data_pages_by_encoding{};  // index: Encoding
    std::array<std::uint64_t, 8> pages_by_codec{};           // index: Codec
    // Chunks where PLAIN data pages follow dictionary-encoded ones (the writer's dictionary grew
    // past its limit and it fell back).
    std::uint64_t dictionary_fallbacks = 0;
};

// A value's levels and, when it is defined down to the leaf, its bytes.
struct LevelEntry {
    int repetition = 0;
    int definition = 0;
    bool has_value = false;
    std::string_view value;  // valid until the cursor's next call
};

class ColumnCursor {
  public:
    // The chunk of `leaf` described by `chunk` (a BYTE_ARRAY column, its codec one of the four
    // read; the caller checked both). `context` starts every error ("FILE: column 'text' in row
    // group 3"). A page that would need more than max_page_bytes of memory is refused. The pages
    // read are counted in `stats`.
    ColumnCursor(const ParquetFile& file, const LeafColumn& leaf, const ColumnChunkMeta& chunk,
                 std::string context, std::size_t max_page_bytes, ParquetReadStats& stats);
    ~ColumnCursor();
    ColumnCursor(const ColumnCursor&) = delete;
    ColumnCursor& operator=(const ColumnCursor&) = delete;
    ColumnCursor(ColumnCursor&&) noexcept;
    ColumnCursor& operator=(ColumnCursor&&) noexcept;

    // The next entry; false once the chunk's values (ColumnMetaData.num_values) are all read.
    // InputError for anything corrupt or inconsistent.
    [[nodiscard]] bool next(LevelEntry& entry);

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace gpt2::parquet
