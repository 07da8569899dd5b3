// ThreadPool: a fixed set of worker threads created once and reused every step. run() hands each
// worker one coarse task (its worker index); the calling thread is worker 0 (the one that may call
// MPI: the communicator lives on the main thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

#include "core/range.hpp"

namespace gpt2 {

class ThreadPool {
  public:
    // pin: bind worker i to the i-th CPU of the process's affinity mask, one CPU of every core
    // first (cores_first).
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

}  // namespace gpt2
