// WorkerBarrier: the workers of one pool meet here between phases (the sections of a backward
// pass, the phases of one decoded token); one that fails aborts it, so the others leave with
// BarrierAborted instead of waiting forever. Waiters may spin briefly before they sleep.
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
    // spins: how many times a waiter polls (with a pause) before it sleeps on the phase. Worth it
    // where phases take tens of microseconds and workers arrive close together (decoding one
    // token): the spin usually avoids a futex round trip, far longer under load.
    explicit WorkerBarrier(int count, int spins = 0) : count_(count), spins_(spins) {}

    // Returns once all `count` workers have arrived: everything each wrote before arriving is
    // visible to all after. Throws BarrierAborted after abort().
    void arrive_and_wait() {
        if (count_ == 1) {  // nobody to wait for (decoding a small model on one worker)
            if (aborted_.load(std::memory_order_acquire)) throw BarrierAborted();
            return;
        }
        const std::uint32_t phase = phase_.load(std::memory_order_acquire);
        if (aborted_.load(std::memory_order_acquire)) throw BarrierAborted();
        if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == count_) {
            arrived_.store(0, std::memory_order_relaxed);
            phase_.fetch_add(1, std::memory_order_acq_rel);
            phase_.notify_all();
        } else {
            for (int spin = 0; spin < spins_ && phase_.load(std::memory_order_acquire) == phase;
                 ++spin) {
                cpu_relax();
            }
            for (std::uint32_t seen = phase_.load(std::memory_order_acquire); seen == phase;
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
    static void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    int count_;
    int spins_;
    std::atomic<int> arrived_{0};
    std::atomic<std::uint32_t> phase_{0};
    std::atomic<bool> aborted_{false};
};

}  // namespace gpt2
