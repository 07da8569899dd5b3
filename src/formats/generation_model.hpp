// A model with its tokenizer, ready for generation: what build/inference and build/serve load
// (any model file the programs read, with the tokenizer rule of model_tokenizer.hpp and the checks
// that keep generated ids printable).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/model.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {

// The tokenizer flags of a generating program: --tokenizer (empty: none given), --tokenizer-dir
// (GPT-2's encoder.json and vocab.bpe), --tokenizer-corpus (the text a char or BPE tokenizer is
// rebuilt from).
struct TokenizerRequest {
    std::string name;
    std::string dir = "data/gpt2";
    std::string corpus;
};

struct GenerationModel {
    Model model;
    std::unique_ptr<Tokenizer> tokenizer;  // its vocabulary at most the model's
    std::string tokenizer_origin;          // "from the checkpoint", "from data/gpt2", ...
    std::vector<std::string> notes;        // what loading noticed, for the log
};

// Loads `path` (a checkpoint, its directory, an llm.c, Hugging Face or GGUF model) and its
// tokenizer. Throws InputError for a resume state given as a model (naming the model file to
// use) or an unreadable tokenizer, UsageError for a --tokenizer that contradicts the file's own or
// cannot have the model's vocabulary.
[[nodiscard]] GenerationModel load_generation_model(const std::string& path,
                                                    const TokenizerRequest& request);

// "gpt2 (vocab 50257)": a tokenizer for messages.
[[nodiscard]] std::string describe_tokenizer(const Tokenizer& tokenizer);

}  // namespace gpt2
