// A corpus file's bytes, decompressed (gzip, zstd) as they are read: what the corpus listing
// (corpus_files.cpp) and the document stream (documents.cpp) share; private to data/.
#pragma once

#include <zlib.h>
#include <zstd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace gpt2::detail {

enum class Compression { None, Gzip, Zstd };

[[nodiscard]] Compression compression_of(const std::filesystem::path& path);

// How much of a file is read at a time.
constexpr std::size_t kReadChunk = std::size_t{1} << 20;

// The bytes of one file, decompressed; counts what it consumed of the file as stored.
class ByteSource {
  public:
    // `input_bytes`: how much of a compressed file is read at a time.
    explicit ByteSource(const std::filesystem::path& path,
                        std::size_t input_bytes = std::size_t{1} << 20);
    ~ByteSource();
    ByteSource(const ByteSource&) = delete;
    ByteSource& operator=(const ByteSource&) = delete;

    // Up to `capacity` bytes into `out`; 0 at the end.
    std::size_t read(char* out, std::size_t capacity);
    [[nodiscard]] std::uint64_t stored_read() const { return stored_; }

  private:
    [[noreturn]] void fail(const std::string& why) const;
    std::size_t read_stored(char* out, std::size_t capacity);
    std::size_t inflate_some(char* out, std::size_t capacity);
    std::size_t zstd_some(char* out, std::size_t capacity);

    std::filesystem::path path_;
    Compression compression_;
    // Members, so that a constructor failing after fopen still closes the file.
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> file_{nullptr, &std::fclose};
    z_stream z_{};
    bool gz_ = false;
    ZSTD_DStream* zstd_ = nullptr;
    std::vector<char> in_;
    std::size_t in_begin_ = 0, in_end_ = 0;
    bool eof_ = false;
    bool stream_ended_ = false;
    std::uint64_t stored_ = 0;
};

}  // namespace gpt2::detail
