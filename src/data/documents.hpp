// The documents of a corpus spread over many files: plain text (a file is one document) and JSON
// Lines (a line is one document, a string field), each possibly gzip- or zstd-compressed, read in
// a fixed order and in pieces of bounded size, so that corpora larger than memory stream through.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gpt2 {

struct CorpusFile {
    std::filesystem::path path;
    bool jsonl = false;        // *.jsonl, *.jsonl.gz, *.jsonl.zst
    std::uintmax_t bytes = 0;  // as stored (compressed size for .gz/.zst)
};

// The files of `inputs` in order: each file as given, each directory recursively in sorted path
// order keeping the names that match `glob` (fnmatch, "*": all). Throws InputError naming a
// missing input or a directory without a matching file (after `input_flag`, the flag that named
// the inputs).
[[nodiscard]] std::vector<CorpusFile> list_corpus_files(
    std::span<const std::filesystem::path> inputs, const std::string& glob,
    std::string_view input_flag = "--data");

// A piece of a document: JSON Lines documents come whole (but where the options say); plain text
// is cut, only where `safe_cut` allows, after about piece_bytes (or where the options say).
struct DocumentPiece {
    std::string text;
    std::uint64_t document = 0;  // index in the corpus
    std::uint64_t index = 0;     // index of the piece in the corpus
    bool first = true;           // the document's first piece
    std::uint64_t offset = 0;    // of the piece's first byte within its document
    bool after_cut = false;      // in the document cut where the options say: after the cut
};

struct DocumentReaderOptions {
    std::string jsonl_field = "text";
    bool skip_bad_lines = false;  // count and skip a bad JSONL line instead of failing
    std::size_t piece_bytes = std::size_t{4} << 20;
    // Whether text may be cut before position p (0 < p < text.size()) without changing its
    // tokens: the tokenizer's rule. Unset: anywhere.
    std::function<bool(std::string_view text, std::size_t p)> safe_cut;
    // Also cut document `cut_document` (plain text or JSON Lines) at the first safe position at or
    // after byte cut_at_byte (0: nowhere), or, with none, at the last one before it (or its start),
    // so that the bytes before and after it can go to different splits: the pieces after the cut
    // are marked (DocumentPiece::after_cut).
    std::uint64_t cut_document = 0;
    std::uint64_t cut_at_byte = 0;
};

class DocumentReader {
  public:
    DocumentReader(std::vector<CorpusFile> files, DocumentReaderOptions options);
    ~DocumentReader();
    DocumentReader(const DocumentReader&) = delete;
    DocumentReader& operator=(const DocumentReader&) = delete;

    // The next piece in corpus order; false at the end. Throws InputError naming the file (and
    // line) for unreadable or corrupt input and, unless skipping, a bad JSON line: not JSON, not
    // an object, no string field, invalid UTF-8.
    [[nodiscard]] bool next(DocumentPiece& piece);
    // Bytes of the files consumed so far, as stored (what progress is measured against).
    [[nodiscard]] std::uint64_t stored_bytes_read() const;
    [[nodiscard]] std::uint64_t skipped_lines() const;
    [[nodiscard]] const std::string& first_skipped() const;  // "file:line: reason"

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// The uncompressed size of a file (reads a compressed one through).
[[nodiscard]] std::uint64_t uncompressed_bytes(const CorpusFile& file);

}  // namespace gpt2
