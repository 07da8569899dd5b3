// llm.c token shards: a 1024-byte int32 header {20240520, 1, token count} followed by the tokens
// as little-endian uint16, and the loss mask beside a shard (SHARD.mask). Written by prepare_data,
// memory-mapped by the training data loader.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

namespace gpt2 {

inline constexpr std::int32_t kShardMagic = 20240520;
inline constexpr std::int32_t kShardVersion = 1;
inline constexpr std::size_t kShardHeaderBytes = 256 * sizeof(std::int32_t);

// Writes a shard (through a temporary file renamed into place, so readers never see half a
// shard). Throws InputError if tokens is empty or holds an id outside 0..65535.
void write_shard(const std::filesystem::path& path, std::span<const std::int32_t> tokens);
// The same from ids already in the file's uint16 form (no copy of the tokens is made).
void write_shard(const std::filesystem::path& path, std::span<const std::uint16_t> tokens);

// A read-only memory mapping of a validated shard. Throws InputError naming the file for a
// missing file, a directory, an empty or truncated file, a wrong magic or version, a token count
// that does not match the file size, or a shard with no tokens.
class MappedShard {
  public:
    explicit MappedShard(const std::filesystem::path& path);
    ~MappedShard();
    MappedShard(MappedShard&& other) noexcept;
    MappedShard& operator=(MappedShard&& other) noexcept;
    MappedShard(const MappedShard&) = delete;
    MappedShard& operator=(const MappedShard&) = delete;

    [[nodiscard]] std::span<const std::uint16_t> tokens() const { return tokens_; }
    [[nodiscard]] const std::filesystem::path& path() const { return path_; }

  private:
    void unmap() noexcept;

    std::filesystem::path path_;
    void* mapping_ = nullptr;
    std::size_t mapping_size_ = 0;
    std::span<const std::uint16_t> tokens_;
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
    ~MappedShardMask();
    MappedShardMask(MappedShardMask&& other) noexcept;
    MappedShardMask& operator=(MappedShardMask&& other) noexcept;
    MappedShardMask(const MappedShardMask&) = delete;
    MappedShardMask& operator=(const MappedShardMask&) = delete;

    [[nodiscard]] std::span<const std::uint8_t> mask() const { return mask_; }
    [[nodiscard]] const std::filesystem::path& path() const { return path_; }

  private:
    void unmap() noexcept;

    std::filesystem::path path_;
    void* mapping_ = nullptr;
    std::size_t mapping_size_ = 0;
    std::span<const std::uint8_t> mask_;
};

// Throws InputError naming file and position for the first token id >= vocab_size.
void validate_token_range(std::span<const std::uint16_t> tokens, int vocab_size,
                          const std::filesystem::path& file);

// The files matching a glob(3) pattern, sorted; throws InputError if none match.
[[nodiscard]] std::vector<std::filesystem::path> expand_shard_pattern(std::string_view pattern);

}  // namespace gpt2
