// The column-chunk reader: page headers, decompression, dictionary and data pages (v1, v2) read
// one after another; the values inside a page are decoded by parquet_encodings.hpp.
#include "data/parquet/parquet_column.hpp"

#include <fcntl.h>
#include <snappy.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "data/parquet/parquet_encodings.hpp"
#include "data/parquet/thrift_compact.hpp"

namespace gpt2::parquet {

namespace {

// A page header is read through a window of the file that grows until the header fits.
constexpr std::size_t kHeaderWindow = 1024;

std::string megabytes(std::uint64_t bytes) {
    return std::to_string((bytes + (1u << 20) - 1) >> 20) + " MB";
}

}  // namespace

ParquetFile::ParquetFile(std::filesystem::path path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw InputError(path_.string() + ": " + std::strerror(errno));
    struct stat info {};
    if (::fstat(fd_, &info) != 0 || !S_ISREG(info.st_mode)) {
        const int error = errno;
        ::close(fd_);
        throw InputError(path_.string() + ": " +
                         (S_ISREG(info.st_mode) ? std::strerror(error) : "not a regular file"));
    }
    size_ = static_cast<std::uint64_t>(info.st_size);
}

ParquetFile::~ParquetFile() {
    if (fd_ >= 0) ::close(fd_);
}

void ParquetFile::read(std::uint64_t offset, std::span<std::uint8_t> out) const {
    if (offset > size_ || out.size() > size_ - offset) {
        throw InputError(path_.string() + ": reading " + std::to_string(out.size()) +
                         " bytes at byte " + std::to_string(offset) + " runs past its end (" +
                         std::to_string(size_) + " bytes): truncated");
    }
    std::size_t done = 0;
    while (done < out.size()) {
        const ssize_t got =
            ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            throw InputError(path_.string() + ": " +
                             (got < 0 ? std::strerror(errno) : "the file shrank while read"));
        }
        done += static_cast<std::size_t>(got);
    }
    furthest_ = std::max(furthest_, offset + out.size());
}

struct ColumnCursor::Impl {
    const ParquetFile* file = nullptr;
    std::string context;
    int max_definition = 0;
    int max_repetition = 0;
    std::int32_t codec = 0;
    std::size_t max_page_bytes = 0;
    std::uint64_t pos = 0;  // the next page header's offset
    std::uint64_t end = 0;  // the chunk's end
    std::int64_t chunk_values_left = 0;
    std::int64_t page_values_left = 0;
    bool seen_data_page = false;
    bool seen_dictionary_encoded = false;
    bool counted_fallback = false;
    ParquetReadStats* stats = nullptr;

    std::vector<std::uint8_t> header;    // a window on the next page header
    std::vector<std::uint8_t> raw;       // the page as stored
    std::vector<std::uint8_t> inflated;  // the page (or v2: its values) decompressed
    std::vector<std::uint8_t> dictionary_bytes;
    std::vector<std::string_view> dictionary;  // views into dictionary_bytes
    bool has_dictionary = false;
    ZSTD_DCtx* zstd = nullptr;

    HybridDecoder repetition_levels;
    HybridDecoder definition_levels;
    ValueDecoder values;

    ~Impl() {
        if (zstd != nullptr) ZSTD_freeDCtx(zstd);
    }

    [[noreturn]] void fail(const std::string& what) const {
        throw InputError(context + ": " + what);
    }

    PageHeader read_header() {
        std::size_t window =
            static_cast<std::size_t>(std::min<std::uint64_t>(kHeaderWindow, end - pos));
        for (;;) {
            header.resize(window);
            file->read(pos, header);
            try {
                return parse_page_header(header,
                                         context + ": page header at byte " + std::to_string(pos));
            } catch (const thrift::OutOfBytes&) {
                if (window == end - pos) fail("a page header runs past the end of the chunk");
                window = static_cast<std::size_t>(
                    std::min<std::uint64_t>(std::uint64_t{window} * 4, end - pos));
            }
        }
    }

    // `size` bytes (the page's uncompressed size) from `in`, into `out`.
    void decompress(std::span<const std::uint8_t> in, std::size_t size,
                    std::vector<std::uint8_t>& out) {
        const char* const codec_name_text = codec == 1 ? "snappy" : codec == 2 ? "gzip" : "zstd";
        const auto corrupt = [&](const std::string& why) {
            fail(std::string("corrupt ") + codec_name_text + " data in a page" +
                 (why.empty() ? "" : ": " + why));
        };
        const auto* compressed = reinterpret_cast<const char*>(in.data());
        if (codec == static_cast<std::int32_t>(Codec::Snappy)) {
            std::size_t length = 0;
            if (!snappy::GetUncompressedLength(compressed, in.size(), &length)) corrupt("");
            if (length != size)
                corrupt(std::to_string(length) + " bytes where the header says " +
                        std::to_string(size));
            out.resize(size);
            if (!snappy::RawUncompress(compressed, in.size(), reinterpret_cast<char*>(out.data())))
                corrupt("");
            return;
        }
        out.resize(size);
        if (codec == static_cast<std::int32_t>(Codec::Zstd)) {
            if (zstd == nullptr) zstd = ZSTD_createDCtx();
            if (zstd == nullptr) fail("cannot start zstd");
            const std::size_t made =
                ZSTD_decompressDCtx(zstd, out.data(), size, in.data(), in.size());
            if (ZSTD_isError(made) != 0) corrupt(ZSTD_getErrorName(made));
            if (made != size)
                corrupt(std::to_string(made) + " bytes where the header says " +
                        std::to_string(size));
            return;
        }
        // GZIP: one or more gzip members (zlib streams accepted too).
        z_stream z{};
        if (inflateInit2(&z, 15 + 32) != Z_OK) fail("cannot start zlib");
        const std::unique_ptr<z_stream, int (*)(z_stream*)> guard(&z, &inflateEnd);
        z.next_in = const_cast<Bytef*>(in.data());
        z.avail_in = static_cast<uInt>(in.size());
        z.next_out = out.data();
        z.avail_out = static_cast<uInt>(size);
        for (;;) {
            const int code = inflate(&z, Z_NO_FLUSH);
            if (code == Z_STREAM_END) {
                if (z.avail_in == 0 || z.avail_out == 0) break;
                if (inflateReset(&z) != Z_OK) corrupt("");  // another member follows
                continue;
            }
            if (code == Z_OK) continue;  // progress; Z_BUF_ERROR: none possible
            if (code == Z_BUF_ERROR)
                corrupt(z.avail_out == 0 ? "more bytes than the header says" : "cut short");
            corrupt(z.msg != nullptr ? z.msg : "");
        }
        if (z.avail_out != 0) corrupt("fewer bytes than the header says");
    }

    // The page's bytes as stored: `size` of them after the header.
    std::span<const std::uint8_t> read_page(const PageHeader& h, std::uint64_t at) {
        raw.resize(static_cast<std::size_t>(h.compressed_size));
        file->read(at, raw);
        return raw;
    }

    void load_dictionary(const PageHeader& h, std::uint64_t at) {
        if (has_dictionary || seen_data_page) fail("a second dictionary page, or one after data");
        if (h.encoding != static_cast<std::int32_t>(Encoding::Plain) &&
            h.encoding != static_cast<std::int32_t>(Encoding::PlainDictionary))
            fail("a dictionary page encoded " + encoding_name(h.encoding));
        const std::span<const std::uint8_t> stored = read_page(h, at);
        const auto size = static_cast<std::size_t>(h.uncompressed_size);
        if (codec == static_cast<std::int32_t>(Codec::Uncompressed)) {
            if (stored.size() != size) fail("an uncompressed page whose sizes differ");
            dictionary_bytes.assign(stored.begin(), stored.end());
        } else {
            decompress(stored, size, dictionary_bytes);
        }
        if (h.num_values < 0 || static_cast<std::size_t>(h.num_values) > size / 4)
            fail("a dictionary of " + std::to_string(h.num_values) + " values in " +
                 std::to_string(size) + " bytes");
        dictionary.clear();
        dictionary.reserve(static_cast<std::size_t>(h.num_values));
        std::size_t p = 0;
        for (std::int32_t i = 0; i < h.num_values; ++i) {
            if (size - p < 4) fail("the dictionary page is cut short");
            const std::uint32_t length = le32(dictionary_bytes.data() + p);
            p += 4;
            if (length > size - p) fail("a dictionary value runs past its page");
            dictionary.emplace_back(reinterpret_cast<const char*>(dictionary_bytes.data() + p),
                                    length);
            p += length;
        }
        has_dictionary = true;
    }

    void start_values(std::int32_t encoding, std::span<const std::uint8_t> data) {
        switch (static_cast<Encoding>(encoding)) {
            case Encoding::Plain:
                values.plain(data, &context);
                return;
            case Encoding::PlainDictionary:
            case Encoding::RleDictionary:
                if (!has_dictionary) fail("a dictionary-encoded page without a dictionary page");
                values.dictionary(data, dictionary, &context);
                return;
            case Encoding::DeltaLengthByteArray:
                values.delta_length(data, &context);
                return;
            case Encoding::DeltaByteArray:
                values.delta_byte_array(data, &context);
                return;
            default:
                fail("values encoded " + encoding_name(encoding) +
                     ", not one of the string encodings this reader knows (PLAIN, "
                     "RLE_DICTIONARY, PLAIN_DICTIONARY, DELTA_LENGTH_BYTE_ARRAY, "
                     "DELTA_BYTE_ARRAY)");
        }
    }

    // v1: [repetition levels][definition levels][values], all compressed together; each level
    // block a 4-byte length and the hybrid encoding.
    void load_data_page_v1(const PageHeader& h, std::uint64_t at) {
        const std::span<const std::uint8_t> stored = read_page(h, at);
        const auto size = static_cast<std::size_t>(h.uncompressed_size);
        std::span<const std::uint8_t> page = stored;
        if (codec == static_cast<std::int32_t>(Codec::Uncompressed)) {
            if (stored.size() != size) fail("an uncompressed page whose sizes differ");
        } else {
            decompress(stored, size, inflated);
            page = inflated;
        }
        std::size_t p = 0;
        const auto levels = [&](int max_level, std::int32_t encoding, const char* what) {
            if (encoding != static_cast<std::int32_t>(Encoding::Rle))
                fail(std::string(what) + " levels encoded " + encoding_name(encoding) +
                     " (only RLE is read; BIT_PACKED levels are deprecated)");
            if (page.size() - p < 4) fail(std::string(what) + " levels cut short");
            const std::uint32_t length = le32(page.data() + p);
            p += 4;
            if (length > page.size() - p) fail(std::string(what) + " levels cut short");
            const HybridDecoder decoder(page.subspan(p, length), bit_width(max_level), &context);
            p += length;
            return decoder;
        };
        if (max_repetition > 0)
            repetition_levels = levels(max_repetition, h.repetition_level_encoding, "repetition");
        if (max_definition > 0)
            definition_levels = levels(max_definition, h.definition_level_encoding, "definition");
        start_values(h.encoding, page.subspan(p));
    }

    // v2: the levels first, uncompressed and without length prefixes; then the values,
    // compressed unless is_compressed says otherwise.
    void load_data_page_v2(const PageHeader& h, std::uint64_t at) {
        const std::span<const std::uint8_t> stored = read_page(h, at);
        if (h.repetition_levels_size < 0 || h.definition_levels_size < 0 ||
            static_cast<std::uint64_t>(h.repetition_levels_size) + h.definition_levels_size >
                std::min<std::uint64_t>(stored.size(),
                                        static_cast<std::uint64_t>(h.uncompressed_size)))
            fail("a v2 page whose level sizes exceed the page");
        const auto rep_size = static_cast<std::size_t>(h.repetition_levels_size);
        const auto def_size = static_cast<std::size_t>(h.definition_levels_size);
        if (max_repetition > 0)
            repetition_levels =
                HybridDecoder(stored.subspan(0, rep_size), bit_width(max_repetition), &context);
        if (max_definition > 0)
            definition_levels = HybridDecoder(stored.subspan(rep_size, def_size),
                                              bit_width(max_definition), &context);
        const std::span<const std::uint8_t> stored_values = stored.subspan(rep_size + def_size);
        const std::size_t size =
            static_cast<std::size_t>(h.uncompressed_size) - rep_size - def_size;
        if (!h.is_compressed || codec == static_cast<std::int32_t>(Codec::Uncompressed)) {
            if (stored_values.size() != size) fail("an uncompressed page whose sizes differ");
            start_values(h.encoding, stored_values);
        } else {
            decompress(stored_values, size, inflated);
            start_values(h.encoding, inflated);
        }
    }

    void count(const PageHeader& h) {
        if (codec >= 0 && static_cast<std::size_t>(codec) < stats->pages_by_codec.size())
            ++stats->pages_by_codec[static_cast<std::size_t>(codec)];
        const auto type = static_cast<PageType>(h.type);
        if (type == PageType::Dictionary) ++stats->dictionary_pages;
        if (type != PageType::Data && type != PageType::DataV2) return;
        ++(type == PageType::Data ? stats->data_pages_v1 : stats->data_pages_v2);
        if (h.encoding >= 0 &&
            static_cast<std::size_t>(h.encoding) < stats->data_pages_by_encoding.size())
            ++stats->data_pages_by_encoding[static_cast<std::size_t>(h.encoding)];
        const bool dictionary_encoded =
            h.encoding == static_cast<std::int32_t>(Encoding::RleDictionary) ||
            h.encoding == static_cast<std::int32_t>(Encoding::PlainDictionary);
        seen_dictionary_encoded = seen_dictionary_encoded || dictionary_encoded;
        if (seen_dictionary_encoded && h.encoding == static_cast<std::int32_t>(Encoding::Plain) &&
            !counted_fallback) {
            ++stats->dictionary_fallbacks;
            counted_fallback = true;
        }
    }

    // Moves to the next data page; false when the chunk's values are all read.
    bool load_page() {
        while (chunk_values_left > 0) {
            if (pos >= end)
                fail("the column chunk ends with " + std::to_string(chunk_values_left) +
                     " of its values (as the footer counts them) missing");
            const PageHeader h = read_header();
            const std::uint64_t at = pos + h.header_size;
            if (static_cast<std::uint64_t>(h.compressed_size) > end - at)
                fail("a page runs past the end of its column chunk");
            if (static_cast<std::size_t>(h.uncompressed_size) > max_page_bytes ||
                static_cast<std::size_t>(h.compressed_size) > max_page_bytes)
                fail("a page of " +
                     megabytes(static_cast<std::uint64_t>(
                         std::max(h.uncompressed_size, h.compressed_size))) +
                     ", more than the " + megabytes(max_page_bytes) + " this reader holds");
            pos = at + static_cast<std::uint64_t>(h.compressed_size);
            count(h);
            switch (static_cast<PageType>(h.type)) {
                case PageType::Dictionary:
                    load_dictionary(h, at);
                    continue;
                case PageType::Index:
                    continue;
                case PageType::Data:
                case PageType::DataV2:
                    break;
                default:
                    fail("a page of unknown type " + std::to_string(h.type));
            }
            seen_data_page = true;
            if (h.num_values < 0 || h.encoding < 0) fail("a data page without its value count");
            if (h.num_values > chunk_values_left)
                fail("the pages hold more values than the footer says");
            if (static_cast<PageType>(h.type) == PageType::Data) {
                load_data_page_v1(h, at);
            } else {
                load_data_page_v2(h, at);
            }
            page_values_left = h.num_values;
            if (page_values_left > 0) return true;
        }
        return false;
    }
};

ColumnCursor::ColumnCursor(const ParquetFile& file, const LeafColumn& leaf,
                           const ColumnChunkMeta& chunk, std::string context,
                           std::size_t max_page_bytes, ParquetReadStats& stats)
    : impl_(std::make_unique<Impl>()) {
    Impl& c = *impl_;
    c.file = &file;
    c.stats = &stats;
    c.context = std::move(context);
    c.max_definition = leaf.max_definition;
    c.max_repetition = leaf.max_repetition;
    c.codec = chunk.codec;
    c.max_page_bytes = max_page_bytes;
    const std::int64_t start = chunk.dictionary_page_offset && *chunk.dictionary_page_offset > 0
                                   ? std::min(*chunk.dictionary_page_offset, chunk.data_page_offset)
                                   : chunk.data_page_offset;
    if (start < 4 || chunk.total_compressed_size < 0 ||
        static_cast<std::uint64_t>(start) > file.size() ||
        static_cast<std::uint64_t>(chunk.total_compressed_size) >
            file.size() - static_cast<std::uint64_t>(start)) {
        c.fail("the footer places the column chunk at bytes " + std::to_string(start) + ".." +
               std::to_string(start + chunk.total_compressed_size) + ", outside the file's " +
               std::to_string(file.size()) + " bytes");
    }
    if (chunk.num_values < 0) c.fail("a negative value count in the footer");
    c.pos = static_cast<std::uint64_t>(start);
    c.end = c.pos + static_cast<std::uint64_t>(chunk.total_compressed_size);
    c.chunk_values_left = chunk.num_values;
}

ColumnCursor::~ColumnCursor() = default;
ColumnCursor::ColumnCursor(ColumnCursor&&) noexcept = default;
ColumnCursor& ColumnCursor::operator=(ColumnCursor&&) noexcept = default;

bool ColumnCursor::next(LevelEntry& entry) {
    Impl& c = *impl_;
    while (c.page_values_left == 0) {
        if (!c.load_page()) return false;
    }
    --c.page_values_left;
    --c.chunk_values_left;
    std::uint32_t repetition = 0;
    std::uint32_t definition = static_cast<std::uint32_t>(c.max_definition);
    if (c.max_repetition > 0 && !c.repetition_levels.next(repetition))
        c.fail("the repetition levels end before the page's values");
    if (c.max_definition > 0 && !c.definition_levels.next(definition))
        c.fail("the definition levels end before the page's values");
    if (repetition > static_cast<std::uint32_t>(c.max_repetition) ||
        definition > static_cast<std::uint32_t>(c.max_definition))
        c.fail("a level above the schema's maximum");
    entry.repetition = static_cast<int>(repetition);
    entry.definition = static_cast<int>(definition);
    entry.has_value = entry.definition == c.max_definition;
    if (entry.has_value && !c.values.next(entry.value))
        c.fail("the page's values end before its levels say");
    if (!entry.has_value) entry.value = {};
    return true;
}

}  // namespace gpt2::parquet
