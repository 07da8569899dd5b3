#include "core/file_io.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "core/error.hpp"

namespace gpt2 {

namespace {
std::string errno_text() {
    return std::strerror(errno);
}

template <typename T>
T read_pod(std::span<const std::uint8_t> bytes, std::size_t offset) {
    T value;
    std::memcpy(&value, bytes.data() + offset, sizeof(T));
    return value;
}

void fsync_directory(const std::filesystem::path& dir) {
    const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        ::fsync(fd);
        ::close(fd);
    }
}
}  // namespace

std::uint64_t checksum64(std::span<const std::uint8_t> bytes, std::uint64_t seed) {
    constexpr std::uint64_t kMul = 0x9E3779B97F4A7C15ull;
    // Four independent lanes keep the multiplier pipeline busy.
    std::array<std::uint64_t, 4> lane = {seed ^ 0x243F6A8885A308D3ull, seed ^ 0x13198A2E03707344ull,
                                         seed ^ 0xA4093822299F31D0ull,
                                         seed ^ 0x082EFA98EC4E6C89ull};
    std::size_t i = 0;
    for (; i + 32 <= bytes.size(); i += 32) {
        for (std::size_t k = 0; k < 4; ++k) {
            const auto word = read_pod<std::uint64_t>(bytes, i + 8 * k);
            lane[k] = (lane[k] ^ word) * kMul;
            lane[k] ^= lane[k] >> 29;
        }
    }
    std::uint64_t h = bytes.size();
    for (std::uint64_t l : lane)
        h = (h ^ l) * kMul + (h >> 31);
    for (; i < bytes.size(); ++i)
        h = (h ^ bytes[i]) * kMul;
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDull;
    return h ^ (h >> 33);
}

void write_file_atomically(const std::filesystem::path& path,
                           std::span<const std::span<const std::uint8_t>> pieces) {
    const std::filesystem::path tmp =
        path.string() + ".tmp." + std::to_string(static_cast<long>(::getpid()));
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) throw InputError("cannot write " + path.string() + ": " + errno_text());
    const auto fail = [&](const std::string& what) {
        const std::string message = "cannot write " + path.string() + ": " + what;
        ::close(fd);
        ::unlink(tmp.c_str());
        throw InputError(message);
    };
    for (std::span<const std::uint8_t> piece : pieces) {
        std::size_t done = 0;
        while (done < piece.size()) {
            const ssize_t n = ::write(fd, piece.data() + done, piece.size() - done);
            if (n < 0) {
                if (errno == EINTR) continue;
                fail(errno_text());
            }
            done += static_cast<std::size_t>(n);
        }
    }
    if (::fsync(fd) != 0) fail(errno_text());
    if (::close(fd) != 0) {
        ::unlink(tmp.c_str());
        throw InputError("cannot write " + path.string() + ": " + errno_text());
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        const std::string message = "cannot write " + path.string() + ": " + errno_text();
        ::unlink(tmp.c_str());
        throw InputError(message);
    }
    fsync_directory(path.parent_path());
}

std::vector<std::uint8_t> read_file_bytes(const std::filesystem::path& path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
        throw InputError(path.string() + ": is a directory, expected a file");
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) throw InputError(path.string() + ": cannot open (" + errno_text() + ")");
    in.seekg(0, std::ios::end);
    const std::streamoff size = in.tellg();
    in.seekg(0, std::ios::beg);
    std::vector<std::uint8_t> bytes(static_cast<std::size_t>(std::max<std::streamoff>(size, 0)));
    if (!in.read(reinterpret_cast<char*>(bytes.data()),
                 static_cast<std::streamsize>(bytes.size()))) {
        throw InputError(path.string() + ": read failed");
    }
    return bytes;
}

std::string read_text_file(const std::filesystem::path& path) {
    const std::vector<std::uint8_t> bytes = read_file_bytes(path);
    return std::string(bytes.begin(), bytes.end());
}

void write_file_atomically(const std::filesystem::path& path, std::span<const std::uint8_t> bytes) {
    const std::array pieces = {bytes};
    write_file_atomically(path, pieces);
}

}  // namespace gpt2
