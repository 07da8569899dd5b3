// Resume state and the checkpoint directory. A checkpoint at step N is two files written by rank
// 0: model_N.bin (self-contained: weights, tokenizer, configuration) and then state_N.bin (AdamW
// moments, step, RNG, the batch composition). A state file's presence means its model is complete.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "gpt2/model.hpp"
#include "gpt2/optimizer.hpp"
#include "gpt2/random.hpp"

namespace gpt2 {

struct ResumeState {
    std::int64_t step = 0;  // optimizer steps completed
    std::uint64_t seed = 0;
    std::int64_t sequences_per_step = 0;  // global batch in sequences (the data position)
    std::int32_t seq_len = 0;
    Rng::State sample_rng{};
};

void save_resume_state(const std::filesystem::path& path, const ResumeState& state,
                       const ModelConfig& config, const AdamWState& optimizer);
// Loads into `optimizer` (sized for config). InputError naming the file on any mismatch or damage.
[[nodiscard]] ResumeState load_resume_state(const std::filesystem::path& path,
                                            const ModelConfig& config, AdamWState& optimizer);
// Whether the file begins like a resume state (reads 8 bytes; false if it cannot be read): lets a
// program that wants a model say what it was given rather than report a bad magic number.
[[nodiscard]] bool is_resume_state_file(const std::filesystem::path& path);

[[nodiscard]] std::filesystem::path model_path(const std::filesystem::path& dir, std::int64_t step);
[[nodiscard]] std::filesystem::path state_path(const std::filesystem::path& dir, std::int64_t step);
// Steps with both files present, newest first.
[[nodiscard]] std::vector<std::int64_t> list_checkpoints(const std::filesystem::path& dir);
// Deletes all but the newest `keep` checkpoints (keep 0: keep all).
void prune_checkpoints(const std::filesystem::path& dir, int keep);
// The step encoded in a state or model file name, if it is one.
[[nodiscard]] std::optional<std::int64_t> checkpoint_step(const std::filesystem::path& file);

}  // namespace gpt2
