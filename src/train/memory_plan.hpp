// What a rank's memory will hold before anything large is allocated: each worker's context by
// part, the gradient windows and the rank's own buffers; --recompute auto's choice, and one clear
// refusal (naming flags that would fit) instead of the kernel's OOM killer mid-run.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "core/system_memory.hpp"
#include "model/lora.hpp"
#include "model/training_context.hpp"
#include "optim/optimizer.hpp"

namespace gpt2 {

class Communicator;
struct TrainOptions;

// One rank's need for a given shape, batch, thread count and recompute level.
struct MemoryNeed {
    Recompute recompute = Recompute::Cheap;
    int workers = 0;         // worker threads of the rank
    int with_sequences = 0;  // workers that hold sequences: min(workers, batch)
    int sequences_per_worker = 0;
    int seq_len = 0;
    std::vector<ContextPart> worker_parts;  // one such worker's context
    std::size_t worker_bytes = 0;           // their sum
    std::size_t windows_bytes = 0;          // every worker's gradient window
    std::size_t rank_bytes = 0;             // weights (and bf16 copy), gradient, AdamW moments
    // LoRA (adapter_floats > 0): rank_bytes is the frozen weights (and bf16 copy), the adapter
    // (its weights, every worker's gradient of it and scratch), its AdamW moments, and the buffer
    // a checkpoint merges one adapted matrix in (merged_lora_pieces); no model gradient, no
    // windows.
    std::size_t adapter_floats = 0;
    std::size_t frozen_bytes = 0;
    std::size_t adapter_bytes = 0;
    std::size_t adapter_moment_bytes = 0;
    std::size_t merge_buffer_bytes = 0;
    [[nodiscard]] std::size_t total() const {
        return static_cast<std::size_t>(with_sequences) * worker_bytes + windows_bytes + rank_bytes;
    }
};

// `moment_parts`: how many ranks hold a part of the optimizer's state (ZeRO-1 or shared-memory
// slices), 1 when every rank holds it all; `optimizer` says how much it keeps per parameter.
// `lora`: only an adapter of that shape trains (LoRA), the base frozen; with LoRA's input dropout
// each worker keeps its dropped input in scratch. `layer_matrices_bf16_only` (--lora-base bf16):
// the frozen base's layer matrices without their fp32 copies.
[[nodiscard]] MemoryNeed memory_need(const ModelConfig& config, int workers, int batch_size,
                                     int seq_len, Precision precision, Recompute recompute,
                                     int moment_parts,
                                     const std::optional<LoraConfig>& lora = std::nullopt,
                                     bool layer_matrices_bf16_only = false,
                                     OptimizerKind optimizer = OptimizerKind::AdamW);

// The level the run trains with and what it needs, decided on every rank alike.
struct MemoryPlan {
    MemoryNeed need;
    int ranks_on_machine = 1;
    std::optional<AvailableMemory> available;  // this machine's, when it could be read
    bool chosen_automatically = false;
};

// Collective. Picks --recompute's level (auto: cheap when it fits on every machine, else layers)
// and checks that each machine's ranks fit in its available memory. When they do not, the first
// rank that does not fit throws InputError with one line: what is needed, what is available and
// which flags would fit; the other ranks wait to be ended with it.
[[nodiscard]] MemoryPlan plan_memory(const TrainOptions& o, const Communicator& comm,
                                     const Communicator& machine, const ModelConfig& config,
                                     int workers, int moment_parts,
                                     const std::optional<LoraConfig>& lora = std::nullopt);

// The start-up log's table: bytes per worker by part, and the rank's total (one line each).
[[nodiscard]] std::vector<std::string> describe_memory(const MemoryPlan& plan);

}  // namespace gpt2
