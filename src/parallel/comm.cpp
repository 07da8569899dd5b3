#include "parallel/comm.hpp"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

namespace gpt2 {

std::vector<Chunk> chunk_ranges(std::size_t total, std::size_t max_chunk) {
    max_chunk = std::min<std::size_t>(std::max<std::size_t>(max_chunk, 1), INT_MAX);
    std::vector<Chunk> chunks;
    for (std::size_t begin = 0; begin < total; begin += max_chunk)
        chunks.push_back(Chunk{begin, std::min(max_chunk, total - begin)});
    return chunks;
}

namespace {

void check(int code, const char* what) {
    if (code != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING];
        int length = 0;
        MPI_Error_string(code, text, &length);
        throw std::runtime_error(std::string(what) + " failed: " + std::string(text, length));
    }
}

template <typename T>
void broadcast_chunked(std::span<T> data, MPI_Datatype type, int root, std::size_t max_chunk,
                       MPI_Comm comm) {
    for (const Chunk& c : chunk_ranges(data.size(), max_chunk)) {
        check(MPI_Bcast(data.data() + c.begin, static_cast<int>(c.count), type, root, comm),
              "MPI_Bcast");
    }
}

template <typename T>
void allreduce_sum_chunked(std::span<T> data, MPI_Datatype type, std::size_t max_chunk,
                           MPI_Comm comm) {
    for (const Chunk& c : chunk_ranges(data.size(), max_chunk)) {
        check(MPI_Allreduce(MPI_IN_PLACE, data.data() + c.begin, static_cast<int>(c.count), type,
                            MPI_SUM, comm),
              "MPI_Allreduce");
    }
}

// The MPI communicator behind a Communicator's handle: its split, or the world.
template <typename Handle>
MPI_Comm comm_of(const std::shared_ptr<const Handle>& handle) {
    return handle ? handle->comm : MPI_COMM_WORLD;
}
}  // namespace

// GCC says __SANITIZE_ADDRESS__, clang (dev/sanitizers.sh's ASan build) __has_feature.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GPT2_ADDRESS_SANITIZER 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(GPT2_ADDRESS_SANITIZER)
// Under AddressSanitizer (dev/sanitizers.sh): Open MPI keeps allocations in its plugins until
// exit, and LeakSanitizer can attribute them to Open MPI (tests/lsan.supp) only when it records
// every allocation's full stack, which makes allocation several times slower. Only the processes
// that can start MPI (those that link this file) record full stacks; the environment still wins.
extern "C" const char* __asan_default_options() {
    return "fast_unwind_on_malloc=0";
}
extern "C" const char* __lsan_default_options() {
    return "fast_unwind_on_malloc=0";
}
#endif

MpiSession::MpiSession(int* argc, char*** argv) {
    // Open MPI's non-blocking allreduce (libnbc) picks a binomial tree (reduce, then broadcast)
    // for few ranks, which halves the bandwidth of the overlapped buckets against the blocking
    // allreduce's ring; ask for the ring unless the user chose (measured: docs/performance.md).
    ::setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
    int provided = 0;
    check(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    // Worker threads never call MPI, but the main thread calls it while they exist: FUNNELED is
    // the least this needs. An MPI that cannot promise it is refused rather than trusted.
    if (provided < MPI_THREAD_FUNNELED) {
        MPI_Finalize();
        throw std::runtime_error(
            "MPI_Init_thread: this MPI provides thread level " + std::to_string(provided) +
            ", below MPI_THREAD_FUNNELED; rebuild Open MPI with thread support");
    }
    // Errors come back as codes so that they can be reported with a clear message.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

MpiSession::~MpiSession() {
    MPI_Finalize();
}

Communicator::Communicator() {
    check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
    int level = 0;
    check(MPI_Query_thread(&level), "MPI_Query_thread");
    serialized_threads_ = level >= MPI_THREAD_SERIALIZED;
}

void Communicator::broadcast(std::span<std::uint8_t> data, int root) const {
    if (size_ > 1) broadcast_chunked(data, MPI_UINT8_T, root, max_chunk_, comm_of(handle_));
}
void Communicator::broadcast(std::span<std::int32_t> data, int root) const {
    if (size_ > 1) broadcast_chunked(data, MPI_INT32_T, root, max_chunk_, comm_of(handle_));
}
void Communicator::broadcast(std::span<float> data, int root) const {
    if (size_ > 1) broadcast_chunked(data, MPI_FLOAT, root, max_chunk_, comm_of(handle_));
}
void Communicator::broadcast(std::span<std::int64_t> data, int root) const {
    if (size_ > 1) broadcast_chunked(data, MPI_INT64_T, root, max_chunk_, comm_of(handle_));
}

void Communicator::broadcast_vector(std::vector<std::uint8_t>& data, int root) const {
    if (size_ == 1) return;
    std::uint64_t size = data.size();
    check(MPI_Bcast(&size, 1, MPI_UINT64_T, root, comm_of(handle_)), "MPI_Bcast");
    data.resize(size);
    broadcast(std::span<std::uint8_t>(data), root);
}

void Communicator::allreduce_sum(std::span<float> data) const {
    if (size_ > 1) allreduce_sum_chunked(data, MPI_FLOAT, max_chunk_, comm_of(handle_));
}
void Communicator::allreduce_sum(std::span<double> data) const {
    if (size_ > 1) allreduce_sum_chunked(data, MPI_DOUBLE, max_chunk_, comm_of(handle_));
}

struct Communicator::Handle {
    MPI_Comm comm = MPI_COMM_NULL;
    explicit Handle(MPI_Comm c) : comm(c) {}
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    ~Handle() {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Comm_free(&comm);
    }
};

MachineGroups::MachineGroups(const Communicator& world, int simulated_machines)
    : machine(Communicator::single_process()), across(Communicator::single_process()) {
    if (world.size() == 1) return;
    if (simulated_machines > 0 && world.size() % simulated_machines != 0) {
        throw std::invalid_argument("simulated machines must divide the ranks");
    }
    const MPI_Comm parent = comm_of(world.handle_);
    // A split of the world as a Communicator that owns it.
    const auto wrap = [&](MPI_Comm split) {
        Communicator c(0, 1);
        c.handle_ = std::make_shared<const Communicator::Handle>(split);
        check(MPI_Comm_rank(split, &c.rank_), "MPI_Comm_rank");
        check(MPI_Comm_size(split, &c.size_), "MPI_Comm_size");
        c.max_chunk_ = world.max_chunk_;
        c.serialized_threads_ = world.serialized_threads_;
        return c;
    };
    MPI_Comm local = MPI_COMM_NULL;
    if (simulated_machines > 0) {
        check(MPI_Comm_split(parent, world.rank() / (world.size() / simulated_machines),
                             world.rank(), &local),
              "MPI_Comm_split");
    } else {
        check(
            MPI_Comm_split_type(parent, MPI_COMM_TYPE_SHARED, world.rank(), MPI_INFO_NULL, &local),
            "MPI_Comm_split_type");
    }
    machine = wrap(local);
    // Ranks are ordered by world rank within a machine, so world rank 0 is its machine's first.
    std::int32_t first_world_rank = world.rank();
    machine.broadcast(std::span<std::int32_t>(&first_world_rank, 1));
    on_first = first_world_rank == 0;
    MPI_Comm same_place = MPI_COMM_NULL;
    check(MPI_Comm_split(parent, machine.rank(),
                         on_first ? world.rank() : world.size() + world.rank(), &same_place),
          "MPI_Comm_split");
    across = wrap(same_place);
    machines = static_cast<int>(world.allreduce_sum(machine.rank() == 0 ? 1.0 : 0.0));
    uniform = world.allreduce_max(machine.size()) == world.allreduce_min(machine.size());
}

Communicator::SharedMemory Communicator::map_shared(std::size_t bytes) const {
    SharedMemory result;
    std::string name;
    if (is_root()) {
        try {
            std::random_device entropy;
            name = "/gpt2-mpi-" + std::to_string(::getpid()) + "-" + std::to_string(entropy());
            result.mapping =
                std::make_shared<const SharedMapping>(SharedMapping::create(name, bytes));
        } catch (const std::exception& e) {
            result.error = e.what();
        }
    }
    // Rank 0's outcome: the name, or its error after a leading 0 byte.
    std::vector<std::uint8_t> message;
    if (is_root()) {
        const std::string text = result.error.empty() ? name : std::string(1, '\0') + result.error;
        message.assign(text.begin(), text.end());
    }
    broadcast_vector(message);
    if (!is_root()) {
        const std::string text(message.begin(), message.end());
        if (!text.empty() && text[0] == '\0') {
            result.error = text.substr(1);
            return result;
        }
        try {
            result.mapping =
                std::make_shared<const SharedMapping>(SharedMapping::open(text, bytes));
        } catch (const std::exception& e) {
            result.error = e.what();
        }
    } else if (!result.error.empty()) {
        return result;
    }
    // Every rank has mapped it (or failed) before the name goes.
    const bool failed_anywhere = allreduce_max(result.error.empty() ? 0 : 1) != 0;
    if (is_root()) SharedMapping::unlink(name);
    if (failed_anywhere) {
        result.mapping.reset();
        if (result.error.empty()) result.error = "another rank could not map the shared memory";
    }
    return result;
}

namespace {
template <typename T>
void allgather_equal(std::span<const T> mine, std::span<T> all, MPI_Datatype type, int world,
                     MPI_Comm comm) {
    if (all.size() != mine.size() * static_cast<std::size_t>(world) || mine.size() > INT_MAX) {
        throw std::invalid_argument("allgather: buffer sizes do not match the world");
    }
    if (world == 1) {
        std::copy(mine.begin(), mine.end(), all.begin());
        return;
    }
    check(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), type, all.data(),
                        static_cast<int>(mine.size()), type, comm),
          "MPI_Allgather");
}
}  // namespace

void Communicator::allgather(std::span<const float> mine, std::span<float> all) const {
    allgather_equal(mine, all, MPI_FLOAT, size_, comm_of(handle_));
}

void Communicator::allgather(std::span<const std::int32_t> mine,
                             std::span<std::int32_t> all) const {
    allgather_equal(mine, all, MPI_INT32_T, size_, comm_of(handle_));
}

namespace {
// MPI's int counts and displacements of the shards (checked: each must fit).
struct SliceCounts {
    std::vector<int> counts, displacements;
};
SliceCounts slice_counts(std::span<const Range> slices, int world) {
    if (slices.size() != static_cast<std::size_t>(world)) {
        throw std::invalid_argument("ZeRO slices: one per rank is needed");
    }
    SliceCounts c;
    for (const Range& r : slices) {
        if (r.end < r.begin || r.end > static_cast<std::size_t>(INT_MAX)) {
            throw std::invalid_argument("ZeRO slices: beyond 2^31 elements");
        }
        c.counts.push_back(static_cast<int>(r.end - r.begin));
        c.displacements.push_back(static_cast<int>(r.begin));
    }
    return c;
}
}  // namespace

void Communicator::reduce_scatter_sum(std::span<float> data, std::span<const Range> slices) const {
    if (size_ == 1) return;
    const SliceCounts c = slice_counts(slices, size_);
    // In place, MPI leaves the rank's sum at the start of the buffer: move it to the slice.
    check(MPI_Reduce_scatter(MPI_IN_PLACE, data.data(), c.counts.data(), MPI_FLOAT, MPI_SUM,
                             comm_of(handle_)),
          "MPI_Reduce_scatter");
    const Range mine = slices[static_cast<std::size_t>(rank_)];
    std::memmove(data.data() + mine.begin, data.data(), (mine.end - mine.begin) * sizeof(float));
}

void Communicator::allgather_slices(std::span<float> data, std::span<const Range> slices) const {
    if (size_ == 1) return;
    const SliceCounts c = slice_counts(slices, size_);
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data.data(), c.counts.data(),
                         c.displacements.data(), MPI_FLOAT, comm_of(handle_)),
          "MPI_Allgatherv");
}

void Communicator::scatter_slices(std::span<const float> full, std::span<float> mine,
                                  std::span<const Range> slices) const {
    if (size_ == 1) {
        std::copy(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(mine.size()),
                  mine.begin());
        return;
    }
    const SliceCounts c = slice_counts(slices, size_);
    check(MPI_Scatterv(full.data(), c.counts.data(), c.displacements.data(), MPI_FLOAT, mine.data(),
                       static_cast<int>(mine.size()), MPI_FLOAT, 0, comm_of(handle_)),
          "MPI_Scatterv");
}

void Communicator::gather_slices(std::span<const float> mine, std::span<float> full,
                                 std::span<const Range> slices) const {
    if (size_ == 1) {
        std::copy(mine.begin(), mine.end(), full.begin());
        return;
    }
    const SliceCounts c = slice_counts(slices, size_);
    check(MPI_Gatherv(mine.data(), static_cast<int>(mine.size()), MPI_FLOAT, full.data(),
                      c.counts.data(), c.displacements.data(), MPI_FLOAT, 0, comm_of(handle_)),
          "MPI_Gatherv");
}

double Communicator::allreduce_sum(double value) const {
    if (size_ == 1) return value;
    check(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_SUM, comm_of(handle_)),
          "MPI_Allreduce");
    return value;
}

std::int64_t Communicator::allreduce_max(std::int64_t value) const {
    if (size_ == 1) return value;
    check(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_INT64_T, MPI_MAX, comm_of(handle_)),
          "MPI_Allreduce");
    return value;
}

std::int64_t Communicator::allreduce_min(std::int64_t value) const {
    if (size_ == 1) return value;
    check(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_INT64_T, MPI_MIN, comm_of(handle_)),
          "MPI_Allreduce");
    return value;
}

std::vector<std::uint64_t> Communicator::allgather(std::uint64_t value) const {
    std::vector<std::uint64_t> all(static_cast<std::size_t>(size_), value);
    if (size_ > 1) {
        check(MPI_Allgather(&value, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, comm_of(handle_)),
              "MPI_Allgather");
    }
    return all;
}

void Communicator::barrier() const {
    if (size_ > 1) check(MPI_Barrier(comm_of(handle_)), "MPI_Barrier");
}

std::vector<std::vector<std::uint8_t>> Communicator::gather_bytes(
    std::span<const std::uint8_t> mine) const {
    if (size_ == 1) return {std::vector<std::uint8_t>(mine.begin(), mine.end())};
    const std::vector<std::uint64_t> sizes = allgather(mine.size());
    std::vector<int> counts(sizes.size()), displs(sizes.size());
    std::uint64_t total = 0;
    for (std::size_t r = 0; r < sizes.size(); ++r) {
        if (sizes[r] > INT_MAX || total + sizes[r] > INT_MAX) {
            throw std::runtime_error("gather_bytes: more than 2 GiB of output to gather");
        }
        counts[r] = static_cast<int>(sizes[r]);
        displs[r] = static_cast<int>(total);
        total += sizes[r];
    }
    std::vector<std::uint8_t> all(is_root() ? total : 0);
    check(MPI_Gatherv(mine.data(), static_cast<int>(mine.size()), MPI_UINT8_T, all.data(),
                      counts.data(), displs.data(), MPI_UINT8_T, 0, comm_of(handle_)),
          "MPI_Gatherv");
    std::vector<std::vector<std::uint8_t>> out;
    if (!is_root()) return out;
    out.reserve(sizes.size());
    for (std::size_t r = 0; r < sizes.size(); ++r) {
        const auto begin = all.begin() + displs[r];
        out.emplace_back(begin, begin + counts[r]);
    }
    return out;
}

void Communicator::idle_barrier() const {
    if (size_ == 1) return;
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ibarrier(comm_of(handle_), &request), "MPI_Ibarrier");
    for (int done = 0; done == 0;) {
        check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
        if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
}

void Communicator::abort(std::string_view message, int code) const {
    // The rank is only worth naming when there is more than one.
    if (size_ > 1) {
        std::fprintf(stderr, "error (rank %d of %d): %.*s\n", rank_, size_,
                     static_cast<int>(message.size()), message.data());
    } else {
        std::fprintf(stderr, "error: %.*s\n", static_cast<int>(message.size()), message.data());
    }
    std::fflush(stderr);
    if (size_ > 1) MPI_Abort(MPI_COMM_WORLD, code);
    // One rank: end MPI properly, as a normal exit would (MpiSession's destructor does not run).
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Finalize();
    std::exit(code);
}

// ---- BackgroundAllreduce --------------------------------------------------------------------

// How often the communication thread drives MPI while buckets are in flight: often enough for
// TCP to keep a 10 Gbit/s link busy, rarely enough to leave the cores to the workers (of the
// intervals measured, this one slowed backward least: docs/performance.md).
constexpr std::chrono::microseconds kPollInterval{200};

struct BackgroundAllreduce::Impl {
    struct Bucket {
        float* base;
        std::vector<Range> ranges;
        std::function<bool()> ready;    // null: ready now
        std::function<void()> prepare;  // null: nothing to do before the sum
    };
    // One bucket in flight: its requests (one per chunk of at most 2^30 floats) and, for a bucket
    // of several ranges, the staging buffer it travels in.
    struct InFlight {
        Bucket bucket;
        std::vector<float> staging;
        std::vector<MPI_Request> requests;
    };

    explicit Impl(const Communicator& c) : comm(c) {
        if (!comm.serialized_threads()) {
            throw std::runtime_error(
                "the overlapped allreduce needs MPI_THREAD_SERIALIZED, which this MPI does not "
                "provide: use --bucket-mb 0");
        }
        thread = std::thread([this] { loop(); });
    }
    ~Impl() {
        {
            const std::lock_guard lock(mutex);
            stopping = true;
        }
        wake.notify_all();
        thread.join();
    }

    InFlight start(Bucket bucket) {
        InFlight f{std::move(bucket), {}, {}};
        float* data = nullptr;
        std::size_t count = 0;
        if (f.bucket.ranges.size() == 1) {
            data = f.bucket.base + f.bucket.ranges[0].begin;
            count = f.bucket.ranges[0].end - f.bucket.ranges[0].begin;
        } else {
            // Staging buffers are reused from bucket to bucket and step to step.
            if (!spare_staging.empty()) {
                f.staging = std::move(spare_staging.back());
                spare_staging.pop_back();
                f.staging.clear();
            }
            for (const Range& r : f.bucket.ranges)
                f.staging.insert(f.staging.end(), f.bucket.base + r.begin, f.bucket.base + r.end);
            data = f.staging.data();
            count = f.staging.size();
        }
        for (const Chunk& c : chunk_ranges(count, std::size_t{1} << 30)) {
            MPI_Request request = MPI_REQUEST_NULL;
            check(MPI_Iallreduce(MPI_IN_PLACE, data + c.begin, static_cast<int>(c.count), MPI_FLOAT,
                                 MPI_SUM, comm_of(comm.handle_), &request),
                  "MPI_Iallreduce");
            f.requests.push_back(request);
        }
        return f;
    }

    void finish(InFlight& f) {
        if (f.staging.empty()) return;
        const float* from = f.staging.data();
        for (const Range& r : f.bucket.ranges) {
            std::copy(from, from + (r.end - r.begin), f.bucket.base + r.begin);
            from += r.end - r.begin;
        }
        spare_staging.push_back(std::move(f.staging));
    }

    void loop() {
        std::vector<InFlight> in_flight;
        std::deque<Bucket> waiting;  // taken from the queue, not ready yet (in order)
        for (;;) {
            {
                std::unique_lock lock(mutex);
                if (in_flight.empty() && waiting.empty()) {
                    wake.wait(lock, [&] { return stopping || !queue.empty(); });
                    if (queue.empty()) return;  // stopping with nothing left
                }
                for (Bucket& b : queue)
                    waiting.push_back(std::move(b));
                queue.clear();
            }
            std::size_t finished = 0;
            try {
                // Buckets start in queue order, each once it is ready.
                while (!waiting.empty() && (!waiting.front().ready || waiting.front().ready())) {
                    Bucket b = std::move(waiting.front());
                    waiting.pop_front();
                    if (b.prepare) b.prepare();
                    in_flight.push_back(start(std::move(b)));
                }
                // Progress: test everything in flight, then sleep briefly (MPI over TCP only
                // moves data inside MPI calls).
                for (auto it = in_flight.begin(); it != in_flight.end();) {
                    int done = 0;
                    check(MPI_Testall(static_cast<int>(it->requests.size()), it->requests.data(),
                                      &done, MPI_STATUSES_IGNORE),
                          "MPI_Testall");
                    if (done == 0) break;  // buckets complete in order
                    finish(*it);
                    it = in_flight.erase(it);
                    ++finished;
                }
            } catch (const std::exception& e) {
                // The step cannot go on without this sum, and no rank may wait for it forever:
                // end the whole job (MPI_Abort), as every other MPI failure does.
                comm.abort(std::string("gradient allreduce: ") + e.what());
            }
            if (finished > 0) {
                const std::lock_guard lock(mutex);
                completed += finished;
                idle.notify_all();
            }
            if (!in_flight.empty() || !waiting.empty()) std::this_thread::sleep_for(kPollInterval);
        }
    }

    const Communicator& comm;
    std::mutex mutex;
    std::condition_variable wake;  // work queued, or stopping
    std::condition_variable idle;  // buckets completed
    std::vector<Bucket> queue;
    std::size_t enqueued = 0;
    std::size_t completed = 0;
    bool stopping = false;
    std::vector<std::vector<float>> spare_staging;  // the thread's own, no lock
    std::thread thread;
};

BackgroundAllreduce::BackgroundAllreduce(const Communicator& comm)
    : impl_(std::make_unique<Impl>(comm)) {}

BackgroundAllreduce::~BackgroundAllreduce() = default;

void BackgroundAllreduce::enqueue(float* base, std::vector<Range> ranges,
                                  std::function<bool()> ready, std::function<void()> prepare) {
    if (ranges.empty()) return;
    {
        const std::lock_guard lock(impl_->mutex);
        impl_->queue.push_back(
            Impl::Bucket{base, std::move(ranges), std::move(ready), std::move(prepare)});
        impl_->enqueued += 1;
    }
    impl_->wake.notify_all();
}

const Communicator& BackgroundAllreduce::communicator() const {
    return impl_->comm;
}

void BackgroundAllreduce::wait() {
    std::unique_lock lock(impl_->mutex);
    impl_->idle.wait(lock, [&] { return impl_->completed == impl_->enqueued; });
}

}  // namespace gpt2
