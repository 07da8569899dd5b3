// One entry point for every model file the programs read: a Hugging Face GPT-2 or Llama (directory,
// model.safetensors or shard index), llm.c's model file, or our checkpoint; and for the formats a
// model is converted to (convert_model): Hugging Face, GGUF or llm.c's model file, and a LoRA
// adapter as a GGUF adapter for llama.cpp.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "formats/checkpoint.hpp"
#include "model/lora.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {

// Reads `path` in whichever format it is; a directory of our checkpoints (a run's --out-dir)
// means its newest model file that verifies. `notes`, when given, receives what the log should
// say: which checkpoint a directory gave, a damaged one skipped, what a file asks for that is not
// applied (a Hugging Face config's dropout, say). InputError naming the file otherwise.
[[nodiscard]] LoadedModel load_model_file(const std::filesystem::path& path,
                                          std::vector<std::string>* notes = nullptr);

// GgufLora: not the model but the adapter --lora-from names, as a GGUF LoRA adapter.
enum class OutputFormat { HuggingFace, Gguf, Llmc, GgufLora };

// The format `path` asks for: `to` ("hf", "gguf", "llmc" or "gguf-lora") when not empty, else a
// .gguf or .bin name, else a Hugging Face directory.
[[nodiscard]] OutputFormat output_format(const std::filesystem::path& path, std::string_view to);

// A conversion's output, as convert_model's flags give it.
struct ModelOutput {
    std::filesystem::path path;  // Hugging Face: the directory (see checked_model_output)
    OutputFormat format = OutputFormat::HuggingFace;
    std::string dtype = "f32";  // f32 | f16 | bf16 | q8_0, as far as the format has it
    bool weights_only = false;  // Hugging Face output without tokenizer files
    std::string name;           // GGUF's general.name (empty: the path's stem)
};

// `output` checked before anything is read, with a Hugging Face output's path made the directory
// it writes: DIR/model.safetensors means DIR (the files go beside it, as our reader and
// transformers read them). UsageError for an output no format can give or that would overwrite
// something else: a dtype the format does not have, --weights-only for other than Hugging Face,
// --name for other than GGUF, the output being `input`, another *.safetensors name, a directory
// holding files a Hugging Face export does not write (checkpoints, say), an existing file that is
// not a previous output of the same format (a checkpoint is never overwritten).
[[nodiscard]] ModelOutput checked_model_output(ModelOutput output,
                                               const std::filesystem::path& input);

// Where a conversion's tokenizer comes from: the input's own, else GPT-2's from `dir`. `given`:
// the command line names `dir`; otherwise it is the default (data/gpt2), used only for an input of
// GPT-2's vocabulary without a tokenizer and an output that holds one.
struct TokenizerDir {
    std::filesystem::path path;
    bool given = false;
};

// The tokenizer a conversion writes (null: none). UsageError for a directory given for an input
// that has its own; InputError for one whose vocabulary is not the model's, or a default one that
// cannot be loaded where it is needed.
struct OutputTokenizer {
    std::unique_ptr<Tokenizer> tokenizer;  // null: none
    std::string origin;                    // for the log: "the input's own", "GPT-2's from DIR"
};
[[nodiscard]] OutputTokenizer output_tokenizer(const LoadedModel& loaded,
                                               const std::filesystem::path& input,
                                               const TokenizerDir& dir, const ModelOutput& output);

// The PEFT adapter directory --lora-from names (`dir`; empty: none), checked before the model is
// read: UsageError for a gguf-lora output without one; InputError naming --lora-from for a
// directory that is not there or lacks adapter_config.json or adapter_model.safetensors.
void check_lora_source(const std::filesystem::path& dir, OutputFormat format);

// "LoRA r=8, alpha 16 (scale 2), targets c_attn,c_proj", for the log.
[[nodiscard]] std::string describe_adapter(const LoraConfig& config);

// Writes `adapter` as a gguf-lora `output` asks (write_gguf_lora); returns what was written, for
// the log.
std::string write_lora_adapter_file(const ModelOutput& output, const LoraAdapter& adapter);

// Writes `model` (read from `input`, which errors name) as `output` asks (not gguf-lora), with
// `tokenizer` (null: none) where the format holds one; InputError, before anything is written, for
// a GGUF file without a tokenizer. Returns what was written, for the log ("GGUF v3, ..."); `notes`
// receives what the output leaves out that a user may want.
std::string write_model_file(const ModelOutput& output, const Model& model,
                             const Tokenizer* tokenizer, const std::filesystem::path& input,
                             std::vector<std::string>& notes);

}  // namespace gpt2
