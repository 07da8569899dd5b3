// llm.c token shards: a 1024-byte int32 header {20240520, 1, token count} followed by the tokens
// as little-endian uint16. Written by prepare_data, memory-mapped by the training data loader.
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

// Throws InputError naming file and position for the first token id >= vocab_size.
void validate_token_range(std::span<const std::uint16_t> tokens, int vocab_size,
                          const std::filesystem::path& file);

// The files matching a glob(3) pattern, sorted; throws InputError if none match.
[[nodiscard]] std::vector<std::filesystem::path> expand_shard_pattern(std::string_view pattern);

}  // namespace gpt2
