// AlignedBuffer: a fixed-size, 64-byte-aligned, zero-initialised array, allocated once and reused
// (cache-line alignment keeps SIMD loads whole and stops neighbouring workers sharing lines).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <span>

namespace gpt2 {

template <typename T>
class AlignedBuffer {
  public:
    static constexpr std::size_t kAlignment = 64;

    AlignedBuffer() = default;
    explicit AlignedBuffer(std::size_t count) : size_(count) {
        if (count == 0) return;
        const std::size_t bytes = (count * sizeof(T) + kAlignment - 1) / kAlignment * kAlignment;
        void* raw = std::aligned_alloc(kAlignment, bytes);
        if (raw == nullptr) throw std::bad_alloc();
        std::memset(raw, 0, bytes);
        data_.reset(static_cast<T*>(raw));
    }

    [[nodiscard]] T* data() { return data_.get(); }
    [[nodiscard]] const T* data() const { return data_.get(); }
    [[nodiscard]] std::size_t size() const { return size_; }
    [[nodiscard]] std::span<T> span() { return {data_.get(), size_}; }
    [[nodiscard]] std::span<const T> span() const { return {data_.get(), size_}; }
    [[nodiscard]] T& operator[](std::size_t i) { return data_[i]; }
    [[nodiscard]] const T& operator[](std::size_t i) const { return data_[i]; }
    void fill_zero() {
        if (size_ != 0) std::memset(data_.get(), 0, size_ * sizeof(T));
    }

  private:
    struct FreeDeleter {
        void operator()(T* p) const { std::free(p); }
    };
    std::unique_ptr<T[], FreeDeleter> data_;
    std::size_t size_ = 0;
};

}  // namespace gpt2
