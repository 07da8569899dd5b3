// Files and bytes: whole-file reads, atomic writes (temporary file, fsync, rename, directory
// fsync) for every file the programs produce, and the checksum the binary formats carry.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace gpt2 {

// A file written atomically piece by piece, so that a large file need not be in memory at once:
// the pieces go to `<path>.tmp.<pid>`, and commit() makes it `path` (fsync, rename, directory
// fsync). Destroyed without commit() (an exception while producing the pieces), it removes the
// temporary file and leaves any previous file at `path` untouched. InputError naming the file.
class AtomicFileWriter {
  public:
    explicit AtomicFileWriter(std::filesystem::path path);
    ~AtomicFileWriter();
    AtomicFileWriter(const AtomicFileWriter&) = delete;
    AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

    void write(std::span<const std::uint8_t> bytes);
    void commit();

  private:
    [[noreturn]] void fail();  // closes and removes the temporary file, throws with errno's text
    std::filesystem::path path_;
    std::filesystem::path tmp_;
    int fd_ = -1;
};

// Writes bytes to `path` atomically: a crash or a full disk leaves the previous file at `path`
// (or none) intact, never a partial one, and no temporary file. InputError naming the file.
void write_file_atomically(const std::filesystem::path& path,
                           std::span<const std::span<const std::uint8_t>> pieces);
void write_file_atomically(const std::filesystem::path& path, std::span<const std::uint8_t> bytes);
// Reads a whole file; InputError naming it if missing, a directory or unreadable.
[[nodiscard]] std::vector<std::uint8_t> read_file_bytes(const std::filesystem::path& path);
// A whole file read once, front to back, without all of it in memory at once: mapped read-only
// where the system allows (else read into memory), its pages handed back as the reader is done
// with them, so that a 6 GiB model file never sits in memory beside the model it fills.
class MappedFile {
  public:
    // InputError naming the file if missing, a directory or unreadable (as read_file_bytes).
    explicit MappedFile(const std::filesystem::path& path);
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    [[nodiscard]] std::span<const std::uint8_t> bytes() const { return bytes_; }
    // Hands back the memory pages lying wholly inside `piece` (a part of bytes()); touched again
    // they are read again from the file. Nothing for a file that was read into memory.
    void release(std::span<const std::uint8_t> piece) const;

  private:
    std::span<const std::uint8_t> bytes_;
    void* mapping_ = nullptr;         // null: read into `read_`
    std::vector<std::uint8_t> read_;  // where mapping failed (or an empty file)
};

// The same, as text (any bytes).
[[nodiscard]] std::string read_text_file(const std::filesystem::path& path);

// A fast 64-bit checksum over bytes (word-wise multiply-mix, not cryptographic).
[[nodiscard]] std::uint64_t checksum64(std::span<const std::uint8_t> bytes, std::uint64_t seed = 0);

// checksum64 fed piece by piece: value() is checksum64(seed) of the pieces' concatenation, however
// they are cut (a file checksummed as it is written).
class Checksum64 {
  public:
    explicit Checksum64(std::uint64_t seed = 0);
    void add(std::span<const std::uint8_t> bytes);
    [[nodiscard]] std::uint64_t value() const;

  private:
    static constexpr std::size_t kBlock = 32;  // four 8-byte lanes
    void mix_block(const std::uint8_t* block);
    std::array<std::uint64_t, 4> lane_{};
    std::array<std::uint8_t, kBlock> pending_{};  // the start of a block not yet complete
    std::size_t pending_size_ = 0;
    std::uint64_t total_ = 0;
};

}  // namespace gpt2
