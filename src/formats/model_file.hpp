// One entry point for every model file the programs read: a Hugging Face GPT-2 (directory,
// model.safetensors or shard index), llm.c's model file, or our checkpoint.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "formats/checkpoint.hpp"

namespace gpt2 {

// Reads `path` in whichever format it is. `notes`, when given, receives what the file asks for
// that is not applied (a Hugging Face config's dropout, say), for the log. InputError naming the
// file otherwise.
[[nodiscard]] LoadedModel load_model_file(const std::filesystem::path& path,
                                          std::vector<std::string>* notes = nullptr);

}  // namespace gpt2
