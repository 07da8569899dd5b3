// Files and bytes: whole-file reads, atomic writes (temporary file, fsync, rename, directory
// fsync) for every file the programs produce, and the checksum the binary formats carry.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace gpt2 {

// Writes bytes to `path` atomically: a crash or a full disk leaves the previous file at `path`
// (or none) intact, never a partial one, and no temporary file. InputError naming the file.
void write_file_atomically(const std::filesystem::path& path,
                           std::span<const std::span<const std::uint8_t>> pieces);
void write_file_atomically(const std::filesystem::path& path, std::span<const std::uint8_t> bytes);
// Reads a whole file; InputError naming it if missing, a directory or unreadable.
[[nodiscard]] std::vector<std::uint8_t> read_file_bytes(const std::filesystem::path& path);
// The same, as text (any bytes).
[[nodiscard]] std::string read_text_file(const std::filesystem::path& path);

// A fast 64-bit checksum over bytes (word-wise multiply-mix, not cryptographic).
[[nodiscard]] std::uint64_t checksum64(std::span<const std::uint8_t> bytes, std::uint64_t seed = 0);

}  // namespace gpt2
