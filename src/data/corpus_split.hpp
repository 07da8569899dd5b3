// How prepare_data splits a corpus into training and validation text: a single plain text file by
// bytes (its last ones are validation), documents by index (every round(1/fraction)-th starting
// with the first, or the first N).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "data/documents.hpp"

namespace gpt2 {

class CorpusSplit {
  public:
    // The corpus of `files` (list_corpus_files), validation by `val_fraction` (0..0.99) or, when
    // val_documents > 0, its first val_documents documents. InputError for a single text file
    // that is empty (no bytes to split).
    CorpusSplit(std::vector<CorpusFile> files, double val_fraction, std::int64_t val_documents);

    [[nodiscard]] const std::vector<CorpusFile>& files() const { return files_; }
    [[nodiscard]] std::uint64_t stored_bytes() const { return stored_bytes_; }
    // One plain text: its documents are not separated (no end-of-text tokens between them).
    [[nodiscard]] bool one_text() const { return one_text_; }
    // One text: the reader must also cut the text at the first safe position at or after this
    // byte (0: nowhere), where validation starts.
    [[nodiscard]] std::uint64_t val_from_byte() const { return val_from_byte_; }
    [[nodiscard]] bool is_val(const DocumentPiece& piece) const;

  private:
    std::vector<CorpusFile> files_;
    std::uint64_t stored_bytes_ = 0;
    bool one_text_ = false;
    std::uint64_t val_from_byte_ = 0;
    std::uint64_t val_documents_ = 0;
    std::uint64_t val_every_ = 0;  // documents: every this-many-th is validation (0: none)
};

}  // namespace gpt2
