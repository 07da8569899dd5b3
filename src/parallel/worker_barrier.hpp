// WorkerBarrier: the workers of one pool meet here between the sections of a backward pass; one
// that fails aborts it, so the others leave with BarrierAborted instead of waiting forever.
#pragma once

#include <atomic>
#include <cstdint>
#include <stdexcept>

namespace gpt2 {

// Thrown in the workers waiting at (or arriving at) an aborted barrier.
class BarrierAborted : public std::runtime_error {
  public:
    BarrierAborted() : std::runtime_error("another worker failed") {}
};

class WorkerBarrier {
  public:
    explicit WorkerBarrier(int count) : count_(count) {}

    // Returns once all `count` workers have arrived: everything each wrote before arriving is
    // visible to all after. Throws BarrierAborted after abort().
    void arrive_and_wait() {
        const std::uint32_t phase = phase_.load(std::memory_order_acquire);
        if (aborted_.load(std::memory_order_acquire)) throw BarrierAborted();
        if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == count_) {
            arrived_.store(0, std::memory_order_relaxed);
            phase_.fetch_add(1, std::memory_order_acq_rel);
            phase_.notify_all();
        } else {
            for (std::uint32_t seen = phase; seen == phase;
                 seen = phase_.load(std::memory_order_acquire)) {
                phase_.wait(seen, std::memory_order_acquire);
            }
        }
        if (aborted_.load(std::memory_order_acquire)) throw BarrierAborted();
    }

    // Releases every waiter with BarrierAborted, now and at later arrivals, until reset().
    void abort() {
        aborted_.store(true, std::memory_order_release);
        phase_.fetch_add(1, std::memory_order_acq_rel);
        phase_.notify_all();
    }

    [[nodiscard]] bool aborted() const { return aborted_.load(std::memory_order_acquire); }

    // Only while no worker is at the barrier (between runs of the pool).
    void reset() {
        arrived_.store(0, std::memory_order_relaxed);
        aborted_.store(false, std::memory_order_release);
    }

  private:
    int count_;
    std::atomic<int> arrived_{0};
    std::atomic<std::uint32_t> phase_{0};
    std::atomic<bool> aborted_{false};
};

}  // namespace gpt2
