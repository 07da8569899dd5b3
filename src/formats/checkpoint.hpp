// Checkpoint files. The model part is llm.c's model file byte for byte (header[256] + float32
// parameters), so llm.c reads our weights and we read gpt2_124M.bin; a tagged trailer after it
// makes a checkpoint self-contained (tokenizer, configuration), and a checksum guards it all.
// Every write is atomic: temporary file, fsync, rename, directory fsync.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/file_io.hpp"
#include "core/file_kinds.hpp"
#include "model/model.hpp"

namespace gpt2 {

inline constexpr std::int32_t kLlmcModelVersionFp32 = 3;
inline constexpr std::int32_t kLlmcModelVersionBf16 = 5;  // widened to fp32 when read
// A checkpoint of a model that is not GPT-2 (ModelConfig::is_gpt2): fp32 weights as in version 3,
// the architecture in the trailer's configuration record. llm.c refuses it (it reads 3 and 5);
// GPT-2 checkpoints stay version 3, byte for byte what earlier builds wrote.
inline constexpr std::int32_t kModelVersionWithRecord = 30;

// What a checkpoint carries besides the weights.
struct CheckpointExtras {
    std::vector<std::uint8_t> tokenizer;  // serialized tokenizer (empty: none)
    std::string config_json;              // model and training configuration
};

struct LoadedModel {
    Model model;
    std::optional<CheckpointExtras> extras;  // absent for a plain llm.c model file
};

// Writes `path` atomically; returns it. Throws InputError naming the file on failure, leaving any
// previous file at `path` untouched. A model that is not GPT-2 is written as version 30 with its
// configuration record in the trailer (a trailer even without extras).
std::filesystem::path save_checkpoint(const std::filesystem::path& path, const Model& model,
                                      const std::optional<CheckpointExtras>& extras);

// The parameters of a model handed over in order a piece at a time: called once, a source passes
// its sink consecutive pieces that together are the whole parameter buffer (ParameterLayout's
// order), each valid only during the call. A checkpoint is then written without the buffer in
// memory at once (a LoRA run's merged weights, model/lora.hpp's merged_lora_pieces).
using ParameterSink = std::function<void(std::span<const float>)>;
using ParameterSource = std::function<void(const ParameterSink&)>;
// save_checkpoint of a `config` model whose parameters `source` produces: the same bytes as the
// whole buffer would give. std::logic_error (nothing written) if the pieces do not add up to the
// model's parameter count.
std::filesystem::path save_checkpoint(const std::filesystem::path& path, const ModelConfig& config,
                                      const ParameterSource& source,
                                      const std::optional<CheckpointExtras>& extras);
// The size in bytes of the file save_checkpoint writes for a `config` model with extras of these
// sizes (a serialized tokenizer and a configuration document), for checking the room beforehand.
[[nodiscard]] std::uintmax_t checkpoint_file_bytes(const ModelConfig& config,
                                                   std::size_t tokenizer_bytes,
                                                   std::size_t config_json_bytes);
// Writes llm.c's model file, version 3 (fp32: save_checkpoint without extras) or 5 (bf16, each
// weight rounded to nearest even), atomically; returns path. llm.c's files hold GPT-2 only: another
// architecture is an InputError naming the file.
std::filesystem::path save_llmc_model(const std::filesystem::path& path, const Model& model,
                                      std::int32_t version);
// Reads a plain llm.c model file (fp32, version 3, or bf16, version 5) or a checkpoint (version 3,
// or 30 with its configuration record); verifies the checksum when present. Throws InputError
// naming the file for anything missing, truncated, corrupt or of the wrong kind.
[[nodiscard]] LoadedModel load_checkpoint(const std::filesystem::path& path);

// What an existing file is, judged by its first and last bytes (the weights are not read): a plain
// llm.c model file, one of our checkpoints (an llm.c model file ending in our trailer's footer),
// or something else (a resume state, any other file, or no file).
enum class ModelFileKind { PlainLlmc, Checkpoint, Other };
[[nodiscard]] ModelFileKind model_file_kind(const std::filesystem::path& path);

}  // namespace gpt2
