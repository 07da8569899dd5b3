// llm.c token shards: a 1024-byte int32 header {20240520, 1, token count} followed by the tokens
// as little-endian uint16, and the loss mask beside a shard (SHARD.mask). Written by prepare_data,
// memory-mapped by the training data loader.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "core/file_kinds.hpp"

namespace gpt2 {

inline constexpr std::int32_t kShardMagic = kLlmcShardMagic;
inline constexpr std::int32_t kShardVersion = 1;
inline constexpr std::size_t kShardHeaderBytes = 256 * sizeof(std::int32_t);

// Writes a shard (through a temporary file renamed into place, so readers never see half a
// shard). Throws InputError if tokens is empty or holds an id outside 0..65535.
void write_shard(const std::filesystem::path& path, std::span<const std::int32_t> tokens);
// The same from ids already in the file's uint16 form (no copy of the tokens is made).
void write_shard(const std::filesystem::path& path, std::span<const std::uint16_t> tokens);

namespace detail {
// A read-only mapping of a whole file, unmapped when destroyed (what a shard and its mask hold).
class FileMapping {
  public:
    FileMapping() = default;
    FileMapping(void* address, std::size_t bytes) : address_(address), bytes_(bytes) {}
    ~FileMapping();
    FileMapping(FileMapping&& other) noexcept
        : address_(std::exchange(other.address_, nullptr)),
          bytes_(std::exchange(other.bytes_, 0)) {}
    FileMapping& operator=(FileMapping&& other) noexcept {
        std::swap(address_, other.address_);
        std::swap(bytes_, other.bytes_);
        return *this;
    }
    FileMapping(const FileMapping&) = delete;
    FileMapping& operator=(const FileMapping&) = delete;

    [[nodiscard]] const unsigned char* bytes() const {
        return static_cast<const unsigned char*>(address_);
    }
    [[nodiscard]] std::size_t size() const { return bytes_; }

  private:
    void* address_ = nullptr;
    std::size_t bytes_ = 0;
};
}  // namespace detail

// A read-only memory mapping of a validated shard. Throws InputError naming the file for a
// missing file, a directory, an empty or truncated file, a wrong magic or version, a token count
// that does not match the file size, or a shard with no tokens.
class MappedShard {
  public:
    explicit MappedShard(const std::filesystem::path& path);
    // A moved-from MappedShard holds nothing.
    MappedShard(MappedShard&& other) noexcept
        : path_(std::move(other.path_)),
          mapping_(std::move(other.mapping_)),
          tokens_(std::exchange(other.tokens_, {})) {}
    MappedShard& operator=(MappedShard&& other) noexcept {
        path_ = std::move(other.path_);
        mapping_ = std::move(other.mapping_);
        tokens_ = std::exchange(other.tokens_, {});
        return *this;
    }

    [[nodiscard]] std::span<const std::uint16_t> tokens() const { return tokens_; }
    [[nodiscard]] const std::filesystem::path& path() const { return path_; }

  private:
    std::filesystem::path path_;
    detail::FileMapping mapping_;
    std::span<const std::uint16_t> tokens_;  // inside mapping_
};

// A shard's loss mask, SHARD.mask beside it (llm.c reads the shard alone, unchanged): a 16-byte
// header, the magic "GPT2MASK", uint32 version 1 and uint32 token count (little-endian), then one
// byte per token of the shard, 1 where predicting the token is trained (a response's), 0 where it
// is not (a prompt's).
inline constexpr std::string_view kMaskMagic = "GPT2MASK";
inline constexpr std::uint32_t kMaskVersion = 1;
inline constexpr std::size_t kMaskHeaderBytes = 16;

[[nodiscard]] std::filesystem::path mask_path(const std::filesystem::path& shard);

// Writes a mask file atomically, as write_shard does. Throws InputError for an empty mask or a
// byte other than 0 and 1.
void write_shard_mask(const std::filesystem::path& path, std::span<const std::uint8_t> mask);

// A read-only memory mapping of a validated mask file. Throws InputError naming the file for a
// missing or unreadable file, a wrong magic or version, a count that does not match the file
// size or `expected_tokens` (its shard's), or a byte other than 0 and 1.
class MappedShardMask {
  public:
    MappedShardMask(const std::filesystem::path& path, std::size_t expected_tokens);
    // A moved-from MappedShardMask holds nothing.
    MappedShardMask(MappedShardMask&& other) noexcept
        : path_(std::move(other.path_)),
          mapping_(std::move(other.mapping_)),
          mask_(std::exchange(other.mask_, {})) {}
    MappedShardMask& operator=(MappedShardMask&& other) noexcept {
        path_ = std::move(other.path_);
        mapping_ = std::move(other.mapping_);
        mask_ = std::exchange(other.mask_, {});
        return *this;
    }

    [[nodiscard]] std::span<const std::uint8_t> mask() const { return mask_; }
    [[nodiscard]] const std::filesystem::path& path() const { return path_; }

  private:
    std::filesystem::path path_;
    detail::FileMapping mapping_;
    std::span<const std::uint8_t> mask_;  // inside mapping_
};

// Throws InputError naming file and position for the first token id >= vocab_size.
void validate_token_range(std::span<const std::uint16_t> tokens, int vocab_size,
                          const std::filesystem::path& file);

// The files matching a glob(3) pattern, sorted; throws InputError if none match.
[[nodiscard]] std::vector<std::filesystem::path> expand_shard_pattern(std::string_view pattern);

}  // namespace gpt2
