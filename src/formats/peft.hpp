// LoRA adapters as Hugging Face PEFT saves them: a directory with adapter_config.json and
// adapter_model.safetensors, tensors named base_model.model.transformer.h.<l>.<module> (GPT-2) or
// base_model.model.model.layers.<l>.<module> (the Llama family) + .lora_A.weight (r, in) and
// .lora_B.weight (out, r).
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
// adapter_config.json (r, lora_alpha, target_modules as a list or "all-linear"; bias "none", no
// rank/alpha patterns and, for the Llama family, no fan_in_fan_out checked), every A and B from
// adapter_model.safetensors (F32, F16 or BF16). InputError naming the file and the key or tensor
// at fault (a missing or misshapen tensor, an unsupported option such as use_dora or a bias,
// targets that are not the model's projections: GPT-2's, or the Llama family's).
[[nodiscard]] std::unique_ptr<LoraAdapter> read_peft_adapter(const std::filesystem::path& dir,
                                                             const ModelConfig& model);

}  // namespace gpt2
