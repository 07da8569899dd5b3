#include "gpt2/thread_pool.hpp"

#include <pthread.h>
#include <sched.h>

#include <stdexcept>
#include <string>

namespace gpt2 {

namespace {
std::vector<int> affinity_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    std::vector<int> cpus;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
            if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
        }
    }
    return cpus;
}

void pin_to_cpu(pthread_t thread, int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(thread, sizeof(set), &set);
}
}  // namespace

int available_cpus() {
    const auto cpus = affinity_cpus();
    return cpus.empty() ? 1 : static_cast<int>(cpus.size());
}

ThreadPool::ThreadPool(int num_workers, bool pin)
    : num_workers_(num_workers), errors_(static_cast<std::size_t>(num_workers)) {
    if (num_workers < 1) throw std::invalid_argument("ThreadPool: need at least one worker");
    const std::vector<int> cpus = pin ? affinity_cpus() : std::vector<int>{};
    if (pin && !cpus.empty()) pin_to_cpu(pthread_self(), cpus[0]);
    threads_.reserve(static_cast<std::size_t>(num_workers - 1));
    for (int w = 1; w < num_workers; ++w) {
        threads_.emplace_back([this, w] { worker_loop(w); });
        if (pin && !cpus.empty()) {
            pin_to_cpu(threads_.back().native_handle(),
                       cpus[static_cast<std::size_t>(w) % cpus.size()]);
        }
    }
}

ThreadPool::~ThreadPool() {
    stopping_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
    generation_.notify_all();
    for (auto& t : threads_)
        t.join();
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
