#include "threads/thread_pool.hpp"

#include <pthread.h>
#include <sched.h>

#include <stdexcept>
#include <string>
#include <system_error>

#include "threads/cpu_topology.hpp"

namespace gpt2 {

namespace {
void pin_to_cpu(pthread_t thread, int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(thread, sizeof(set), &set);
}

// Checked before any member is sized from it.
int checked_worker_count(int num_workers) {
    if (num_workers < 1) {
        throw std::invalid_argument("ThreadPool: need at least one worker, got " +
                                    std::to_string(num_workers));
    }
    return num_workers;
}
}  // namespace

ThreadPool::ThreadPool(int num_workers, bool pin)
    : num_workers_(checked_worker_count(num_workers)),
      errors_(static_cast<std::size_t>(num_workers)) {
    // One CPU of every core before any core's second hardware thread.
    const std::vector<int> cpus = pin ? cores_first(affinity_cpus()).cpus : std::vector<int>{};
    if (pin && !cpus.empty()) pin_to_cpu(pthread_self(), cpus[0]);
    threads_.reserve(static_cast<std::size_t>(num_workers - 1));
    try {
        for (int w = 1; w < num_workers; ++w) {
            threads_.emplace_back([this, w] { worker_loop(w); });
            if (pin && !cpus.empty()) {
                pin_to_cpu(threads_.back().native_handle(),
                           cpus[static_cast<std::size_t>(w) % cpus.size()]);
            }
        }
    } catch (const std::system_error& e) {
        // The destructor does not run for a half-built pool: stop and join the threads that did
        // start, or their std::thread objects would end the process (std::terminate).
        stop_and_join();
        throw std::runtime_error("cannot start worker thread " +
                                 std::to_string(threads_.size() + 1) + " of " +
                                 std::to_string(num_workers) + ": " + e.what());
    }
}

ThreadPool::~ThreadPool() {
    stop_and_join();
}

void ThreadPool::stop_and_join() {
    stopping_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
    generation_.notify_all();
    for (auto& t : threads_)
        t.join();
    threads_.clear();
}

void ThreadPool::execute(int worker) {
    try {
        task_fn_(task_ctx_, worker);
    } catch (...) {
        errors_[static_cast<std::size_t>(worker)] = std::current_exception();
    }
}

void ThreadPool::worker_loop(int worker) {
    std::uint64_t seen = 0;
    for (;;) {
        generation_.wait(seen, std::memory_order_acquire);
        seen = generation_.load(std::memory_order_acquire);
        if (stopping_.load(std::memory_order_acquire)) return;
        execute(worker);
        if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
}

void ThreadPool::run_erased(TaskFn fn, void* ctx) {
    task_fn_ = fn;
    task_ctx_ = ctx;
    pending_.store(num_workers_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_acq_rel);
    generation_.notify_all();
    execute(0);
    for (int left = pending_.load(std::memory_order_acquire); left != 0;
         left = pending_.load(std::memory_order_acquire)) {
        pending_.wait(left, std::memory_order_acquire);
    }
    for (auto& error : errors_) {
        if (error) {
            const std::exception_ptr first = error;
            for (auto& e : errors_)
                e = nullptr;
            std::rethrow_exception(first);
        }
    }
}

}  // namespace gpt2
