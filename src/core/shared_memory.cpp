#include "core/shared_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace gpt2 {
namespace {

[[noreturn]] void fail(const std::string& what, const std::string& name, std::size_t bytes,
                       int error) {
    throw std::runtime_error(what + " shared memory " + name + " (" + std::to_string(bytes >> 20) +
                             " MiB in /dev/shm): " + std::strerror(error));
}

std::byte* map(int fd, const std::string& name, std::size_t bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int error = errno;
    ::close(fd);
    if (p == MAP_FAILED) fail("cannot map", name, bytes, error);
    return static_cast<std::byte*>(p);
}

}  // namespace

SharedMapping SharedMapping::create(const std::string& name, std::size_t bytes) {
    const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) fail("cannot create", name, bytes, errno);
    // posix_fallocate reserves the pages of the tmpfs now (returns the error, not errno).
    const int reserved = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (reserved != 0) {
        ::close(fd);
        unlink(name);
        fail("cannot reserve", name, bytes, reserved);
    }
    try {
        return SharedMapping(map(fd, name, bytes), bytes);
    } catch (...) {
        unlink(name);  // reserved but not mapped: the memory must not outlive this process
        throw;
    }
}

SharedMapping SharedMapping::open(const std::string& name, std::size_t bytes) {
    const int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
    if (fd < 0) fail("cannot open", name, bytes, errno);
    struct stat info {};
    if (::fstat(fd, &info) != 0 || static_cast<std::size_t>(info.st_size) != bytes) {
        ::close(fd);
        fail("wrong size of", name, bytes, EINVAL);
    }
    return SharedMapping(map(fd, name, bytes), bytes);
}

void SharedMapping::unlink(const std::string& name) noexcept {
    ::shm_unlink(name.c_str());
}

SharedMapping::SharedMapping(SharedMapping&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

SharedMapping& SharedMapping::operator=(SharedMapping&& other) noexcept {
    if (this != &other) {
        if (data_ != nullptr) ::munmap(data_, size_);
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
    }
    return *this;
}

SharedMapping::~SharedMapping() {
    if (data_ != nullptr) ::munmap(data_, size_);
}

}  // namespace gpt2
