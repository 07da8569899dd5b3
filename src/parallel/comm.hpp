// Communication between ranks: an RAII MPI session and typed, error-checked broadcast and
// allreduce (chunked, so buffers beyond 2^31 elements work). A world of one needs no mpirun.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/range.hpp"
#include "core/shared_memory.hpp"

namespace gpt2 {

// MPI counts are int: a buffer of `total` elements travels in pieces of at most `max_chunk`
// elements (begin, count), in order. Pure arithmetic, so sizes beyond 2^31 are testable.
struct Chunk {
    std::size_t begin;
    std::size_t count;
};
[[nodiscard]] std::vector<Chunk> chunk_ranges(std::size_t total, std::size_t max_chunk);

// MPI_Init_thread in the constructor, MPI_Finalize in the destructor. It asks for
// MPI_THREAD_SERIALIZED (the overlapped allreduce calls MPI from its own thread while the main
// thread does not) and refuses anything below MPI_THREAD_FUNNELED.
class MpiSession {
  public:
    MpiSession(int* argc, char*** argv);
    ~MpiSession();
    MpiSession(const MpiSession&) = delete;
    MpiSession& operator=(const MpiSession&) = delete;
};

class Communicator {
  public:
    Communicator();  // MPI_COMM_WORLD
    // A world of one that never calls MPI (library users and tests without MPI_Init).
    [[nodiscard]] static Communicator single_process() { return Communicator(0, 1); }
    [[nodiscard]] int rank() const { return rank_; }
    [[nodiscard]] int size() const { return size_; }
    [[nodiscard]] bool is_root() const { return rank_ == 0; }

    void broadcast(std::span<std::uint8_t> data, int root = 0) const;
    void broadcast(std::span<std::int32_t> data, int root = 0) const;
    void broadcast(std::span<float> data, int root = 0) const;
    void broadcast(std::span<std::int64_t> data, int root = 0) const;
    // Broadcasts a byte vector whose size only the root knows.
    void broadcast_vector(std::vector<std::uint8_t>& data, int root = 0) const;
    // In-place elementwise sum across ranks.
    void allreduce_sum(std::span<float> data) const;
    void allreduce_sum(std::span<double> data) const;
    // ZeRO-1: `slices` (one per rank, in order, covering `data`) say which part each rank owns.
    // Sums `data` across ranks into this rank's slice (the rest of `data` is left undefined).
    void reduce_scatter_sum(std::span<float> data, std::span<const Range> slices) const;
    // Every rank's slice of `data` to every rank, in place.
    void allgather_slices(std::span<float> data, std::span<const Range> slices) const;
    // Rank 0's `full` (ignored elsewhere) to each rank's `mine` (its slice's size), and back.
    void scatter_slices(std::span<const float> full, std::span<float> mine,
                        std::span<const Range> slices) const;
    void gather_slices(std::span<const float> mine, std::span<float> full,
                       std::span<const Range> slices) const;
    // Every rank's `mine` (the same size on all), concatenated in rank order into `all`.
    void allgather(std::span<const float> mine, std::span<float> all) const;
    void allgather(std::span<const std::int32_t> mine, std::span<std::int32_t> all) const;
    [[nodiscard]] double allreduce_sum(double value) const;
    [[nodiscard]] std::int64_t allreduce_max(std::int64_t value) const;
    [[nodiscard]] std::int64_t allreduce_min(std::int64_t value) const;
    // Gathers one 64-bit value from every rank on every rank.
    [[nodiscard]] std::vector<std::uint64_t> allgather(std::uint64_t value) const;
    void barrier() const;
    // Gathers every rank's bytes on rank 0 (in rank order; other ranks get an empty result). A
    // world of one returns its own bytes without calling MPI.
    [[nodiscard]] std::vector<std::vector<std::uint8_t>> gather_bytes(
        std::span<const std::uint8_t> mine) const;
    // A barrier that sleeps between polls instead of spinning in MPI, so ranks waiting for others
    // (idle, or done early) leave the shared cores to the ranks still working.
    void idle_barrier() const;

    // Prints "error: message" (with "(rank R of N)" when there are several ranks) to stderr and
    // ends the whole job (every rank) with `code`; a single rank still finalizes MPI.
    [[noreturn]] void abort(std::string_view message, int code = 1) const;

    // Whether MPI may be called from a thread other than the main one (one at a time): what the
    // overlapped allreduce needs. True for a world of one.
    [[nodiscard]] bool serialized_threads() const { return serialized_threads_; }

    // Memory that every rank maps, for a world on one machine (collective): rank 0 creates it in
    // /dev/shm, the others map it, then its name is removed, so nothing is left behind however
    // the job ends. A failure on any rank is every rank's: all get no mapping and the reason.
    struct SharedMemory {
        std::shared_ptr<const SharedMapping> mapping;
        std::string error;
    };
    [[nodiscard]] SharedMemory map_shared(std::size_t bytes) const;

    // Elements per MPI call in broadcasts and allreduces (default 2^30). Tests make it small so
    // that the chunked path runs on small buffers.
    void set_max_chunk_elements(std::size_t elements) { max_chunk_ = elements > 0 ? elements : 1; }

  private:
    friend class BackgroundAllreduce;
    friend struct MachineGroups;
    struct Handle;  // the MPI communicator of a split; none for the world
    Communicator(int rank, int size) : rank_(rank), size_(size) {}
    std::shared_ptr<const Handle> handle_;
    int rank_ = 0;
    int size_ = 1;
    std::size_t max_chunk_ = std::size_t{1} << 30;
    bool serialized_threads_ = true;
};

// How the world's ranks sit on machines (MPI_COMM_TYPE_SHARED): the ranks of this rank's machine,
// ordered by world rank, and `across`, the ranks that have this rank's place on every machine,
// with the machine of world rank 0 first. The world of one is one machine.
struct MachineGroups {
    // Collective over `world`. `simulated_machines` > 0 (tests) cuts the world into that many
    // machines of consecutive ranks instead (it must divide the world).
    MachineGroups(const Communicator& world, int simulated_machines = 0);
    Communicator machine;
    Communicator across;
    int machines = 1;      // how many machines the world spans
    bool uniform = true;   // every machine has the same number of ranks
    bool on_first = true;  // this rank's machine holds world rank 0
};

// Sums pieces of float buffers across ranks on a background thread while the caller computes:
// the overlapped, bucketed gradient allreduce. Each enqueued bucket is one MPI_Iallreduce (a
// bucket of several ranges is packed into a staging buffer and unpacked after); the thread starts
// buckets in the order they were enqueued (the same on every rank) and drives them with
// MPI_Testall every 200 microseconds, sleeping in between, so it takes little CPU from the
// workers. Between the first enqueue and wait() it is the only caller of MPI: the caller must not
// use any communicator meanwhile. Needs comm.serialized_threads().
class BackgroundAllreduce {
  public:
    explicit BackgroundAllreduce(const Communicator& comm);
    ~BackgroundAllreduce();
    BackgroundAllreduce(const BackgroundAllreduce&) = delete;
    BackgroundAllreduce& operator=(const BackgroundAllreduce&) = delete;

    // Queues the in-place sum of base[r.begin, r.end) for every r in `ranges`. For a bucket whose
    // data is not complete yet, the thread polls `ready` (in queue order: later buckets wait
    // behind it) and, once it returns true, runs `prepare` (which completes the data, e.g. sums
    // other ranks' shared buffers into it) before the sum starts; unset, neither waits.
    void enqueue(float* base, std::vector<Range> ranges, std::function<bool()> ready = {},
                 std::function<void()> prepare = {});
    // The communicator the sums run on.
    [[nodiscard]] const Communicator& communicator() const;
    // Returns when every queued sum is done. An MPI failure in the thread ends the whole job
    // (Communicator::abort), as it would in the main thread.
    void wait();

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace gpt2
