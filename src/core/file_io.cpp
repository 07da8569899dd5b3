#include "core/file_io.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <utility>

#include "core/error.hpp"

namespace gpt2 {

namespace {
std::string errno_text() {
    return std::strerror(errno);
}

void fsync_directory(const std::filesystem::path& dir) {
    const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        ::fsync(fd);
        ::close(fd);
    }
}

constexpr std::uint64_t kChecksumMul = 0x9E3779B97F4A7C15ull;
}  // namespace

Checksum64::Checksum64(std::uint64_t seed)
    : lane_{seed ^ 0x243F6A8885A308D3ull, seed ^ 0x13198A2E03707344ull,
            seed ^ 0xA4093822299F31D0ull, seed ^ 0x082EFA98EC4E6C89ull} {}

void Checksum64::mix_block(const std::uint8_t* block) {
    // Four independent lanes keep the multiplier pipeline busy.
    for (std::size_t k = 0; k < 4; ++k) {
        std::uint64_t word;
        std::memcpy(&word, block + 8 * k, sizeof(word));
        lane_[k] = (lane_[k] ^ word) * kChecksumMul;
        lane_[k] ^= lane_[k] >> 29;
    }
}

void Checksum64::add(std::span<const std::uint8_t> bytes) {
    if (bytes.empty()) return;  // an empty span may have no data() for memcpy
    total_ += bytes.size();
    std::size_t i = 0;
    if (pending_size_ > 0) {
        const std::size_t take = std::min(kBlock - pending_size_, bytes.size());
        std::memcpy(pending_.data() + pending_size_, bytes.data(), take);
        pending_size_ += take;
        i = take;
        if (pending_size_ < kBlock) return;
        mix_block(pending_.data());
        pending_size_ = 0;
    }
    for (; i + kBlock <= bytes.size(); i += kBlock)
        mix_block(bytes.data() + i);
    pending_size_ = bytes.size() - i;
    std::memcpy(pending_.data(), bytes.data() + i, pending_size_);
}

std::uint64_t Checksum64::value() const {
    std::uint64_t h = total_;
    for (std::uint64_t l : lane_)
        h = (h ^ l) * kChecksumMul + (h >> 31);
    for (std::size_t i = 0; i < pending_size_; ++i)
        h = (h ^ pending_[i]) * kChecksumMul;
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDull;
    return h ^ (h >> 33);
}

std::uint64_t checksum64(std::span<const std::uint8_t> bytes, std::uint64_t seed) {
    Checksum64 sum(seed);
    sum.add(bytes);
    return sum.value();
}

AtomicFileWriter::AtomicFileWriter(std::filesystem::path path)
    : path_(std::move(path)),
      tmp_(path_.string() + ".tmp." + std::to_string(static_cast<long>(::getpid()))) {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd_ < 0) throw InputError("cannot write " + path_.string() + ": " + errno_text());
}

AtomicFileWriter::~AtomicFileWriter() {
    if (fd_ < 0) return;
    ::close(fd_);
    ::unlink(tmp_.c_str());
}

void AtomicFileWriter::fail() {
    const std::string message = "cannot write " + path_.string() + ": " + errno_text();
    ::close(fd_);
    fd_ = -1;
    ::unlink(tmp_.c_str());
    throw InputError(message);
}

void AtomicFileWriter::write(std::span<const std::uint8_t> bytes) {
    std::size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            fail();
        }
        done += static_cast<std::size_t>(n);
    }
}

void AtomicFileWriter::commit() {
    if (::fsync(fd_) != 0) fail();
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) {
        const std::string message = "cannot write " + path_.string() + ": " + errno_text();
        ::unlink(tmp_.c_str());
        throw InputError(message);
    }
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
        const std::string message = "cannot write " + path_.string() + ": " + errno_text();
        ::unlink(tmp_.c_str());
        throw InputError(message);
    }
    fsync_directory(path_.parent_path());
}

void write_file_atomically(const std::filesystem::path& path,
                           std::span<const std::span<const std::uint8_t>> pieces) {
    AtomicFileWriter file(path);
    for (std::span<const std::uint8_t> piece : pieces)
        file.write(piece);
    file.commit();
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

MappedFile::MappedFile(const std::filesystem::path& path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
        throw InputError(path.string() + ": is a directory, expected a file");
    }
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw InputError(path.string() + ": cannot open (" + errno_text() + ")");
    struct stat info {};
    if (::fstat(fd, &info) == 0 && S_ISREG(info.st_mode) && info.st_size > 0) {
        const auto size = static_cast<std::size_t>(info.st_size);
        void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p != MAP_FAILED) {
            ::madvise(p, size, MADV_SEQUENTIAL);  // a hint: read ahead, drop behind
            mapping_ = p;
            bytes_ = std::span(static_cast<const std::uint8_t*>(p), size);
        }
    }
    ::close(fd);
    if (mapping_ == nullptr) {  // not mappable (a pipe, say) or empty: read it
        read_ = read_file_bytes(path);
        bytes_ = read_;
    }
}

MappedFile::~MappedFile() {
    if (mapping_ != nullptr) ::munmap(mapping_, bytes_.size());
}

void MappedFile::release(std::span<const std::uint8_t> piece) const {
    if (mapping_ == nullptr || piece.empty()) return;
    const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    const auto begin = (reinterpret_cast<std::uintptr_t>(piece.data()) + page - 1) / page * page;
    const auto end = (reinterpret_cast<std::uintptr_t>(piece.data()) + piece.size()) / page * page;
    // A private read-only mapping's pages are the file's: dropping them loses nothing.
    if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
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
