// Resume state and the checkpoint directory. A checkpoint at step N is two files written by rank
// 0: model_N.bin (self-contained: weights, tokenizer, configuration) and then state_N.bin (the
// optimizer's kind and state, step, RNG, the batch composition). A state file's presence means its
// model is complete.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/random.hpp"
#include "model/lora.hpp"
#include "model/model.hpp"
#include "optim/optimizer.hpp"
#include "optim/spike_guard.hpp"

namespace gpt2 {

// What a LoRA run's state records beside the adapter's moments (version 5, version 4 without the
// dropout rate, version 9 for a model that is not GPT-2; full training writes version 3, without
// it): the adapter's configuration with its
// input dropout and the frozen base it adapted, which a resume loads again (the checkpoint's model
// file holds the merged weights, not the base).
struct LoraRecord {
    LoraConfig config;                   // rank 0: full training
    bool base_from_file = false;         // the base came from --init-from (else from --seed)
    std::uint64_t base_fingerprint = 0;  // lora_base_fingerprint of the base's fp32 weights
    LoraModules modules;  // the projections the model offers (read from the header's model)
};

struct ResumeState {
    std::int64_t step = 0;  // optimizer steps completed
    std::uint64_t seed = 0;
    std::int64_t sequences_per_step = 0;  // global batch in sequences (the data position)
    std::int32_t seq_len = 0;
    Rng::State sample_rng{};
    // The run's lineage: drawn when a run starts fresh, kept by every resume. Pruning only ever
    // removes checkpoints of its own lineage. 0: unknown (files of format version 1).
    std::uint64_t run_id = 0;
    // The learning-rate schedule's length, fixed when the run started (0: unknown, version 1), so
    // that resuming with a larger --max-steps does not make the learning rate jump.
    std::int64_t lr_decay_steps = 0;
    // The loss-spike windows (version 3; empty before), so skipping decides as if uninterrupted.
    SpikeWindow loss_window;
    SpikeWindow norm_window;
    LoraRecord lora;  // a LoRA run's (config.rank > 0), else empty
    // The optimizer whose state the file holds (version 6; AdamW before).
    OptimizerKind optimizer = OptimizerKind::AdamW;
};

// The 64-bit fingerprint of a LoRA run's frozen base weights that its state records.
[[nodiscard]] std::uint64_t lora_base_fingerprint(std::span<const float> base);

void save_resume_state(const std::filesystem::path& path, const ResumeState& state,
                       const ModelConfig& config, const OptimizerState& optimizer);
// The size in bytes of the state file save_resume_state writes for optimizer state of
// `moment_floats` values per buffer (a LoRA run's state, a Muon run's and one of a model that is
// not GPT-2 have longer headers).
[[nodiscard]] std::uintmax_t resume_state_file_bytes(std::size_t moment_floats, bool lora,
                                                     OptimizerKind optimizer = OptimizerKind::AdamW,
                                                     bool gpt2 = true);
// Loads into `optimizer` (sized for config). InputError naming the file on any mismatch or damage.
[[nodiscard]] ResumeState load_resume_state(const std::filesystem::path& path,
                                            const ModelConfig& config, OptimizerState& optimizer);
// Checks a state file whole without loading it into an optimizer (its header, its size for the
// parameter count the header gives, its checksum; read a piece at a time): InputError naming the
// file and what is wrong. --resume auto skips a checkpoint whose state does not verify.
void verify_resume_state(const std::filesystem::path& path);
// The lineage of a state file from its header alone; nullopt if unreadable or of version 1.
[[nodiscard]] std::optional<std::uint64_t> read_run_id(const std::filesystem::path& path);
// A state file's header alone (nullopt if unreadable: loading it reports why), so that flags that
// contradict it (another sequence length, LoRA or not) are refused before the corpus is read.
[[nodiscard]] std::optional<ResumeState> read_state_header(const std::filesystem::path& path);
// The sequence length a state file was trained with, from its header alone (nullopt if
// unreadable: loading it reports why), so that a different --seq-len is refused before the corpus.
[[nodiscard]] std::optional<std::int32_t> read_state_seq_len(const std::filesystem::path& path);
// Whether the file begins like a resume state (reads 8 bytes; false if it cannot be read): lets a
// program that wants a model say what it was given rather than report a bad magic number.
[[nodiscard]] bool is_resume_state_file(const std::filesystem::path& path);

[[nodiscard]] std::filesystem::path model_path(const std::filesystem::path& dir, std::int64_t step);
[[nodiscard]] std::filesystem::path state_path(const std::filesystem::path& dir, std::int64_t step);
// A LoRA run's adapter beside its checkpoint: model_NNNNNN.adapter, a PEFT directory.
[[nodiscard]] std::filesystem::path adapter_path(const std::filesystem::path& dir,
                                                 std::int64_t step);
// Steps with both files present, newest first. A file whose name looks like a checkpoint's but
// whose step does not fit 64 bits is skipped, and named in `not_ours` when given (for the log).
[[nodiscard]] std::vector<std::int64_t> list_checkpoints(
    const std::filesystem::path& dir, std::vector<std::filesystem::path>* not_ours = nullptr);
// Every model_N.bin / state_N.bin file name in `dir`, sorted (complete checkpoints or not).
[[nodiscard]] std::vector<std::string> checkpoint_file_names(const std::filesystem::path& dir);
// Deletes all but the newest `keep` checkpoints of lineage `run_id` at or before step `saved`
// (the one just written; keep 0: keep all), with their adapter directories. Other runs'
// checkpoints, files whose lineage cannot be read, and this lineage's checkpoints after `saved`
// (newer ones a --resume auto skipped as damaged, which would otherwise count as the newest and
// have the one just written deleted) are never touched.
void prune_checkpoints(const std::filesystem::path& dir, int keep, std::uint64_t run_id,
                       std::int64_t saved);
// The step encoded in a state or model file name, if it is one.
[[nodiscard]] std::optional<std::int64_t> checkpoint_step(const std::filesystem::path& file);

}  // namespace gpt2
