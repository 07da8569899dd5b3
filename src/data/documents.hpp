// The documents of a corpus spread over many files: plain text (a file is one document), JSON Lines
// (a line is one document, a string field), each possibly gzip- or zstd-compressed, and Parquet (a
// row is one document: a string column, prompt/response or chat data), read in a fixed order and
// in pieces of bounded size, so that corpora larger than memory stream through. Text inputs must
// be text: binary data (a Parquet, gzip or zstd file under another name, a token shard, a
// checkpoint) is refused, never tokenized.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/text_spans.hpp"

namespace gpt2 {

enum class CorpusFormat {
    Text,       // anything else: one document (.gz/.zst decompressed)
    JsonLines,  // *.jsonl, *.jsonl.gz, *.jsonl.zst
    Parquet,    // *.parquet
};

struct CorpusFile {
    std::filesystem::path path;
    CorpusFormat format = CorpusFormat::Text;
    std::uintmax_t bytes = 0;  // as stored (compressed size for .gz/.zst)
};

// The files of `inputs` in order: each file as given, each directory recursively in sorted path
// order keeping the names that match `glob` (fnmatch, "*": all), and an input that does not exist
// but is a glob(3) pattern ('dir/*.parquet', quoted) as the files and directories it matches, in
// sorted order. Throws InputError naming a missing input, a pattern or directory without a
// matching file (after `input_flag`, the flag that named the inputs), and a text or JSON Lines file
// whose first bytes are binary (see binary_content).
[[nodiscard]] std::vector<CorpusFile> list_corpus_files(
    std::span<const std::filesystem::path> inputs, const std::string& glob,
    std::string_view input_flag = "--data");

// A piece of a document: JSON Lines documents (a string field, prompt/response or prompt/completion
// fields, or a chat: "messages" or "conversations", a list of role/content or from/value objects,
// read as Parquet's records are, parquet.hpp) come whole (but where the options say); plain text
// is cut, only where `safe_cut` allows, after about piece_bytes (or where the options say).
struct DocumentPiece {
    std::string text;
    std::uint64_t document = 0;  // index in the corpus
    std::uint64_t index = 0;     // index of the piece in the corpus
    bool first = true;           // the document's first piece
    std::uint64_t offset = 0;    // of the piece's first byte within its document
    bool after_cut = false;      // in the document cut where the options say: after the cut
    // A prompt/response or chat record's stretches, trained (its responses) or not, covering the
    // text (parquet.hpp's record_spans); empty for a plain text document.
    std::vector<TextSpan> spans;
};

struct DocumentReaderOptions {
    // JSON Lines: the string field; Parquet: the column (see ParquetReadOptions).
    std::string text_field = "text";
    bool text_field_given = false;
    // Count and skip a bad JSONL line, or a Parquet row whose text is not UTF-8, instead of
    // failing.
    bool skip_bad_lines = false;
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
    // Refuse a document that is not a prompt/response or chat record (a plain text file, a JSON
    // Lines text field, a Parquet text column), naming where it is: a loss on the response only
    // needs a response.
    bool require_responses = false;
    // Called as each Parquet file is opened, with the columns it is read by (for the log).
    std::function<void(const std::filesystem::path& file, const std::string& columns)>
        on_parquet_file;
};

class DocumentReader {
  public:
    DocumentReader(std::vector<CorpusFile> files, DocumentReaderOptions options);
    ~DocumentReader();
    DocumentReader(const DocumentReader&) = delete;
    DocumentReader& operator=(const DocumentReader&) = delete;

    // The next piece in corpus order; false at the end. Throws InputError naming the file (and
    // line or row) for unreadable or corrupt input, binary data in a text file and, unless
    // skipping, a bad JSON line (not JSON, not an object, no string field, invalid UTF-8) or a
    // Parquet row whose text is not UTF-8.
    [[nodiscard]] bool next(DocumentPiece& piece);
    // Bytes of the files consumed so far, as stored (what progress is measured against).
    [[nodiscard]] std::uint64_t stored_bytes_read() const;
    [[nodiscard]] std::uint64_t skipped_lines() const;       // and Parquet rows
    [[nodiscard]] const std::string& first_skipped() const;  // "file:line: reason"
    // Parquet rows that made no document (a null text; a conversation null, empty or with no
    // message that has both role and content), and messages left out of conversations.
    [[nodiscard]] std::uint64_t null_rows() const;
    [[nodiscard]] std::uint64_t null_messages() const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// The uncompressed size of a file (reads a compressed one through).
[[nodiscard]] std::uint64_t uncompressed_bytes(const CorpusFile& file);

// What a text input's bytes (its first ones, or all) show it to be when it is not text, and what
// to do: "a Parquet file (it starts with PAR1), not text: Parquet is read from files named
// *.parquet", "binary data (a NUL byte at byte 12), not text", ...; nothing for text.
[[nodiscard]] std::optional<std::string> binary_content(std::string_view head);

}  // namespace gpt2
