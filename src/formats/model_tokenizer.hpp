// Which tokenizer goes with a model file: the one rule train_gpt2 (--init-from, --resume) and
// inference share. The tokenizer the file carries comes first (our checkpoint's, a Hugging Face
// directory's vocab.json + merges.txt); without one, the tokenizer the command line names; without
// that, GPT-2's for a model of GPT-2's vocabulary (a plain llm.c model file such as gpt2_124M.bin).
#pragma once

#include <memory>

#include "formats/checkpoint.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {

enum class ModelTokenizerSource {
    Embedded,   // the file carries one: it wins, and a named one must agree with it
    Requested,  // the file carries none; the command line names one (--tokenizer)
    Gpt2,       // neither, and the vocabulary is GPT-2's: GPT-2's tokenizer (--tokenizer-dir)
    Unknown,    // neither, and GPT-2's cannot fit the vocabulary: the program must refuse
};

// Whether the file carries a tokenizer (a checkpoint's empty one counts as none).
[[nodiscard]] bool carries_tokenizer(const LoadedModel& model);

// Where the tokenizer of `model` comes from; `requested`: the command line names one.
[[nodiscard]] ModelTokenizerSource model_tokenizer_source(const LoadedModel& model, bool requested);

// The tokenizer the file carries (nullptr if none); throws what deserialize_tokenizer throws.
[[nodiscard]] std::unique_ptr<Tokenizer> embedded_tokenizer(const LoadedModel& model);

}  // namespace gpt2
