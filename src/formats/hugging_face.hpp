// Hugging Face models, GPT-2 (GPT2LMHeadModel) and the Llama family (LlamaForCausalLM): a
// directory of config.json and model.safetensors (or shards named by
// model.safetensors.index.json), with vocab.json and merges.txt as the tokenizer. Read as the Hub
// stores them, written as save_pretrained writes them.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/checkpoint.hpp"
#include "formats/element_type.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {

// Whether `path` names a Hugging Face model: a directory (with config.json or model.safetensors
// or its index) or a .safetensors / .safetensors.index.json file.
[[nodiscard]] bool is_hugging_face_model(const std::filesystem::path& path);

// What a Hugging Face config.json says beyond the shape, for the log.
struct HuggingFaceNotes {
    std::vector<std::string> lines;  // e.g. "dropout in config.json not applied: ..."
};

// Reads a GPT-2 or Llama-family model from a directory, a model.safetensors file (config.json
// beside it) or an index of shards. GPT-2: names with or without "transformer.", Conv1D weights
// (in, out), the attention mask buffers present or not, lm_head.weight absent or equal to wte.
// Llama (model_type "llama"): q/k/v_proj into our qkvw's rows, gate/up_proj into fcw's, lm_head
// untied or (tie_word_embeddings) absent or equal to embed_tokens. F32, F16 and BF16 tensors.
// The directory's vocab.json + merges.txt, when present, become the tokenizer in `extras`.
// InputError naming the file and the field for anything that is not such a model.
[[nodiscard]] LoadedModel load_hugging_face_model(const std::filesystem::path& path,
                                                  HuggingFaceNotes* notes = nullptr);

// Writes `dir` as save_pretrained would (GPT2LMHeadModel, or LlamaForCausalLM for a Llama-family
// model; another architecture is refused by name): config.json, generation_config.json,
// model.safetensors
// (`type` F32, F16 or BF16; rows of the padded vocabulary dropped) and, when `tokenizer` is given,
// vocab.json, merges.txt and tokenizer_config.json (a char tokenizer as a BPE without merges, its
// bos/eos/unk null: it has no end-of-text token). The tokenizer must have a byte-level BPE form
// (spell_byte_level_bpe) and `dir` must be able to take the export
// (hugging_face_output_conflict), or InputError says why before anything is written. Files of a
// previous export that this one does not write (its tokenizer files) are removed.
void write_hugging_face_model(const std::filesystem::path& dir, const Model& model,
                              const Tokenizer* tokenizer, ElementType type);

// Why `dir` cannot take a Hugging Face export, or nullopt when it can: it is missing, empty, or
// holds only files an export writes (a previous export, replaced). Otherwise what follows the
// directory's name in an error, naming what is there ("holds files a Hugging Face export does not
// write (model_000600.bin, ...)"): a directory of checkpoints or anything else is never written
// into.
[[nodiscard]] std::optional<std::string> hugging_face_output_conflict(
    const std::filesystem::path& dir);
// What such an error advises.
inline constexpr std::string_view kHuggingFaceOutputAdvice =
    "name a new or empty directory (a previous export's is replaced)";

}  // namespace gpt2
