// Where a run starts, decided on rank 0 before the corpus is read: fresh, from weights
// (--init-from: any model file), or from a checkpoint (--resume), and which tokenizer that implies.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "formats/checkpoint.hpp"
#include "optim/optimizer.hpp"
#include "train/options.hpp"

namespace gpt2 {

// Fresh, from weights (--init-from), or from a checkpoint (--resume). Decided on rank 0.
struct StartPoint {
    std::optional<LoadedModel> model;
    std::filesystem::path state_file;  // non-empty when resuming
    std::string source;                // how messages name where the weights came from
    // Resuming a LoRA run: the checkpoint's adapter directory (model_NNNNNN.adapter); `model`
    // then holds the base from --init-from with the checkpoint's tokenizer.
    std::filesystem::path adapter_dir;
    // Resuming a LoRA run that adapted a random base: `model` gives the shape and tokenizer only,
    // the base is built again from --seed.
    bool base_from_seed = false;
    // Resuming: the optimizer the state was trained with (--optimizer auto keeps it).
    std::optional<OptimizerKind> state_optimizer;
};

// Which tokenizer the run uses, decided on rank 0 before the corpus is read: the checkpoint's
// own (serialized), or one of --tokenizer's kinds. Flags that contradict the weights are refused.
struct TokenizerChoice {
    std::vector<std::uint8_t> from_checkpoint;
    TokenizerKind kind = TokenizerKind::Char;
    std::string reason;  // for the log: why this tokenizer
    bool preset_implies =
        false;  // gpt2 because --model is one of GPT-2's presets (the log says so)
};

// Finds the start and chooses the tokenizer (rank 0 only); logs what it chose. A LoRA run resumes
// on its base from --init-from (checked against the state's fingerprint) and its saved adapter.
// Flags that contradict the weights are refused (UsageError), unreadable files reported
// (InputError).
void choose_start(const TrainOptions& o, StartPoint& start, TokenizerChoice& choice);

}  // namespace gpt2
