// LoRA adapters as Hugging Face PEFT saves them: a directory with adapter_config.json and
// adapter_model.safetensors, tensors named
// base_model.model.transformer.h.<l>.<module>.lora_A.weight (r, in) and .lora_B.weight (out, r),
// the layout GPT-2's Conv1D layers get from PEFT.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "model/lora.hpp"
#include "model/model.hpp"

namespace gpt2 {

// PEFT's name of layer l's A (or B) for target t.
[[nodiscard]] std::string peft_tensor_name(int l, LoraTarget t, bool b_matrix);

// Writes `adapter` into directory `dir` (created; both files replaced atomically) with
// `base_model` as base_model_name_or_path. Returns dir. InputError naming the file on failure.
std::filesystem::path write_peft_adapter(const std::filesystem::path& dir,
                                         const LoraAdapter& adapter, const std::string& base_model);

// Reads a PEFT directory for a model of shape `model`: rank, alpha and targets from
// adapter_config.json (r, lora_alpha, target_modules; fan_in_fan_out, bias "none" and no
// rank/alpha patterns checked), every A and B from adapter_model.safetensors (F32, F16 or BF16).
// InputError naming the file and the key or tensor at fault (a missing or misshapen tensor, an
// unsupported option such as use_dora or a bias, targets that are not GPT-2's projections).
[[nodiscard]] std::unique_ptr<LoraAdapter> read_peft_adapter(const std::filesystem::path& dir,
                                                             const ModelConfig& model);

}  // namespace gpt2
