#include "train/run.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <tuple>

#include "core/clock.hpp"
#include "core/error.hpp"
#include "core/utf8.hpp"
#include "data/shard.hpp"
#include "data/windows.hpp"
#include "formats/checkpoint.hpp"
#include "formats/model_file.hpp"
#include "model/generate.hpp"
#include "ops/gemm.hpp"
#include "ops/peak_flops.hpp"
#include "parallel/data_parallel.hpp"
#include "threads/thread_pool.hpp"
#include "tokenizer/tokenizer.hpp"
#include "train/corpus.hpp"
#include "train/memory_plan.hpp"
#include "train/multiple_choice_eval.hpp"
#include "train/resume_state.hpp"
#include "train/start_point.hpp"
#include "train/stop_signal.hpp"
#include "train/text_format.hpp"

namespace gpt2 {

namespace {

double peak_rss_bytes() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_maxrss) * 1024.0;
}

// ---- The model's shape ----------------------------------------------------------------------

// The shape the flags ask for: a preset, with any explicitly given dimension overriding it, or
// the dimensions alone.
ModelConfig requested_model(const TrainOptions& o, int vocab_size) {
    if (o.model.empty()) {
        const int maxT = o.block_size > 0 ? o.block_size : o.seq_len;
        return ModelConfig{maxT, vocab_size, pad_vocab(vocab_size), o.n_layer, o.n_head, o.n_embd};
    }
    ModelConfig c = preset_config(o.model, vocab_size);
    if (o.was_given("n-layer")) c.num_layers = o.n_layer;
    if (o.was_given("n-head")) c.num_heads = o.n_head;
    if (o.was_given("n-embd")) c.channels = o.n_embd;
    if (o.block_size > 0) c.max_seq_len = o.block_size;
    return c;
}

// Shape flags given alongside weights must agree with them: the shape comes from the weights.
void check_shape_flags(const TrainOptions& o, const ModelConfig& loaded,
                       const std::string& source) {
    const auto refuse = [&](const std::string& flag, const std::string& what) {
        throw UsageError(flag + " contradicts " + source + ", whose model is " + what + " (" +
                         describe(loaded) + "); the shape comes from the weights: drop the flag");
    };
    if (o.was_given("model")) {
        const ModelConfig preset = preset_config(o.model, loaded.vocab_size);
        if (preset.num_layers != loaded.num_layers || preset.num_heads != loaded.num_heads ||
            preset.channels != loaded.channels) {
            refuse("--model " + o.model, "another shape");
        }
    }
    const std::array<std::tuple<const char*, int, int>, 4> dims = {{
        {"n-layer", o.n_layer, loaded.num_layers},
        {"n-head", o.n_head, loaded.num_heads},
        {"n-embd", o.n_embd, loaded.channels},
        {"block-size", o.block_size, loaded.max_seq_len},
    }};
    for (const auto& [flag, value, actual] : dims) {
        if (o.was_given(flag) && value != actual) {
            refuse("--" + std::string(flag) + " " + std::to_string(value),
                   std::string(flag) + " " + std::to_string(actual));
        }
    }
}

// Rank 0 decides the shape (from the weights, or from the flags) and every rank agrees.
ModelConfig agree_on_model(const TrainOptions& o, const Communicator& comm, const StartPoint& start,
                           const Tokenizer& tokenizer) {
    const int vocab = tokenizer.vocab_size();
    ShapeInts shape{};
    if (comm.is_root()) {
        if (start.model) {
            const ModelConfig& loaded = start.model->model.config;
            check_shape_flags(o, loaded, start.source);
            if (loaded.vocab_size != vocab) {
                throw UsageError(start.source + ": the model's vocabulary (" +
                                 std::to_string(loaded.vocab_size) + ") is not the " +
                                 std::string(tokenizer_kind_name(tokenizer.kind())) +
                                 " tokenizer's (" + std::to_string(vocab) +
                                 "): these weights cannot be trained with it");
            }
            if (loaded.max_seq_len < o.seq_len) {
                throw InputError("--seq-len " + std::to_string(o.seq_len) +
                                 " exceeds the block size " + std::to_string(loaded.max_seq_len) +
                                 " of " + start.source);
            }
            spdlog::info("{}: model {}, tokenizer {} (vocab {})", start.source, describe(loaded),
                         tokenizer_kind_name(tokenizer.kind()), vocab);
            shape = to_shape_ints(loaded);
        } else {
            const ModelConfig requested = requested_model(o, vocab);
            if (!o.model.empty()) {
                std::string overrides;
                for (const char* flag : {"n-layer", "n-head", "n-embd", "block-size"}) {
                    if (o.was_given(flag)) overrides += std::string(" --") + flag;
                }
                if (!overrides.empty()) {
                    spdlog::info("model: preset {} with{} given explicitly", o.model, overrides);
                }
            }
            shape = to_shape_ints(requested);
        }
    }
    comm.broadcast(std::span<std::int32_t>(shape));
    const ModelConfig config = from_shape_ints(shape);
    validate_config(config, "model");
    if (config.max_seq_len < o.seq_len) {
        throw InputError("--seq-len " + std::to_string(o.seq_len) + " exceeds --block-size " +
                         std::to_string(config.max_seq_len));
    }
    return config;
}

// ---- Configuration and reporting helpers ----------------------------------------------------

std::string config_json(const TrainOptions& o, const ModelConfig& c, int world, int workers) {
    nlohmann::json j;
    j["model"] = {{"max_seq_len", c.max_seq_len},
                  {"vocab_size", c.vocab_size},
                  {"padded_vocab_size", c.padded_vocab_size},
                  {"num_layers", c.num_layers},
                  {"num_heads", c.num_heads},
                  {"channels", c.channels}};
    j["training"] = {{"data", o.train_data.empty() ? o.data : o.train_data},
                     {"tokenizer", o.tokenizer},
                     {"batch_size", o.batch_size},
                     {"seq_len", o.seq_len},
                     {"lr", o.lr},
                     {"min_lr", o.min_lr},
                     {"warmup_steps", o.warmup_steps},
                     {"weight_decay", o.weight_decay},
                     {"grad_clip", o.grad_clip},
                     {"max_steps", o.max_steps},
                     {"seed", o.seed},
                     {"ranks", world},
                     {"threads", workers}};
    return j.dump(2);
}

// The CPU cores the job's workers can actually use (for MFU): per host, the workers of all its
// ranks, capped at the host's CPUs. Warns (on rank 0) when workers outnumber CPUs.
int cores_in_use(const Communicator& comm, int workers) {
    std::array<char, 256> host{};
    ::gethostname(host.data(), host.size() - 1);
    const std::string_view name(host.data());
    const std::uint64_t host_id =
        checksum64(std::span(reinterpret_cast<const std::uint8_t*>(name.data()), name.size()));
    const long online = ::sysconf(_SC_NPROCESSORS_ONLN);
    const auto hosts = comm.allgather(host_id);
    const auto host_cpus = comm.allgather(static_cast<std::uint64_t>(online > 0 ? online : 1));
    const auto rank_workers = comm.allgather(static_cast<std::uint64_t>(workers));
    const auto rank_cpus = comm.allgather(static_cast<std::uint64_t>(available_cpus()));
    std::map<std::uint64_t, std::pair<std::uint64_t, std::uint64_t>> per_host;  // workers, cpus
    for (std::size_t r = 0; r < hosts.size(); ++r) {
        auto& [w, c] = per_host[hosts[r]];
        w += rank_workers[r];
        c = host_cpus[r];
        if (comm.is_root() && rank_workers[r] > rank_cpus[r]) {
            spdlog::warn(
                "rank {}: {} worker threads but only {} CPUs in its affinity mask: "
                "workers share cores (oversubscribed), steps will be slower",
                r, rank_workers[r], rank_cpus[r]);
        }
    }
    std::uint64_t cores = 0;
    for (const auto& [id, load] : per_host) {
        const auto [w, c] = load;
        if (comm.is_root() && w > c && comm.size() > 1) {
            spdlog::warn(
                "{} worker threads over the ranks of one host with {} CPUs: "
                "oversubscribed, steps will be slower",
                w, c);
        }
        cores += std::min(w, c);
    }
    return static_cast<int>(std::max<std::uint64_t>(cores, 1));
}

std::string iso_time_now() {
    const std::time_t now = std::time(nullptr);
    std::tm utc{};
    gmtime_r(&now, &utc);
    std::array<char, 32> text{};
    std::strftime(text.data(), text.size(), "%Y-%m-%dT%H:%M:%SZ", &utc);
    return text.data();
}

// One JSON object per line, appended with a single write() so that a crash never leaves half a
// record behind a complete one; flushed to disk (fdatasync) with every checkpoint and at the end.
class MetricsFile {
  public:
    explicit MetricsFile(const std::string& path) : path_(path) {
        if (path.empty()) return;
        const std::filesystem::path parent = std::filesystem::path(path).parent_path();
        std::error_code ec;
        if (!parent.empty()) std::filesystem::create_directories(parent, ec);
        fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd_ < 0) throw InputError("--metrics-file " + path + ": cannot open for writing");
    }
    ~MetricsFile() {
        if (fd_ >= 0) {
            ::fdatasync(fd_);
            ::close(fd_);
        }
    }
    MetricsFile(const MetricsFile&) = delete;
    MetricsFile& operator=(const MetricsFile&) = delete;

    void write(const nlohmann::json& record) {
        if (fd_ < 0) return;
        const std::string line = record.dump() + '\n';
        if (::write(fd_, line.data(), line.size()) != static_cast<ssize_t>(line.size()) &&
            !warned_) {
            warned_ = true;
            spdlog::warn("--metrics-file {}: write failed ({}); training goes on", path_,
                         std::strerror(errno));
        }
    }
    void sync() {
        if (fd_ >= 0) ::fdatasync(fd_);
    }

  private:
    std::string path_;
    int fd_ = -1;
    bool warned_ = false;
};

// Floats per allreduce bucket for --bucket-mb (at least one when it is not 0).
std::size_t bucket_floats(double bucket_mb) {
    if (bucket_mb <= 0.0) return 0;
    return std::max<std::size_t>(1, static_cast<std::size_t>(bucket_mb * 1024.0 * 1024.0 / 4.0));
}

// ---- The run ------------------------------------------------------------------------------

// How the ranks sum the gradient, decided once from the flags and where the ranks run.
struct Exchange {
    double bucket_mb = 0.0;     // --bucket-mb with auto resolved
    bool share_memory = false;  // the ranks of each machine train one copy of the weights
    std::string share_error;    // why sharing failed (the run goes on as ZeRO-1)
    // Where the ranks run; shared by copies so that steps can point at its communicators.
    std::shared_ptr<const MachineGroups> machines;
    // Shared memory on several machines: slices also travel between machines.
    [[nodiscard]] bool across_machines() const {
        return share_memory && share_error.empty() && machines->machines > 1;
    }
};

Exchange choose_exchange(const TrainOptions& o, const Communicator& comm) {
    Exchange e;
    e.machines = std::make_shared<const MachineGroups>(comm, o.simulate_machines);
    const MachineGroups& m = *e.machines;
    // Several ranks on every machine (as many on each) can share each machine's memory; one rank
    // per machine has nothing to share and overlaps its allreduce with backward instead.
    const bool can_share = o.share_memory && m.machine.size() > 1 && m.uniform && o.zero == 0;
    // Across machines the gradient (or, with shared memory, each rank's slice of it) travels in
    // 25 MiB buckets while backward runs. ZeRO-1's own default is one reduce-scatter after
    // backward: in 25 MiB buckets it measured within 1% of that over 1 Gbit/s (the parameters'
    // allgather after the update stays exposed).
    // Buckets need MPI calls from the communication thread: without that thread level, auto
    // keeps one allreduce after backward.
    const bool buckets = m.machines > 1 && o.zero == 0 && comm.serialized_threads();
    e.bucket_mb = o.bucket_mb >= 0.0 ? o.bucket_mb : buckets ? 25.0 : 0.0;
    // On one machine, buckets asked for replace sharing.
    e.share_memory = can_share && (e.bucket_mb == 0.0 || m.machines > 1);
    return e;
}

// This rank's replica: the model, its optimizer state and the worker threads with their contexts.
// Under --zero 1 or shared memory the optimizer holds only this rank's slice of the moments.
struct Replica {
    Replica(const ModelConfig& config, int num_workers, const TrainOptions& o, MemoryPlan plan)
        : memory(std::move(plan)),
          workers(config, num_workers, o.batch_size, o.seq_len, o.pin_threads, o.precision,
                  memory.need.recompute),
          model(config) {}
    MemoryPlan memory;  // decided before the workers' contexts were allocated
    WorkerGroup workers;
    Model model;
    // One per world rank under --zero 1 or shared memory (the slice each updates), else empty.
    std::vector<Range> zero_shards;
    // The slices a checkpoint gathers the moments from: zero_shards, except that with shared
    // memory on several machines every machine holds them all, so only world rank 0's machine
    // gives them (the other ranks' slices are empty here).
    std::vector<Range> checkpoint_shards;
    AdamWState optimizer{0};
    // Shared memory on several machines: the ranks on other machines that hold this rank's slice,
    // world rank 0's machine first. Null otherwise.
    const Communicator* copies_across = nullptr;

    [[nodiscard]] Range owned(const Communicator& comm, std::size_t P) const {
        return zero_shards.empty() ? Range{0, P}
                                   : zero_shards[static_cast<std::size_t>(comm.rank())];
    }
    [[nodiscard]] Range checkpoint_slice(const Communicator& comm) const {
        return checkpoint_shards[static_cast<std::size_t>(comm.rank())];
    }
    // Sizes the optimizer for this rank's part: `slice` of `parts` equal slices (one part: all).
    void set_slices(const Communicator& comm, int slice, int parts, bool gives_checkpoint) {
        const std::size_t P = model.layout.total();
        zero_shards.clear();
        checkpoint_shards.clear();
        if (parts > 1) {
            // Every rank's slice index, and whether it gives the checkpoint, in one value.
            const std::vector<std::uint64_t> all =
                comm.allgather(static_cast<std::uint64_t>(slice) * 2 + (gives_checkpoint ? 1 : 0));
            for (const std::uint64_t value : all) {
                const Range r = split_range(P, static_cast<int>(value / 2), parts);
                zero_shards.push_back(r);
                checkpoint_shards.push_back(value % 2 != 0 ? r : Range{r.begin, r.begin});
            }
        }
        const Range mine = owned(comm, P);
        optimizer = AdamWState(mine.end - mine.begin, mine.begin);
    }
};

// The full moments on rank 0 (for a checkpoint) from every rank's slice; without slices the
// optimizer itself. Every rank calls it.
const AdamWState& full_optimizer(const Replica& replica, const Communicator& comm,
                                 std::unique_ptr<AdamWState>& gathered) {
    if (replica.zero_shards.empty()) return replica.optimizer;
    const std::size_t P = replica.model.layout.total();
    gathered = std::make_unique<AdamWState>(comm.is_root() ? P : 0);
    gathered->step = replica.optimizer.step;
    const Range given = replica.checkpoint_slice(comm);
    for (const auto& [mine, full] : {std::pair{&replica.optimizer.m, &gathered->m},
                                     std::pair{&replica.optimizer.v, &gathered->v}}) {
        comm.gather_shards(mine->span().first(given.end - given.begin), full->span(),
                           replica.checkpoint_shards);
    }
    return *gathered;
}

std::unique_ptr<Replica> build_replica(const TrainOptions& o, const Communicator& comm,
                                       const ModelConfig& config, StartPoint& start,
                                       Exchange& exchange) {
    std::int32_t have_weights = comm.is_root() && start.model ? 1 : 0;
    comm.broadcast(std::span<std::int32_t>(&have_weights, 1));
    const int workers = o.threads > 0 ? o.threads : std::min(available_cpus(), o.batch_size);
    const MachineGroups& machines = *exchange.machines;
    // Who holds how much of the AdamW moments (a failed share falls back to the same slices).
    const int moment_parts = exchange.share_memory ? machines.machine.size()
                             : o.zero == 1         ? comm.size()
                                                   : 1;
    auto replica = std::make_unique<Replica>(
        config, workers, o, plan_memory(o, comm, machines.machine, config, workers, moment_parts));
    if (have_weights) {
        if (comm.is_root()) {
            const auto loaded = start.model->model.params.span();
            std::copy(loaded.begin(), loaded.end(), replica->model.params.data());
            start.model.reset();
        }
        comm.broadcast(replica->model.params.span());
    } else {
        init_parameters(replica->model, o.seed, &replica->workers.pool());
    }
    set_precision(replica->model, o.precision);  // the bf16 copy of the weights, if any
    if (exchange.share_memory) {
        exchange.share_error =
            share_replica_memory(replica->model, replica->workers, machines.machine);
        if (o.inject_share_failure && !machines.on_first && exchange.share_error.empty()) {
            exchange.share_error = "--inject-share-failure";
        }
        // A machine that could not share makes every machine train without sharing.
        if (comm.allreduce_max(exchange.share_error.empty() ? 0 : 1) != 0) {
            if (exchange.share_error.empty()) {
                exchange.share_error = "another machine could not map its shared memory";
            }
            unshare_replica_memory(replica->model, replica->workers);
            if (o.bucket_mb < 0.0) exchange.bucket_mb = 0.0;  // ZeRO-1's own default
        }
    }
    if (exchange.share_memory && exchange.share_error.empty()) {
        // Each rank updates its slice of its machine's weights; the checkpoint's moments come
        // from world rank 0's machine.
        replica->set_slices(comm, machines.machine.rank(), machines.machine.size(),
                            machines.on_first);
        if (machines.machines > 1) replica->copies_across = &machines.across;
    } else if (o.zero == 1 || exchange.share_memory) {
        // ZeRO-1 (asked for, or where sharing failed: the same slices, nothing shared).
        replica->set_slices(comm, comm.rank(), comm.size(), true);
    } else {
        replica->set_slices(comm, 0, 1, true);
    }
    return replica;
}

// Plain values the step loop runs on, fixed before it starts.
struct RunPlan {
    int grad_accum = 1;
    std::int64_t global_sequences = 0;  // per optimizer step, all ranks
    std::int64_t first_step = 0;
    std::int64_t decay_steps = 0;  // the schedule's length
    std::uint64_t run_id = 0;      // the lineage (rank 0's; only rank 0 writes checkpoints)
    bool resumed = false;
    Rng sample_rng{0};
    SpikeGuard spikes;  // --skip-loss-z / --skip-norm-z and their windows (resumed)
};

int derived_grad_accum(const TrainOptions& o, int world) {
    if (o.grad_accum > 0) return o.grad_accum;
    if (o.total_batch_tokens > 0) {
        return static_cast<int>(o.total_batch_tokens /
                                (static_cast<std::int64_t>(o.batch_size) * o.seq_len * world));
    }
    return 1;
}

// A fresh lineage and schedule, or the resume state of the checkpoint we start from (rank 0
// reads it; every rank receives step, moments and schedule length).
RunPlan plan_run(const TrainOptions& o, const Communicator& comm, const StartPoint& start,
                 Replica& replica) {
    RunPlan plan;
    plan.grad_accum = derived_grad_accum(o, comm.size());
    plan.global_sequences = static_cast<std::int64_t>(o.batch_size) * comm.size() * plan.grad_accum;
    plan.sample_rng = Rng::derived(o.seed, 0x5a3e);
    plan.spikes.max_loss_z = o.skip_loss_z;
    plan.spikes.max_norm_z = o.skip_norm_z;
    std::int32_t resuming = comm.is_root() && !start.state_file.empty() ? 1 : 0;
    comm.broadcast(std::span<std::int32_t>(&resuming, 1));
    plan.resumed = resuming != 0;
    std::unique_ptr<AdamWState> full_moments;  // rank 0, --zero 1: the checkpoint's moments
    // first step, AdamW step, schedule length, micro-steps per step
    std::array<std::int64_t, 4> header{0, 0, o.lr_decay_steps > 0 ? o.lr_decay_steps : o.max_steps,
                                       plan.grad_accum};
    if (comm.is_root()) {
        std::random_device entropy;
        plan.run_id = (static_cast<std::uint64_t>(entropy()) << 32) ^ entropy() ^ 1;
    }
    if (plan.resumed) {
        if (comm.is_root()) {
            if (!replica.zero_shards.empty()) {
                full_moments = std::make_unique<AdamWState>(replica.model.layout.total());
            }
            AdamWState& loaded = full_moments ? *full_moments : replica.optimizer;
            const ResumeState resume =
                load_resume_state(start.state_file, replica.model.config, loaded);
            replica.optimizer.step = loaded.step;
            // Elastic resume: another number of ranks (or --batch-size) keeps the checkpoint's
            // global batch through the number of micro-steps, unless the user fixed that.
            const std::int64_t per_micro_step =
                static_cast<std::int64_t>(o.batch_size) * comm.size();
            const bool accum_is_free = o.grad_accum == 0 && o.total_batch_tokens == 0;
            if (accum_is_free && resume.seq_len == o.seq_len &&
                resume.sequences_per_step != plan.global_sequences) {
                if (resume.sequences_per_step % per_micro_step != 0) {
                    throw UsageError(
                        "--resume " + start.state_file.string() + ": the checkpoint's global " +
                        "batch is " + std::to_string(resume.sequences_per_step) +
                        " sequences per step, which " + std::to_string(comm.size()) +
                        " ranks x --batch-size " + std::to_string(o.batch_size) + " = " +
                        std::to_string(per_micro_step) +
                        " per micro-step does not divide; choose ranks x --batch-size dividing " +
                        std::to_string(resume.sequences_per_step));
                }
                header[3] = resume.sequences_per_step / per_micro_step;
                spdlog::info(
                    "elastic resume: {} ranks x batch {} x grad accum {} keeps the checkpoint's "
                    "{} sequences per step",
                    comm.size(), o.batch_size, header[3], resume.sequences_per_step);
            }
            const std::int64_t global = per_micro_step * header[3];
            if (resume.sequences_per_step != global || resume.seq_len != o.seq_len) {
                throw UsageError(
                    "--resume " + start.state_file.string() + ": the checkpoint used " +
                    std::to_string(resume.sequences_per_step) + " sequences of " +
                    std::to_string(resume.seq_len) + " tokens per step; this run uses " +
                    std::to_string(global) + " of " + std::to_string(o.seq_len) +
                    " (keep the global batch to resume)");
            }
            if (resume.lr_decay_steps > 0 && !o.was_given("lr-decay-steps")) {
                header[2] = resume.lr_decay_steps;
                if (header[2] != o.max_steps) {
                    spdlog::info(
                        "schedule: {} steps, as the run started with (--lr-decay-steps "
                        "changes it)",
                        header[2]);
                }
            }
            header[0] = resume.step;
            header[1] = replica.optimizer.step;
            if (resume.run_id != 0) plan.run_id = resume.run_id;
            plan.sample_rng.set_state(resume.sample_rng);
            plan.spikes.loss = resume.loss_window;
            plan.spikes.norm = resume.norm_window;
            spdlog::info("resuming from {} at step {}", start.state_file.string(), resume.step);
        }
        if (replica.zero_shards.empty()) {
            comm.broadcast(replica.optimizer.m.span());
            comm.broadcast(replica.optimizer.v.span());
        } else {  // each rank receives only its slice of the moments
            const std::span<const float> no_moments;
            const Range given = replica.checkpoint_slice(comm);
            for (const auto& [full, mine] :
                 {std::pair{full_moments ? full_moments->m.span() : no_moments,
                            replica.optimizer.m.span()},
                  std::pair{full_moments ? full_moments->v.span() : no_moments,
                            replica.optimizer.v.span()}}) {
                comm.scatter_shards(full, mine.first(given.end - given.begin),
                                    replica.checkpoint_shards);
                // Shared memory on several machines: world rank 0's machine received the
                // slices; each passes its own to the ranks holding it elsewhere.
                if (replica.copies_across != nullptr) replica.copies_across->broadcast(mine);
            }
        }
    }
    comm.broadcast(std::span<std::int64_t>(header));
    // Every rank judges spikes against the same windows (plain data: sent as bytes).
    for (SpikeWindow* window : {&plan.spikes.loss, &plan.spikes.norm}) {
        comm.broadcast(std::span(reinterpret_cast<std::uint8_t*>(window), sizeof(SpikeWindow)));
    }
    plan.first_step = header[0];
    replica.optimizer.step = header[1];
    plan.decay_steps = header[2];
    plan.grad_accum = static_cast<int>(header[3]);
    plan.global_sequences = static_cast<std::int64_t>(o.batch_size) * comm.size() * plan.grad_accum;
    return plan;
}

void warn_about_schedule(const TrainOptions& o, const RunPlan& plan) {
    if (o.warmup_steps > o.max_steps || o.warmup_steps >= plan.decay_steps) {
        spdlog::warn(
            "--warmup-steps {} is not shorter than the run ({} steps, schedule over {}): "
            "the learning rate {} --lr before the end",
            o.warmup_steps, o.max_steps, plan.decay_steps,
            o.warmup_steps > o.max_steps ? "never reaches" : "only reaches");
    }
}

// --hellaswag: rank 0 reads the file, every rank gets its bytes (only rank 0 needs the file).
std::vector<MultipleChoiceExample> load_hellaswag(const TrainOptions& o, const Communicator& comm,
                                                  int vocab_size) {
    if (o.hellaswag.empty()) return {};
    std::vector<std::uint8_t> bytes;
    if (comm.is_root()) bytes = read_file_bytes(o.hellaswag);
    comm.broadcast_vector(bytes);
    std::vector<MultipleChoiceExample> examples = parse_multiple_choice(bytes, o.hellaswag);
    if (const std::int32_t top = max_token(examples); top >= vocab_size) {
        throw InputError("--hellaswag " + o.hellaswag + ": token " + std::to_string(top) +
                         " is outside the model's vocabulary of " + std::to_string(vocab_size) +
                         " (the file was made with another tokenizer; llm.c's is for GPT-2's)");
    }
    if (comm.is_root()) {
        spdlog::info("hellaswag: {} examples from {}, {}", examples.size(), o.hellaswag,
                     o.eval_every > 0 ? fmt::format("every {} steps", o.eval_every)
                                      : std::string("with each validation"));
    }
    return examples;
}

// What MFU is measured against: one core's fp32 multiply-add peak, measured at start-up with the
// instructions the GEMM kernels use (a few milliseconds) unless --peak-gflops gives it, times the
// cores the workers use.
struct MfuYardstick {
    double per_core = 0.0;
    int cores = 1;
    std::string source;
    [[nodiscard]] std::string describe() const {
        return fmt::format("{} core{} x {:.0f} GFLOP/s, {}", cores, cores == 1 ? "" : "s", per_core,
                           source);
    }
};

MfuYardstick mfu_yardstick(const TrainOptions& o, int cores) {
    if (o.peak_gflops > 0.0) return MfuYardstick{o.peak_gflops, cores, "--peak-gflops"};
    const FmaPeak peak = measure_fma_peak();
    return MfuYardstick{peak.gflops, cores, fmt::format("{} measured on one core", peak.isa)};
}

// The step loop and what it does between steps (validate, sample, checkpoint, compare replicas),
// over state built once: the replica, the data, the batch buffers and the metrics file.
class TrainingLoop {
  public:
    TrainingLoop(const TrainOptions& o, const Communicator& comm, const Corpus& corpus,
                 Replica& replica, RunPlan& plan, const Exchange& exchange, double startup_seconds);
    void log_banner() const;
    [[nodiscard]] int run();

  private:
    struct StepOutcome {
        bool stop = false;
        int signal = 0;
    };
    [[nodiscard]] StepOutcome step(std::int64_t step, int& bad_steps, double& ema_seconds);
    void validate(std::int64_t completed);
    void evaluate_hellaswag(std::int64_t completed);
    void sample(std::int64_t completed);
    void save(std::int64_t completed);
    void check_replicas(std::int64_t completed) const;
    void report_benchmark();

    const TrainOptions& o_;
    const Communicator& comm_;
    const Corpus& corpus_;
    Replica& replica_;
    RunPlan& plan_;
    const int B_, T_;
    const bool benchmark_;
    const std::int64_t last_step_;
    const std::int64_t tokens_per_step_;
    const Exchange exchange_;
    const double flops_per_step_;
    const MfuYardstick yardstick_;
    const double peak_gflops_;
    const ScheduleConfig schedule_;
    const std::string run_config_;
    const double startup_seconds_;
    std::vector<std::int32_t> inputs_, targets_, val_inputs_, val_targets_;
    WindowSampler train_sampler_;
    MetricsFile metrics_;
    std::vector<MultipleChoiceExample> hellaswag_;  // --hellaswag, on every rank
    std::optional<std::filesystem::path> last_checkpoint_;
    std::vector<double> step_ms_;
};

constexpr int kBenchmarkWarmup = 2;

TrainingLoop::TrainingLoop(const TrainOptions& o, const Communicator& comm, const Corpus& corpus,
                           Replica& replica, RunPlan& plan, const Exchange& exchange,
                           double startup_seconds)
    : o_(o),
      comm_(comm),
      corpus_(corpus),
      replica_(replica),
      plan_(plan),
      B_(o.batch_size),
      T_(o.seq_len),
      benchmark_(o.benchmark > 0),
      last_step_(benchmark_ ? plan.first_step + o.benchmark + kBenchmarkWarmup : o.max_steps),
      tokens_per_step_(plan.global_sequences * o.seq_len),
      exchange_(exchange),
      flops_per_step_(training_flops_per_token(replica.model.config, o.seq_len) *
                      static_cast<double>(tokens_per_step_)),
      yardstick_(mfu_yardstick(o, cores_in_use(comm, replica.workers.size()))),
      peak_gflops_(yardstick_.per_core * yardstick_.cores),
      schedule_{o.schedule, o.lr, o.min_lr, o.warmup_steps, plan.decay_steps},
      run_config_(config_json(o, replica.model.config, comm.size(), replica.workers.size())),
      startup_seconds_(startup_seconds),
      inputs_(static_cast<std::size_t>(plan.grad_accum) * B_ * T_),
      targets_(inputs_.size()),
      val_inputs_(static_cast<std::size_t>(o.val_batches) * B_ * T_),
      val_targets_(val_inputs_.size()),
      train_sampler_(corpus.train_store, T_, o.seed, !o.no_shuffle),
      metrics_(comm.is_root() ? o.metrics_file : ""),
      hellaswag_(load_hellaswag(o, comm, replica.model.config.vocab_size)) {
    // The validation set is fixed: the first windows of the validation data, in order.
    WindowSampler val_sampler(corpus.val_store, T_, o.seed, false);
    val_sampler.fill_step(0, comm.rank(), comm.size(), B_, o.val_batches, val_inputs_,
                          val_targets_);
    if (comm.is_root() && !benchmark_) {
        std::error_code ec;
        std::filesystem::create_directories(o.out_dir, ec);
        if (ec || !std::filesystem::is_directory(o.out_dir)) {
            throw InputError("--out-dir " + o.out_dir + ": cannot create directory (" +
                             ec.message() + ")");
        }
    }
    metrics_.write({{"type", "run"},
                    {"start_step", plan.first_step},
                    {"max_steps", last_step_},
                    {"time", iso_time_now()},
                    {"resumed", plan.resumed},
                    {"ranks", comm.size()},
                    {"threads", replica.workers.size()},
                    {"precision", precision_name(replica.model.precision)},
                    {"tokens_per_step", tokens_per_step_},
                    {"model", describe(replica.model.config)}});
}

void TrainingLoop::log_banner() const {
    const ModelConfig& config = replica_.model.config;
    const WorkerGroup& workers = replica_.workers;
    const int W = workers.size();
    spdlog::info("model {} | {} parameters ({})", describe(config),
                 with_commas(static_cast<double>(replica_.model.layout.total())),
                 human_bytes(static_cast<double>(replica_.model.layout.total()) * 4));
    spdlog::info("ranks x workers {} x {} | batch {} x {} per rank, grad accum {} | {} tokens/step",
                 comm_.size(), W, B_, T_, plan_.grad_accum,
                 with_commas(static_cast<double>(tokens_per_step_)));
    const Model& model = replica_.model;
    const bool shared = !workers.rank_gradients().empty();
    const int machine_ranks = exchange_.machines->machine.size();
    const int with_window = workers.contributing_workers() - 1;
    const std::string windows =
        with_window == 0
            ? std::string("no gradient windows")
            : fmt::format(
                  "gradient window {} on {} of {} workers",
                  human_bytes(static_cast<double>(workers.context(1).gradient_window.size() * 4)),
                  with_window, W);
    spdlog::info(
        "memory: {} activations per worker, {} | rank: {} gradient, {} weights{}, {} AdamW "
        "moments{} "
        "| startup {:.0f} ms",
        human_bytes(static_cast<double>(workers.context(0).activation_bytes())), windows,
        human_bytes(static_cast<double>(workers.gradient_bytes())),
        human_bytes(static_cast<double>(model.params.size() * 4 + model.params_bf16.size() * 2)),
        shared ? fmt::format(" (one copy for the {} ranks of this machine)", machine_ranks)
               : std::string(),
        human_bytes(static_cast<double>(replica_.optimizer.m.size() * 8)),
        replica_.zero_shards.empty() ? std::string()
        : shared                     ? fmt::format(" (this rank's slice of {})", machine_ranks)
                 : fmt::format(" (ZeRO-1: this rank's shard of {})", comm_.size()),
        startup_seconds_ * 1e3);
    for (const std::string& line : describe_memory(replica_.memory))
        spdlog::info("{}", line);
    if (B_ % W != 0) {
        const int fewer = W - B_ % W;
        spdlog::warn(
            "batch {} per rank does not divide over {} workers: {} of them take {} sequences, the "
            "others {}, and wait for the rest at every layer; a --batch-size that is a multiple of "
            "{} keeps them all busy",
            B_, W, fewer, B_ / W, B_ / W + 1, W);
    }
    if (comm_.size() == 1 && o_.zero == 1) {
        spdlog::warn("--zero 1 with one rank: there is nothing to shard, the optimizer is whole");
    }
    if (!exchange_.share_error.empty()) {
        spdlog::warn(
            "shared memory is off for this run ({}): each rank keeps its own weights and a "
            "shard of the optimizer instead (ZeRO-1)",
            exchange_.share_error);
    }
    if (comm_.size() > 1) {
        if (shared && exchange_.across_machines()) {
            spdlog::info(
                "gradient across ranks: shared memory on each machine, each rank sums and "
                "updates 1/{} of the weights, and its slice is summed across the {} machines {} "
                "(auto: {} ranks on each machine)",
                machine_ranks, exchange_.machines->machines,
                exchange_.bucket_mb > 0.0
                    ? fmt::format("in buckets of {} MiB while backward runs", exchange_.bucket_mb)
                    : std::string("in one allreduce after backward"),
                machine_ranks);
        } else if (shared) {
            spdlog::info(
                "gradient across ranks: shared memory, each rank sums and updates 1/{} of the "
                "weights (auto: ranks on one machine)",
                comm_.size());
        } else if (!replica_.zero_shards.empty() && exchange_.bucket_mb > 0.0) {
            spdlog::info(
                "gradient across ranks: ZeRO-1, summed in buckets of {} MiB while backward runs, "
                "each rank keeping its shard",
                exchange_.bucket_mb);
        } else if (!replica_.zero_shards.empty()) {
            spdlog::info("gradient across ranks: ZeRO-1, one reduce-scatter after backward");
        } else if (exchange_.bucket_mb > 0.0) {
            spdlog::info("gradient across ranks: buckets of {} MiB, summed while backward runs{}",
                         exchange_.bucket_mb,
                         o_.bucket_mb < 0.0 ? " (auto: ranks on several machines)" : "");
        } else {
            spdlog::info("gradient across ranks: one allreduce after backward{}",
                         !o_.share_memory     ? " (--share-memory off)"
                         : o_.bucket_mb < 0.0 ? " (auto: ranks on one machine)"
                                              : " (--bucket-mb 0)");
        }
    }
    spdlog::info("data: {} train windows, {} val windows of {} tokens",
                 with_commas(static_cast<double>(corpus_.train_store.num_windows(T_))),
                 with_commas(static_cast<double>(corpus_.val_store.num_windows(T_))), T_);
    if (replica_.model.precision == Precision::bf16) {
        spdlog::info(
            "precision bf16: products on {}, fp32 weights, gradients and AdamW | MFU against "
            "the fp32 peak {:.0f} GFLOP/s ({})",
            bf16_backend_name(bf16_backend()), peak_gflops_, yardstick_.describe());
        if (bf16_backend() == Bf16Backend::avx512_bf16) {
            // Measured on Sapphire Rapids limited to AVX512_BF16 (ONEDNN_MAX_CPU_ISA): oneDNN
            // 2.6's bf16 kernels ran at 0.65x OpenBLAS's fp32 there; other CPUs may differ.
            spdlog::warn(
                "bf16 without AMX can be slower than fp32: compare the two with build/bench_gemm "
                "or --benchmark before a long run");
        }
    } else {
        spdlog::info("precision fp32: GEMM kernels {} | MFU peak {:.0f} GFLOP/s ({})",
                     gemm_kernel_name(), peak_gflops_, yardstick_.describe());
    }
    for (int w = 0; w < W; ++w) {
        const Range share = split_range(static_cast<std::size_t>(B_), w, W);
        spdlog::debug("rank {} worker {}: {} sequences, context {}", comm_.rank(), w,
                      share.end - share.begin,
                      human_bytes(static_cast<double>(workers.context(w).total_bytes())));
    }
}

int TrainingLoop::run() {
    if (plan_.first_step == 0 && !benchmark_ && o_.val_every > 0) {
        validate(0);
        if (o_.eval_every == 0) evaluate_hellaswag(0);
    }
    double ema_seconds = 0.0;
    int bad_steps = 0;
    for (std::int64_t s = plan_.first_step; s < last_step_; ++s) {
        const StepOutcome outcome = step(s, bad_steps, ema_seconds);
        const std::int64_t completed = s + 1;
        if (benchmark_) {
            if (outcome.stop) return 130;  // interrupted: no figures, nothing saved
            continue;
        }
        const bool last = completed == last_step_;
        const bool validating = (o_.val_every > 0 && completed % o_.val_every == 0) || last;
        if (validating) validate(completed);
        if ((o_.eval_every == 0 && validating) ||
            (o_.eval_every > 0 && (completed % o_.eval_every == 0 || last))) {
            evaluate_hellaswag(completed);
        }
        if (o_.sample_every > 0 && (completed % o_.sample_every == 0 || last)) sample(completed);
        if ((o_.checkpoint_every > 0 && completed % o_.checkpoint_every == 0) || last ||
            outcome.stop) {
            save(completed);
        }
        if (outcome.stop) {
            spdlog::info("stopped by signal at step {} ({}); resume with --resume auto", completed,
                         signal_name(outcome.signal));
            return 0;
        }
    }
    if (benchmark_ && comm_.is_root()) report_benchmark();
    return 0;
}

TrainingLoop::StepOutcome TrainingLoop::step(std::int64_t step, int& bad_steps,
                                             double& ema_seconds) {
    const auto t0 = Clock::now();
    train_sampler_.fill_step(static_cast<std::uint64_t>(step), comm_.rank(), comm_.size(), B_,
                             plan_.grad_accum, inputs_, targets_);
    const StepHyper hyper{
        AdamWHyper{learning_rate(schedule_, step), o_.beta1, o_.beta2, o_.eps, o_.weight_decay},
        o_.grad_clip, bucket_floats(exchange_.bucket_mb), replica_.zero_shards,
        exchange_.across_machines() ? exchange_.machines.get() : nullptr};
    const StepMetrics m =
        train_step(replica_.model, replica_.optimizer, replica_.workers, comm_,
                   StepBatch{inputs_, targets_, plan_.grad_accum, plan_.global_sequences}, hyper,
                   step == o_.inject_nan_step     ? InjectedFault::nan_gradient
                   : step == o_.inject_spike_step ? InjectedFault::gradient_spike
                                                  : InjectedFault::none,
                   &plan_.spikes);
    const double seconds = seconds_since(t0);
    const std::int64_t completed = step + 1;
    if (m.skipped) {
        ++bad_steps;
        if (m.spike) {
            const bool loss_spike = o_.skip_loss_z > 0 && m.loss_z && *m.loss_z > o_.skip_loss_z;
            spdlog::warn("step {}: {} z-score {:+.1f} above {} {}: update skipped ({} in a row)",
                         completed, loss_spike ? "loss" : "gradient norm",
                         loss_spike ? *m.loss_z : m.norm_z.value_or(0.0),
                         loss_spike ? "--skip-loss-z" : "--skip-norm-z",
                         loss_spike ? o_.skip_loss_z : o_.skip_norm_z, bad_steps);
        } else {
            spdlog::warn(
                "step {}: non-finite loss {} or gradient norm {}: update skipped ({} in a row)",
                completed, m.loss, m.grad_norm, bad_steps);
        }
        if (bad_steps >= o_.max_bad_steps) {
            throw InputError(
                "stopping: " + std::to_string(bad_steps) +
                " skipped steps in a row (non-finite or spikes, --max-bad-steps); " +
                (last_checkpoint_
                     ? "the last good checkpoint, " + last_checkpoint_->string() + ", is kept"
                     : std::string("this run has written no checkpoint yet")));
        }
    } else {
        bad_steps = 0;
    }
    ema_seconds = step == plan_.first_step ? seconds : 0.9 * ema_seconds + 0.1 * seconds;
    if (benchmark_ && step >= plan_.first_step + kBenchmarkWarmup) {
        step_ms_.push_back(seconds * 1e3);
    }
    const double tok_s = static_cast<double>(tokens_per_step_) / seconds;
    const double mfu = flops_per_step_ / seconds / (peak_gflops_ * 1e9);
    // z-scores as llm.c prints them, once 128 steps make a window.
    const auto z = [](const std::optional<double>& value) {
        return value ? fmt::format(" ({:+.1f}z)", *value) : std::string();
    };
    spdlog::info(
        "step {}/{} | loss {:.4f}{} | lr {:.1e} | norm {:.2f}{} | {:.0f} ms | {} tok/s | MFU "
        "{:.0f}% | ETA {}",
        completed, last_step_, m.loss, z(m.loss_z), hyper.adamw.lr, m.grad_norm, z(m.norm_z),
        seconds * 1e3, with_commas(tok_s), mfu * 100,
        format_duration(ema_seconds * static_cast<double>(last_step_ - completed)));
    std::string barrier_wait;
    for (const double seconds : m.timings.barrier_wait)
        barrier_wait += fmt::format("{}{:.0f}", barrier_wait.empty() ? "" : "/", seconds * 1e3);
    spdlog::debug(
        "rank {} step {}: forward/backward {:.1f} ms | thread reduction {:.1f} ms | "
        "allreduce {:.1f} ms | optimizer {:.1f} ms | barrier wait per worker {} ms",
        comm_.rank(), completed, m.timings.forward_backward * 1e3, m.timings.thread_reduction * 1e3,
        m.timings.allreduce * 1e3, m.timings.optimizer * 1e3, barrier_wait);
    metrics_.write({{"type", "train"},
                    {"step", completed},
                    {"loss", m.loss},
                    {"lr", hyper.adamw.lr},
                    {"grad_norm", m.grad_norm},
                    {"ms", seconds * 1e3},
                    {"tokens_per_s", tok_s},
                    {"mfu", mfu},
                    {"skipped", m.skipped},
                    {"spike", m.spike},
                    {"loss_z", m.loss_z ? nlohmann::json(*m.loss_z) : nlohmann::json()},
                    {"norm_z", m.norm_z ? nlohmann::json(*m.norm_z) : nlohmann::json()}});
    if (o_.check_replicas > 0 && completed % o_.check_replicas == 0) check_replicas(completed);
    const int signal = static_cast<int>(comm_.allreduce_max(stop_signal().load()));
    return StepOutcome{signal != 0 || completed == o_.stop_at_step, signal};
}

void TrainingLoop::validate(std::int64_t completed) {
    const auto t0 = Clock::now();
    const double val_loss = evaluate(replica_.model, replica_.workers, comm_, val_inputs_,
                                     val_targets_, o_.val_batches);
    spdlog::info("step {}/{} | val loss {:.4f} | {:.0f} ms", completed, o_.max_steps, val_loss,
                 seconds_since(t0) * 1e3);
    metrics_.write({{"type", "val"}, {"step", completed}, {"val_loss", val_loss}});
}

void TrainingLoop::evaluate_hellaswag(std::int64_t completed) {
    if (hellaswag_.empty()) return;
    const auto t0 = Clock::now();
    const MultipleChoiceScore score =
        evaluate_multiple_choice(replica_.model, replica_.workers, comm_, hellaswag_);
    spdlog::info("step {}/{} | hellaswag acc_norm {:.4f} ({}/{}{}) | {:.0f} ms", completed,
                 o_.max_steps, score.accuracy(), score.correct, score.scored,
                 score.too_long > 0
                     ? fmt::format(", {} longer than --seq-len {} left out", score.too_long, T_)
                     : std::string(),
                 seconds_since(t0) * 1e3);
    metrics_.write({{"type", "eval"},
                    {"step", completed},
                    {"hellaswag_acc_norm", score.accuracy()},
                    {"hellaswag_correct", score.correct},
                    {"hellaswag_scored", score.scored}});
}

void TrainingLoop::sample(std::int64_t completed) {
    if (!comm_.is_root() || o_.sample_tokens == 0) return;
    std::vector<std::int32_t> tokens;
    if (const auto eot = corpus_.tokenizer->eot_id()) {
        tokens.push_back(*eot);
    } else {
        tokens.push_back(val_inputs_[0]);
    }
    const std::size_t prompt = tokens.size();
    generate_recompute(replica_.model, tokens, o_.sample_tokens, SamplingParams{},
                       plan_.sample_rng);
    const std::string text =
        corpus_.tokenizer->decode(std::span<const std::int32_t>(tokens).subspan(prompt));
    // Token bytes may split or break characters; the log only ever holds valid UTF-8.
    spdlog::info("sample at step {}:\n{}\n---", completed, sanitize_utf8(text));
}

void TrainingLoop::save(std::int64_t completed) {
    std::unique_ptr<AdamWState> gathered;
    const AdamWState& optimizer = full_optimizer(replica_, comm_, gathered);
    if (!comm_.is_root()) return;
    const auto t0 = Clock::now();
    const std::filesystem::path out_dir = o_.out_dir;
    const auto path =
        save_checkpoint(model_path(out_dir, completed), replica_.model,
                        CheckpointExtras{corpus_.tokenizer->serialize(), run_config_});
    ResumeState state;
    state.step = completed;
    state.seed = o_.seed;
    state.sequences_per_step = plan_.global_sequences;
    state.seq_len = T_;
    state.sample_rng = plan_.sample_rng.state();
    state.run_id = plan_.run_id;
    state.lr_decay_steps = plan_.decay_steps;
    state.loss_window = plan_.spikes.loss;
    state.norm_window = plan_.spikes.norm;
    save_resume_state(state_path(out_dir, completed), state, replica_.model.config, optimizer);
    last_checkpoint_ = path;
    prune_checkpoints(out_dir, o_.keep_checkpoints, plan_.run_id);
    metrics_.sync();
    spdlog::info("checkpoint {} ({:.2f} s)", path.string(), seconds_since(t0));
}

void TrainingLoop::check_replicas(std::int64_t completed) const {
    const std::uint64_t sum =
        checksum64(std::span(reinterpret_cast<const std::uint8_t*>(replica_.model.params.data()),
                             replica_.model.params.size() * 4));
    const auto all = comm_.allgather(sum);
    for (std::size_t r = 0; r < all.size(); ++r) {
        if (all[r] != all[0]) {
            comm_.abort(
                fmt::format("step {}: parameters of rank {} differ from rank 0 "
                            "(replicas diverged; checksums {:016x} vs {:016x})",
                            completed, r, all[r], all[0]));
        }
    }
    spdlog::debug("step {}: replicas identical (checksum {:016x})", completed, sum);
}

void TrainingLoop::report_benchmark() {
    std::sort(step_ms_.begin(), step_ms_.end());
    const double median_ms = step_ms_[step_ms_.size() / 2];
    const double tok_s = static_cast<double>(tokens_per_step_) / (median_ms / 1e3);
    const double gflops = flops_per_step_ / (median_ms / 1e3) / 1e9;
    fmt::print(
        "benchmark: median {:.1f} ms/step | {:.1f} tok/s | {:.1f} GFLOP/s | MFU {:.1f}% "
        "| peak RSS {} | startup {:.0f} ms | {} steps, ranks {} x workers {}\n",
        median_ms, tok_s, gflops, 100.0 * gflops / peak_gflops_, human_bytes(peak_rss_bytes()),
        startup_seconds_ * 1e3, step_ms_.size(), comm_.size(), replica_.workers.size());
    std::fflush(stdout);
}

}  // namespace

int run_training(const TrainOptions& o, const Communicator& comm) {
    const auto program_start = Clock::now();
    install_signal_handlers();
    if (!o.config_file.empty()) spdlog::info("config file {} applied", o.config_file);

    StartPoint start;
    TokenizerChoice tokenizer_choice;
    // A mistyped --hellaswag is found before the corpus is read and tokenized, not after.
    if (comm.is_root() && !o.hellaswag.empty() && !std::filesystem::is_regular_file(o.hellaswag)) {
        throw InputError("--hellaswag " + o.hellaswag + ": no such file");
    }
    if (comm.is_root()) choose_start(o, start, tokenizer_choice);
    Corpus corpus;
    prepare_corpus(o, comm, tokenizer_choice, corpus);
    const ModelConfig config = agree_on_model(o, comm, start, *corpus.tokenizer);
    if (corpus.train_store.max_token() >= config.vocab_size) {
        throw InputError("token id " + std::to_string(corpus.train_store.max_token()) +
                         " is out of range for the model's vocabulary of " +
                         std::to_string(config.vocab_size));
    }

    const auto build_start = Clock::now();
    Exchange exchange = choose_exchange(o, comm);
    const std::unique_ptr<Replica> replica = build_replica(o, comm, config, start, exchange);
    RunPlan plan = plan_run(o, comm, start, *replica);
    if (plan.resumed && plan.first_step >= o.max_steps && o.benchmark == 0) {
        spdlog::warn(
            "nothing to do: the checkpoint is at step {} and --max-steps is {} (raise "
            "--max-steps to train further)",
            plan.first_step, o.max_steps);
        return 0;
    }
    if (comm.is_root()) warn_about_schedule(o, plan);
    const double startup_seconds = seconds_since(build_start);

    TrainingLoop loop(o, comm, corpus, *replica, plan, exchange, startup_seconds);
    loop.log_banner();
    const int code = loop.run();
    spdlog::debug("rank {} done after {:.1f} s", comm.rank(), seconds_since(program_start));
    return code;
}

}  // namespace gpt2
