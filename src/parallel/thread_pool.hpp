// ThreadPool: a fixed set of worker threads created once and reused every step. run() hands each
// worker one coarse task (its worker index); the calling thread is worker 0, so MPI stays on the
// main thread (MPI_THREAD_FUNNELED).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace gpt2 {

// CPUs this process may run on (sched_getaffinity): under mpirun --bind-to core that is 1.
[[nodiscard]] int available_cpus();

class ThreadPool {
  public:
    // pin: bind worker i to the i-th CPU of the process's affinity mask.
    explicit ThreadPool(int num_workers, bool pin = false);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    [[nodiscard]] int size() const { return num_workers_; }

    // Calls task(w) for w = 0..size()-1, each on its own worker, and returns when all are done.
    // An exception thrown by a task is rethrown here (the first, by worker index).
    template <typename Task>
    void run(Task&& task) {
        run_erased([](void* ctx,
                      int worker) { (*static_cast<std::remove_reference_t<Task>*>(ctx))(worker); },
                   &task);
    }

  private:
    using TaskFn = void (*)(void*, int);
    void run_erased(TaskFn fn, void* ctx);
    void worker_loop(int worker);
    void stop_and_join();
    void execute(int worker);

    int num_workers_;
    std::vector<std::thread> threads_;
    std::vector<std::exception_ptr> errors_;
    TaskFn task_fn_ = nullptr;
    void* task_ctx_ = nullptr;
    std::atomic<std::uint64_t> generation_{0};
    std::atomic<int> pending_{0};
    std::atomic<bool> stopping_{false};
};

// A contiguous, near-equal share [begin, end) of n items for worker w of W.
struct Range {
    std::size_t begin;
    std::size_t end;
};
[[nodiscard]] inline Range split_range(std::size_t n, int w, int W) {
    const std::size_t base = n / static_cast<std::size_t>(W);
    const std::size_t extra = n % static_cast<std::size_t>(W);
    const auto uw = static_cast<std::size_t>(w);
    const std::size_t begin = uw * base + std::min(uw, extra);
    return Range{begin, begin + base + (uw < extra ? 1 : 0)};
}

}  // namespace gpt2
