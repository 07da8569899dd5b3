// llm.c token shards: writing, memory-mapped reading with validation, and shard globs.
#include "data/shard.hpp"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <utility>

#include "core/error.hpp"
#include "core/file_io.hpp"

namespace gpt2 {

// Tokens are read in place from the mapping, which only matches the file's byte order here.
static_assert(std::endian::native == std::endian::little,
              "MappedShard reads little-endian uint16 tokens in place");

namespace {

constexpr std::size_t kHeaderWords = kShardHeaderBytes / sizeof(std::int32_t);

void put_le32(std::vector<char>& out, std::int32_t value) {
    const auto bits = static_cast<std::uint32_t>(value);
    for (int shift = 0; shift < 32; shift += 8)
        out.push_back(static_cast<char>(bits >> shift));
}

[[nodiscard]] std::int32_t get_le32(const unsigned char* p) {
    return static_cast<std::int32_t>(std::uint32_t{p[0]} | (std::uint32_t{p[1]} << 8) |
                                     (std::uint32_t{p[2]} << 16) | (std::uint32_t{p[3]} << 24));
}

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what) {
    throw InputError(path.string() + ": " + what);
}

// Closes the descriptor on every exit path of the constructor.
class FileDescriptor {
  public:
    explicit FileDescriptor(int fd) : fd_(fd) {}
    ~FileDescriptor() {
        if (fd_ >= 0) ::close(fd_);
    }
    FileDescriptor(const FileDescriptor&) = delete;
    FileDescriptor& operator=(const FileDescriptor&) = delete;
    [[nodiscard]] int get() const { return fd_; }

  private:
    int fd_;
};

}  // namespace

void write_shard(const std::filesystem::path& path, std::span<const std::int32_t> tokens) {
    // Checked and narrowed here; the header and the atomic write are the uint16 overload's.
    std::vector<std::uint16_t> narrow(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        const std::int32_t id = tokens[i];
        if (id < 0 || id > 0xFFFF) {
            fail(path, "token id " + std::to_string(id) + " at position " + std::to_string(i) +
                           " does not fit llm.c's uint16 shard format (0..65535)");
        }
        narrow[i] = static_cast<std::uint16_t>(id);
    }
    write_shard(path, std::span<const std::uint16_t>(narrow));
}

void write_shard(const std::filesystem::path& path, std::span<const std::uint16_t> tokens) {
    static_assert(std::endian::native == std::endian::little, "shards are little-endian");
    if (tokens.empty()) fail(path, "refusing to write a shard with no tokens");
    if (tokens.size() > static_cast<std::size_t>(INT32_MAX)) {
        fail(path, "too many tokens for one shard (" + std::to_string(tokens.size()) + ")");
    }
    std::vector<char> header;
    std::array<std::int32_t, kHeaderWords> words{};
    words[0] = kShardMagic;
    words[1] = kShardVersion;
    words[2] = static_cast<std::int32_t>(tokens.size());
    for (const std::int32_t word : words)
        put_le32(header, word);
    const std::array<std::span<const std::uint8_t>, 2> pieces = {
        std::span(reinterpret_cast<const std::uint8_t*>(header.data()), header.size()),
        std::span(reinterpret_cast<const std::uint8_t*>(tokens.data()), tokens.size() * 2)};
    write_file_atomically(path, pieces);
}

namespace {

// A read-only mapping of a whole regular file of at least `header_bytes` bytes; `noun` names it in
// errors ("shard", "mask").
detail::FileMapping map_file(const std::filesystem::path& path, const std::string& noun,
                             std::size_t header_bytes) {
    const FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) {
        const int error = errno;
        if (error == ENOENT) fail(path, noun + " file does not exist");
        fail(path, "cannot open " + noun + ": " + std::strerror(error));
    }
    struct stat info {};
    if (::fstat(fd.get(), &info) != 0) {
        fail(path, "cannot stat " + noun + ": " + std::strerror(errno));
    }
    if (S_ISDIR(info.st_mode)) fail(path, "is a directory, not a " + noun + " file");
    if (!S_ISREG(info.st_mode)) fail(path, "is not a regular file");
    const auto size = static_cast<std::size_t>(info.st_size);
    if (size == 0) fail(path, noun + " file is empty");
    if (size < header_bytes) {
        fail(path, noun + " file is " + std::to_string(size) + " bytes, too small for the " +
                       std::to_string(header_bytes) + "-byte header");
    }
    void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (mapping == MAP_FAILED) fail(path, "cannot mmap " + noun + ": " + std::strerror(errno));
    return detail::FileMapping(mapping, size);
}

// Throws InputError naming `path` for the first byte of `mask` other than 0 and 1.
void check_mask_bytes(const std::filesystem::path& path, std::span<const std::uint8_t> mask) {
    const auto bad = std::find_if(mask.begin(), mask.end(), [](std::uint8_t m) { return m > 1; });
    if (bad != mask.end()) {
        fail(path, "mask byte " + std::to_string(*bad) + " at position " +
                       std::to_string(bad - mask.begin()) + " is neither 0 nor 1");
    }
}

}  // namespace

MappedShard::MappedShard(const std::filesystem::path& path)
    : path_(path), mapping_(map_file(path, "shard", kShardHeaderBytes)) {
    const unsigned char* bytes = mapping_.bytes();
    const std::size_t size = mapping_.size();
    const std::int32_t magic = get_le32(bytes);
    const std::int32_t version = get_le32(bytes + 4);
    const std::int32_t count = get_le32(bytes + 8);
    if (magic != kShardMagic) {
        fail(path, "wrong magic " + std::to_string(magic) + " (expected " +
                       std::to_string(kShardMagic) + "): not an llm.c token shard");
    }
    if (version != kShardVersion) {
        fail(path, "wrong shard version " + std::to_string(version) + " (expected " +
                       std::to_string(kShardVersion) + ")");
    }
    if (count <= 0) fail(path, "header token count is " + std::to_string(count));
    const std::size_t expected = kShardHeaderBytes + 2 * static_cast<std::size_t>(count);
    if (size != expected) {
        fail(path, "size mismatch: the header says " + std::to_string(count) + " tokens (" +
                       std::to_string(expected) + " bytes) but the file is " +
                       std::to_string(size) + " bytes");
    }
    tokens_ = std::span(reinterpret_cast<const std::uint16_t*>(bytes + kShardHeaderBytes),
                        static_cast<std::size_t>(count));
}

detail::FileMapping::~FileMapping() {
    if (address_ != nullptr) ::munmap(address_, bytes_);
}

std::filesystem::path mask_path(const std::filesystem::path& shard) {
    std::filesystem::path path = shard;
    path += ".mask";
    return path;
}

void write_shard_mask(const std::filesystem::path& path, std::span<const std::uint8_t> mask) {
    if (mask.empty()) fail(path, "refusing to write a mask with no tokens");
    if (mask.size() > static_cast<std::size_t>(INT32_MAX)) {
        fail(path, "too many tokens for one mask (" + std::to_string(mask.size()) + ")");
    }
    check_mask_bytes(path, mask);
    std::vector<char> header(kMaskMagic.begin(), kMaskMagic.end());
    put_le32(header, static_cast<std::int32_t>(kMaskVersion));
    put_le32(header, static_cast<std::int32_t>(mask.size()));
    const std::array<std::span<const std::uint8_t>, 2> pieces = {
        std::span(reinterpret_cast<const std::uint8_t*>(header.data()), header.size()), mask};
    write_file_atomically(path, pieces);
}

MappedShardMask::MappedShardMask(const std::filesystem::path& path, std::size_t expected_tokens)
    : path_(path), mapping_(map_file(path, "mask", kMaskHeaderBytes)) {
    const unsigned char* bytes = mapping_.bytes();
    const std::size_t size = mapping_.size();
    if (std::string_view(reinterpret_cast<const char*>(bytes), kMaskMagic.size()) != kMaskMagic) {
        fail(path, "wrong magic: not a loss mask file (they start with GPT2MASK)");
    }
    const auto version = static_cast<std::uint32_t>(get_le32(bytes + 8));
    if (version != kMaskVersion) {
        fail(path, "wrong mask version " + std::to_string(version) + " (expected " +
                       std::to_string(kMaskVersion) + ")");
    }
    const auto count = static_cast<std::uint32_t>(get_le32(bytes + 12));
    if (size != kMaskHeaderBytes + count) {
        fail(path, "size mismatch: the header says " + std::to_string(count) +
                       " tokens but the file is " + std::to_string(size) + " bytes");
    }
    if (count != expected_tokens) {
        fail(path, "the mask has " + std::to_string(count) + " tokens but its shard has " +
                       std::to_string(expected_tokens));
    }
    mask_ = std::span(bytes + kMaskHeaderBytes, count);
    check_mask_bytes(path, mask_);
}

void validate_token_range(std::span<const std::uint16_t> tokens, int vocab_size,
                          const std::filesystem::path& file) {
    const auto bad = std::find_if(tokens.begin(), tokens.end(), [vocab_size](std::uint16_t id) {
        return static_cast<int>(id) >= vocab_size;
    });
    if (bad != tokens.end()) {
        fail(file, "token id " + std::to_string(*bad) + " at position " +
                       std::to_string(bad - tokens.begin()) + " is out of range for vocab size " +
                       std::to_string(vocab_size));
    }
}

std::vector<std::filesystem::path> expand_shard_pattern(std::string_view pattern) {
    const std::string pattern_string(pattern);
    glob_t matches{};
    const int rc = ::glob(pattern_string.c_str(), 0, nullptr, &matches);
    const std::unique_ptr<glob_t, decltype(&::globfree)> guard(&matches, &::globfree);
    if (rc == GLOB_NOMATCH) {
        throw InputError("shard pattern '" + pattern_string + "' matches no files");
    }
    if (rc != 0) {
        throw InputError("shard pattern '" + pattern_string + "': glob failed (" +
                         (rc == GLOB_ABORTED ? "read error" : "out of memory") + ")");
    }
    std::vector<std::filesystem::path> paths(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
    std::sort(paths.begin(), paths.end());
    return paths;
}

}  // namespace gpt2
