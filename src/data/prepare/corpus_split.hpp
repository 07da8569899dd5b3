// How prepare_data splits a corpus into training and validation text: the first N documents
// (--val-documents), every round(1/fraction)-th document starting with the first, or, for one text
// file and for corpora of fewer documents than that, the text's last bytes (--val-fraction).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/documents.hpp"

namespace gpt2 {

struct CorpusSplitOptions {
    double val_fraction = 0.1;       // 0..0.99
    std::int64_t val_documents = 0;  // > 0: the first this many documents instead
    // How JSON Lines and Parquet are read when counting documents: as the preparation reads them.
    std::string text_field = "text";
    bool text_field_given = false;
    bool skip_bad_lines = false;
};

enum class ValidationRule {
    None,            // --val-fraction 0
    FirstDocuments,  // --val-documents N
    EveryNth,        // every round(1/fraction)-th document, starting with the first
    LastBytes,       // the text's last fraction of bytes, cut where the tokens cannot change
};

class CorpusSplit {
  public:
    // The split of the corpus of `files` (list_corpus_files). Counts the first documents (JSON
    // Lines and Parquet are read up to the count needed; a plain file is one document) to choose
    // the rule:
    // the last bytes for one text file and for fewer documents than round(1/fraction), whose
    // every-N-th document would be a far larger share than asked for. InputError for a single
    // text file that is empty (no bytes to split), what reading JSON Lines or Parquet throws and
    // what opening each Parquet file does (its footer and columns are checked first);
    // UsageError for --val-documents that leave no document for training and for a fraction
    // that would make every document validation.
    CorpusSplit(std::vector<CorpusFile> files, const CorpusSplitOptions& options);

    [[nodiscard]] const std::vector<CorpusFile>& files() const { return files_; }
    [[nodiscard]] std::uint64_t stored_bytes() const { return stored_bytes_; }
    // One plain text: its documents are not separated (no end-of-text tokens between them).
    [[nodiscard]] bool one_text() const { return one_text_; }
    [[nodiscard]] ValidationRule rule() const { return rule_; }
    // The number of documents when the count reached the end of the corpus (always for fewer
    // than round(1/fraction) or --val-documents + 1 of them), else nothing.
    [[nodiscard]] std::optional<std::uint64_t> documents() const { return documents_; }
    // LastBytes: validation starts at about byte val_from_byte() of document val_document(),
    // where the reader cuts it (DocumentReaderOptions::cut_at_byte; 0: no cut, the document is
    // validation from its start).
    [[nodiscard]] std::uint64_t val_document() const { return val_document_; }
    [[nodiscard]] std::uint64_t val_from_byte() const { return val_from_byte_; }
    [[nodiscard]] bool is_val(const DocumentPiece& piece) const;
    // What the rule does here, in words for the log ("validation: ...").
    [[nodiscard]] std::string describe() const;

  private:
    void count_documents(std::uint64_t limit, const CorpusSplitOptions& options);
    void split_last_bytes();

    std::vector<CorpusFile> files_;
    std::uint64_t stored_bytes_ = 0;
    bool one_text_ = false;
    double val_fraction_ = 0.0;
    ValidationRule rule_ = ValidationRule::None;
    std::optional<std::uint64_t> documents_;
    std::uint64_t val_documents_ = 0;
    std::uint64_t val_every_ = 0;  // EveryNth: every this-many-th document is validation
    std::uint64_t val_document_ = 0;
    std::uint64_t val_from_byte_ = 0;
    std::vector<std::uint64_t> document_bytes_;  // counted: each document's text size
    std::vector<std::size_t> document_file_;     // counted: each document's file
    std::uint64_t total_bytes_ = 0;              // LastBytes: of all documents
};

}  // namespace gpt2
