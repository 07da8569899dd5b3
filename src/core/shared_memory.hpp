// SharedMapping: memory that several processes on one machine map at once (POSIX shared memory),
// so that ranks on one machine can share one copy of the weights and read each other's gradients.
#pragma once

#include <cstddef>
#include <string>

namespace gpt2 {

class SharedMapping {
  public:
    // Creates the named object (it must not exist) with `bytes` reserved up front, so that a full
    // /dev/shm is an error here and not a SIGBUS later; the memory reads as zeros. Throws
    // std::runtime_error naming the object and the size.
    [[nodiscard]] static SharedMapping create(const std::string& name, std::size_t bytes);
    // Maps an object another process created with the same size.
    [[nodiscard]] static SharedMapping open(const std::string& name, std::size_t bytes);
    // Removes the name (mappings stay valid); no error if it is already gone.
    static void unlink(const std::string& name) noexcept;

    SharedMapping(SharedMapping&& other) noexcept;
    SharedMapping& operator=(SharedMapping&& other) noexcept;
    SharedMapping(const SharedMapping&) = delete;
    SharedMapping& operator=(const SharedMapping&) = delete;
    ~SharedMapping();

    [[nodiscard]] std::byte* data() const { return data_; }
    [[nodiscard]] std::size_t size() const { return size_; }

  private:
    SharedMapping(std::byte* data, std::size_t size) : data_(data), size_(size) {}
    std::byte* data_ = nullptr;
    std::size_t size_ = 0;
};

}  // namespace gpt2
