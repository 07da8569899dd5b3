#include "train/run_report.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "ops/peak_flops.hpp"
#include "threads/cpu_topology.hpp"

namespace gpt2 {

double peak_rss_bytes() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_maxrss) * 1024.0;
}

std::string config_json(const TrainOptions& o, const ModelConfig& c, int world, int workers) {
    nlohmann::json j;
    j["model"] = {{"max_seq_len", c.max_seq_len},
                  {"vocab_size", c.vocab_size},
                  {"padded_vocab_size", c.padded_vocab_size},
                  {"num_layers", c.num_layers},
                  {"num_heads", c.num_heads},
                  {"channels", c.channels}};
    j["training"] = {{"data", o.data.train_data.empty() ? o.data.data : o.data.train_data},
                     {"tokenizer", tokenizer_kind_name(o.data.tokenizer)},
                     {"batch_size", o.batch.batch_size},
                     {"seq_len", o.batch.seq_len},
                     {"lr", o.optimizer.lr},
                     {"min_lr", o.optimizer.min_lr},
                     {"warmup_steps", o.optimizer.warmup_steps},
                     {"weight_decay", o.optimizer.weight_decay},
                     {"grad_clip", o.optimizer.grad_clip},
                     {"max_steps", o.optimizer.max_steps},
                     {"seed", o.seed},
                     {"ranks", world},
                     {"threads", workers}};
    return j.dump(2);
}

int cores_in_use(const Communicator& comm, int workers) {
    std::array<char, 256> host{};
    ::gethostname(host.data(), host.size() - 1);
    const std::string_view name(host.data());
    const std::uint64_t host_id =
        checksum64(std::span(reinterpret_cast<const std::uint8_t*>(name.data()), name.size()));
    const std::vector<int> mask = affinity_cpus();
    const auto gather = [&](std::size_t value) {
        return comm.allgather(static_cast<std::uint64_t>(value));
    };
    const auto hosts = comm.allgather(host_id);
    const auto host_cores = gather(static_cast<std::size_t>(cores_first(online_cpus()).cores));
    const auto rank_workers = gather(static_cast<std::size_t>(workers));
    const auto rank_cpus = gather(std::max<std::size_t>(mask.size(), 1));
    const auto rank_cores = gather(static_cast<std::size_t>(std::max(cores_first(mask).cores, 1)));
    // The cores of the launcher (mpirun, orted, a shell): what a rank's binding chose from.
    const auto launcher_cores =
        gather(static_cast<std::size_t>(cores_first(parent_affinity_cpus()).cores));
    struct Host {
        int first_rank = 0, ranks = 0;
        std::uint64_t workers = 0, cores = 0, bound_cores = 0, busy_cores = 0, launcher_cores = 0;
    };
    std::map<std::uint64_t, Host> per_host;
    for (std::size_t r = 0; r < hosts.size(); ++r) {
        auto [it, first] = per_host.try_emplace(hosts[r]);
        Host& h = it->second;
        if (first) h.first_rank = static_cast<int>(r);
        h.ranks += 1;
        h.workers += rank_workers[r];
        h.cores = host_cores[r];
        h.bound_cores += rank_cores[r];
        h.busy_cores += std::min(rank_workers[r], rank_cores[r]);
        h.launcher_cores = std::max(h.launcher_cores, launcher_cores[r]);
        if (comm.is_root() && rank_workers[r] > rank_cpus[r]) {
            spdlog::warn(
                "rank {}: {} worker threads but only {} CPUs in its affinity mask: "
                "workers share cores (oversubscribed), steps will be slower",
                r, rank_workers[r], rank_cpus[r]);
        }
    }
    std::uint64_t cores = 0;
    for (const auto& [id, h] : per_host) {
        if (comm.is_root() && h.workers > h.cores && comm.size() > 1) {
            spdlog::warn(
                "{} worker threads over the ranks of one host with {} cores: "
                "oversubscribed, steps will be slower",
                h.workers, h.cores);
        }
        // mpirun binds each rank to one core when -np is 1 or 2: on a many-core host, most of it
        // idles unless told otherwise, and nothing else would say so.
        if (comm.is_root() && h.bound_cores < h.launcher_cores && h.busy_cores < h.launcher_cores) {
            const bool one = h.ranks == 1;
            spdlog::warn(
                "host of rank {}: {} rank{} may run on {} of the {} cores {} launcher has (CPU "
                "affinity mask{}: mpirun binds each rank to one core when -np is 1 or 2), leaving "
                "{} idle: give each rank its cores with mpirun --map-by slot:PE=N (N cores per "
                "rank) or --bind-to none",
                h.first_rank, h.ranks, one ? "" : "s", h.bound_cores, h.launcher_cores,
                one ? "its" : "their", one ? "" : "s", h.launcher_cores - h.busy_cores);
        }
        cores += std::min(h.workers, h.cores);
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

MetricsFile::MetricsFile(const std::string& path) : path_(path) {
    if (path.empty()) return;
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) {
        throw InputError("--metrics-file " + path + ": cannot open for writing (" +
                         std::strerror(errno) + ")");
    }
}

MetricsFile::~MetricsFile() {
    if (fd_ >= 0) {
        ::fdatasync(fd_);
        ::close(fd_);
    }
}

void MetricsFile::write(const nlohmann::json& record) {
    if (fd_ < 0) return;
    const std::string line = record.dump() + '\n';
    if (::write(fd_, line.data(), line.size()) != static_cast<ssize_t>(line.size()) && !warned_) {
        warned_ = true;
        spdlog::warn("--metrics-file {}: write failed ({}); training goes on", path_,
                     std::strerror(errno));
    }
}

void MetricsFile::sync() {
    if (fd_ >= 0) ::fdatasync(fd_);
}

MfuYardstick mfu_yardstick(const TrainOptions& o, int cores) {
    if (o.compute.peak_gflops > 0.0)
        return MfuYardstick{o.compute.peak_gflops, cores, "--peak-gflops"};
    const FmaPeak peak = measure_fma_peak();
    return MfuYardstick{peak.gflops, cores, fmt::format("{} measured on one core", peak.isa)};
}

}  // namespace gpt2
