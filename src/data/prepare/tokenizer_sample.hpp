// What prepare_data builds a char or BPE tokenizer from when the corpus may not fit in memory: the
// alphabet from a pass over the whole corpus, a BPE's training text from its first documents.
#pragma once

#include <cstdint>
#include <string>

#include "data/documents.hpp"

namespace gpt2 {

// The bytes that occur in the rest of the reader's corpus, in increasing order.
[[nodiscard]] std::string read_alphabet(DocumentReader& reader);

struct BpeSample {
    std::string text;
    std::uint64_t documents = 0;
    bool whole = true;  // the whole corpus; false: its first `limit` bytes or so
};

// The corpus's first pieces until the text holds at least `limit` bytes. With `separate_documents`
// each document after the first is preceded by the literal "<|endoftext|>", which BPE training
// treats as a document boundary.
[[nodiscard]] BpeSample read_bpe_sample(DocumentReader& reader, std::size_t limit,
                                        bool separate_documents);

}  // namespace gpt2
