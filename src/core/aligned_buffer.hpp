// AlignedBuffer: a fixed-size, zero-initialised array, 64-byte aligned, allocated once and reused.
// Large buffers (parameters, gradients, moments, activations) are mapped straight from the kernel
// on transparent huge pages: nothing is touched at allocation, and first touch costs one fault per
// 2 MiB instead of per 4 KiB (page faults are expensive on virtual machines).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <utility>

namespace gpt2 {

template <typename T>
class AlignedBuffer {
  public:
    static constexpr std::size_t kAlignment = 64;

    AlignedBuffer() = default;
    explicit AlignedBuffer(std::size_t count) : size_(count) {
        if (count == 0) return;
        const std::size_t bytes = count * sizeof(T);
        if (bytes >= kMapThreshold) {
            // Over-map by one huge page so the data can start on a 2 MiB boundary.
            mapped_bytes_ = bytes + kHugePage;
            void* p = ::mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED) throw std::bad_alloc();
            base_ = p;
            const auto aligned =
                (reinterpret_cast<std::uintptr_t>(p) + kHugePage - 1) / kHugePage * kHugePage;
            data_ = reinterpret_cast<T*>(aligned);
            ::madvise(data_, bytes, MADV_HUGEPAGE);  // a hint: fine if unsupported
        } else {
            base_ = std::calloc(bytes + kAlignment, 1);
            if (base_ == nullptr) throw std::bad_alloc();
            const auto address = reinterpret_cast<std::uintptr_t>(base_);
            data_ = reinterpret_cast<T*>((address + kAlignment - 1) / kAlignment * kAlignment);
        }
    }
    // A view of memory another object owns (a shared mapping), which `owner` keeps alive.
    AlignedBuffer(T* data, std::size_t count, std::shared_ptr<const void> owner)
        : data_(data), size_(count), owner_(std::move(owner)) {}
    ~AlignedBuffer() { release(); }

    AlignedBuffer(const AlignedBuffer&) = delete;
    AlignedBuffer& operator=(const AlignedBuffer&) = delete;
    AlignedBuffer(AlignedBuffer&& other) noexcept { take(other); }
    AlignedBuffer& operator=(AlignedBuffer&& other) noexcept {
        if (this != &other) {
            release();
            take(other);
        }
        return *this;
    }

    [[nodiscard]] T* data() { return data_; }
    [[nodiscard]] const T* data() const { return data_; }
    [[nodiscard]] std::size_t size() const { return size_; }
    [[nodiscard]] std::span<T> span() { return {data_, size_}; }
    [[nodiscard]] std::span<const T> span() const { return {data_, size_}; }
    [[nodiscard]] T& operator[](std::size_t i) { return data_[i]; }
    [[nodiscard]] const T& operator[](std::size_t i) const { return data_[i]; }
    void fill_zero() {
        if (size_ != 0) std::memset(data_, 0, size_ * sizeof(T));
    }
    // Hands the whole memory pages inside elements [first, first + count) back to the kernel
    // (madvise MADV_DONTNEED): the resident memory drops and the elements read as zero afterwards.
    // The partial pages at either end keep their values. A view of another object's memory keeps
    // everything. Returns the bytes handed back.
    std::size_t discard(std::size_t first, std::size_t count) noexcept {
        if (base_ == nullptr || count == 0 || first >= size_) return 0;
        count = std::min(count, size_ - first);
        const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
        const auto begin = reinterpret_cast<std::uintptr_t>(data_ + first);
        const auto end = reinterpret_cast<std::uintptr_t>(data_ + first + count);
        const std::uintptr_t lo = (begin + page - 1) / page * page;
        const std::uintptr_t hi = end / page * page;
        if (hi <= lo) return 0;
        if (::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED) != 0) return 0;
        return hi - lo;
    }

  private:
    static constexpr std::size_t kHugePage = std::size_t{2} << 20;
    static constexpr std::size_t kMapThreshold = std::size_t{4} << 20;

    void release() noexcept {
        owner_.reset();
        if (base_ == nullptr) return;
        if (mapped_bytes_ != 0) {
            ::munmap(base_, mapped_bytes_);
        } else {
            std::free(base_);
        }
        base_ = nullptr;
    }
    void take(AlignedBuffer& other) noexcept {
        base_ = std::exchange(other.base_, nullptr);
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
        mapped_bytes_ = std::exchange(other.mapped_bytes_, 0);
        owner_ = std::move(other.owner_);
    }

    void* base_ = nullptr;
    T* data_ = nullptr;
    std::size_t size_ = 0;
    std::size_t mapped_bytes_ = 0;       // non-zero: base_ came from mmap
    std::shared_ptr<const void> owner_;  // set: a view, base_ is null
};

}  // namespace gpt2
