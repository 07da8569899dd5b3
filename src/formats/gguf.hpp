// GGUF version 3 files for llama.cpp's "gpt2" architecture, written and read: metadata, the
// byte-level BPE tokenizer embedded (GPT-2's, a trained one, or a char tokenizer as one without
// merges), and the weights as F32, F16, BF16 or Q8_0 (ggml's 32-value blocks with an f16 scale);
// 1-D tensors stay F32. And LoRA adapters as llama.cpp loads them beside such a file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "formats/checkpoint.hpp"
#include "model/lora.hpp"
#include "model/model.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {

enum class GgufWeights { F32, F16, Bf16, Q8_0 };

// One Q8_0 block as ggml stores it: an f16 scale d = max|x| / 127, then round(x / d) as int8.
inline constexpr int kQ8Block = 32;
// Appends the blocks of `values` (a multiple of 32 long) to out.
void append_q8_0(std::vector<std::uint8_t>& out, std::span<const float> values);

// Writes `path` atomically. The tokenizer must have a byte-level BPE form (gpt2, char, or a
// trained bpe without duplicate spellings): InputError says why otherwise, before anything is
// written. A char tokenizer has no end-of-text: llama.cpp gets its newline as bos/eos.
// Q8_0 needs the channel count to be a multiple of 32 (InputError otherwise). GPT-2 is llama.cpp's
// gpt2 architecture; the Llama family's block (RMSNorm with gains, rotary, SwiGLU, no biases) its
// llama, Q and K rows in its rotary's order; another architecture is an InputError.
void write_gguf(const std::filesystem::path& path, const Model& model, const Tokenizer& tokenizer,
                GgufWeights weights, const std::string& name);

// Writes `adapter` atomically as a GGUF LoRA adapter for a base model that write_gguf wrote
// (llama.cpp's llama_adapter_lora_init): general.type "adapter", adapter.type "lora",
// adapter.lora.alpha, and for each adapted weight of the base, blk.<l>.<name>.weight.lora_a
// (ne {in, r}) and .lora_b (ne {r, out}), which llama.cpp adds as (alpha/r) B (A x) times the
// adapter's scale. F32, F16 or BF16 (InputError for Q8_0: rows as long as the rank).
void write_gguf_lora(const std::filesystem::path& path, const LoraAdapter& adapter,
                     GgufWeights weights, const std::string& name);

// Reads a GGUF model of llama.cpp's gpt2 architecture (version 2 or 3; llama.cpp's own files, or
// write_gguf's): the shape from gpt2.*, the embedded tokenizer (tokenizer.ggml.tokens and merges)
// as the checkpoint's own, and the weights widened to fp32 from F32, F16, BF16 or Q8_0 (an
// output.weight, which llama.cpp's converter writes as a copy of token_embd, must be that copy:
// GPT-2 ties its head). InputError naming the file and what it is otherwise: another architecture
// ("llama"), a LoRA adapter, a tensor type the programs do not read, a damaged file.
[[nodiscard]] LoadedModel load_gguf_model(const std::filesystem::path& path);

}  // namespace gpt2
