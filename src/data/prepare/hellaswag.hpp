// HellaSwag's JSONL (a ctx, its endings and the label per line) as llm.c's multiple-choice
// examples, tokenized as llm.c's dev/data/hellaswag.py does: the context as is, each ending after
// a space, no special tokens.
#pragma once

#include <filesystem>
#include <vector>

#include "data/multiple_choice.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {

// Reads and encodes every example of the file (blank lines skipped). InputError naming the file
// and line for a line that is no such example or whose label is not one of its endings, and for a
// file without examples.
[[nodiscard]] std::vector<MultipleChoiceExample> read_hellaswag(const std::filesystem::path& jsonl,
                                                                const Tokenizer& tokenizer);

}  // namespace gpt2
