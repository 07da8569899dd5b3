// Reading a corpus file through zlib or zstd (byte_source.hpp).
#include "data/byte_source.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.hpp"

namespace gpt2::detail {

namespace fs = std::filesystem;

Compression compression_of(const fs::path& path) {
    const std::string ext = path.extension().string();
    if (ext == ".gz") return Compression::Gzip;
    if (ext == ".zst") return Compression::Zstd;
    return Compression::None;
}

ByteSource::ByteSource(const fs::path& path, std::size_t input_bytes)
    : path_(path), compression_(compression_of(path)), in_(input_bytes) {
    file_.reset(std::fopen(path.c_str(), "rb"));
    if (!file_) fail(std::strerror(errno));
    if (compression_ == Compression::Gzip) {
        gz_ = inflateInit2(&z_, 15 + 32) == Z_OK;  // 32: gzip or zlib header
        if (!gz_) fail("cannot start zlib");
    } else if (compression_ == Compression::Zstd) {
        zstd_ = ZSTD_createDStream();
        if (zstd_ == nullptr) fail("cannot start zstd");
    }
}

ByteSource::~ByteSource() {
    if (gz_) inflateEnd(&z_);
    if (zstd_ != nullptr) ZSTD_freeDStream(zstd_);
}

std::size_t ByteSource::read(char* out, std::size_t capacity) {
    if (compression_ == Compression::None) return read_stored(out, capacity);
    for (;;) {
        if (in_begin_ == in_end_ && !eof_) {
            in_begin_ = 0;
            in_end_ = read_stored(in_.data(), in_.size());
            eof_ = in_end_ == 0;
        }
        const std::size_t made = compression_ == Compression::Gzip ? inflate_some(out, capacity)
                                                                   : zstd_some(out, capacity);
        if (made > 0) return made;
        if (eof_ && in_begin_ == in_end_) {
            if (!stream_ended_) fail("truncated compressed data");
            return 0;
        }
    }
}

void ByteSource::fail(const std::string& why) const {
    throw InputError(path_.string() + ": " + why);
}

std::size_t ByteSource::read_stored(char* out, std::size_t capacity) {
    const std::size_t got = std::fread(out, 1, capacity, file_.get());
    if (got < capacity && std::ferror(file_.get())) fail(std::strerror(errno));
    stored_ += got;
    return got;
}

std::size_t ByteSource::inflate_some(char* out, std::size_t capacity) {
    if (stream_ended_) {
        if (in_begin_ == in_end_) return 0;
        // Concatenated gzip members (as `cat a.gz b.gz`) continue the stream.
        if (inflateReset(&z_) != Z_OK) fail("corrupt gzip data");
        stream_ended_ = false;
    }
    z_.next_in = reinterpret_cast<Bytef*>(in_.data() + in_begin_);
    z_.avail_in = static_cast<uInt>(in_end_ - in_begin_);
    z_.next_out = reinterpret_cast<Bytef*>(out);
    z_.avail_out = static_cast<uInt>(std::min<std::size_t>(capacity, 1u << 30));
    const int code = inflate(&z_, Z_NO_FLUSH);
    if (code != Z_OK && code != Z_STREAM_END && code != Z_BUF_ERROR) {
        fail(std::string("corrupt gzip data") +
             (z_.msg != nullptr ? ": " + std::string(z_.msg) : ""));
    }
    in_begin_ = in_end_ - z_.avail_in;
    if (code == Z_STREAM_END) stream_ended_ = true;
    return static_cast<std::size_t>(reinterpret_cast<char*>(z_.next_out) - out);
}

std::size_t ByteSource::zstd_some(char* out, std::size_t capacity) {
    ZSTD_inBuffer input{in_.data() + in_begin_, in_end_ - in_begin_, 0};
    ZSTD_outBuffer output{out, capacity, 0};
    const std::size_t code = ZSTD_decompressStream(zstd_, &output, &input);
    if (ZSTD_isError(code) != 0) fail("corrupt zstd data: " + std::string(ZSTD_getErrorName(code)));
    in_begin_ += input.pos;
    // A frame is complete (a call that consumed and produced nothing says nothing new).
    if (input.pos > 0 || output.pos > 0) stream_ended_ = code == 0;
    return output.pos;
}

}  // namespace gpt2::detail
