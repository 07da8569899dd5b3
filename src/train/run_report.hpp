// What the training program reports beside the loss: the run's configuration as JSON, the
// metrics file, the cores and the FLOP/s yardstick behind MFU, peak memory and the time.
#pragma once

#include <spdlog/fmt/fmt.h>

#include <nlohmann/json.hpp>
#include <string>

#include "model/model.hpp"
#include "parallel/comm.hpp"
#include "train/options.hpp"

namespace gpt2 {

// The process's peak resident set (bytes).
[[nodiscard]] double peak_rss_bytes();

// The run's model and training settings as a JSON document (stored in checkpoints).
[[nodiscard]] std::string config_json(const TrainOptions& o, const ModelConfig& c, int world,
                                      int workers);

// The CPU cores the job's workers can actually use (for MFU): per host, the workers of all its
// ranks, capped at the host's cores. Warns (on rank 0) when workers outnumber CPUs, and when the
// ranks' affinity masks leave cores of their launcher's idle (mpirun's binding). Collective.
[[nodiscard]] int cores_in_use(const Communicator& comm, int workers);

// Now in UTC, ISO 8601 to the second.
[[nodiscard]] std::string iso_time_now();

// One JSON object per line, appended with a single write() so that a crash never leaves half a
// record behind a complete one; flushed to disk (fdatasync) with every checkpoint and at the end.
// An empty path writes nothing.
class MetricsFile {
  public:
    explicit MetricsFile(const std::string& path);
    ~MetricsFile();
    MetricsFile(const MetricsFile&) = delete;
    MetricsFile& operator=(const MetricsFile&) = delete;

    void write(const nlohmann::json& record);
    void sync();

  private:
    std::string path_;
    int fd_ = -1;
    bool warned_ = false;
};

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

[[nodiscard]] MfuYardstick mfu_yardstick(const TrainOptions& o, int cores);

}  // namespace gpt2
