// The state of a DocumentReader (documents.hpp), shared by the document stream and its cutting
// (documents.cpp) and the record readers (document_records.cpp); private to data/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/byte_source.hpp"
#include "data/documents.hpp"
#include "data/parquet/parquet.hpp"

namespace gpt2 {

struct DocumentReader::Impl {
    std::vector<CorpusFile> files;
    DocumentReaderOptions options;
    std::size_t file = 0;                        // the file being read
    std::unique_ptr<detail::ByteSource> source;  // of files[file]
    std::uint64_t stored_done = 0;               // stored bytes of the files before it
    std::string pending;                         // read, not yet returned
    std::size_t head = 0;                        // JSON Lines: bytes of pending already consumed
    std::size_t scanned = 0;     // plain text: positions of pending checked for a cut
    std::size_t last_safe = 0;   // plain text: the largest safe one found (0: none)
    bool file_ended = false;     // source has nothing more
    std::uint64_t line = 0;      // JSONL: lines taken from this file
    std::uint64_t document = 0;  // next document's index
    std::uint64_t piece = 0;     // next piece's index
    std::uint64_t offset = 0;    // plain text: bytes of the document already returned
    bool in_document = false;    // plain text: a piece of this file was returned
    bool past_cut = false;       // plain text: the next piece starts after the forced cut
    std::uint64_t skipped = 0;
    std::string first_skipped;
    std::optional<DocumentPiece> rest;       // JSON Lines: the part of a cut document after the cut
    std::unique_ptr<ParquetReader> parquet;  // of files[file] when it is Parquet
    ParquetRecord record;                    // the Parquet row or JSON line being read
    std::uint64_t parquet_null_rows = 0;     // of the Parquet files before this one
    std::uint64_t parquet_null_messages = 0;

    bool fill();  // reads one more chunk into pending; false at the end of the file
    void open_next_file();
    bool safe(std::string_view text, std::size_t p) const {
        return !options.safe_cut || options.safe_cut(text, p);
    }
    void emit(DocumentPiece& out, std::size_t length, bool first);
    // Cuts a whole JSON Lines document where the options say (see DocumentReaderOptions), keeping
    // the part after the cut as the next piece.
    void cut_document(DocumentPiece& whole);
    // `out`, its text set, as the next whole document (JSON Lines or Parquet), cut where the
    // options say.
    void whole_document(DocumentPiece& out);
    bool next_plain(DocumentPiece& out);
    bool next_jsonl(DocumentPiece& out);
    bool next_parquet(DocumentPiece& out);
    // Counts a bad line or row, or (not skipping) stops with it.
    void bad_input(const std::string& where);
};

}  // namespace gpt2
