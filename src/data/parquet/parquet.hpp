// Documents from Parquet files, as the Hugging Face Hub ships corpora: a string column (FineWeb's
// `text`), prompt/response pairs, or chat conversations (a list of role/content structs, found by
// its structure whatever its spelling), read row group by row group, page by page, so that memory
// stays bounded by a page and a dictionary whatever the file's size.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/chat_template.hpp"
#include "data/parquet/parquet_column.hpp"
#include "data/parquet/parquet_format.hpp"
#include "data/text_spans.hpp"

namespace gpt2 {

enum class ParquetRecordKind {
    Text,              // one string column
    PromptResponse,    // string columns `prompt` and `response`
    PromptCompletion,  // string columns `prompt` and `completion`
    Chat,              // a list of structs with string fields role/content (or from/value)
};

// One row, with the fields its kind reads (the others stay empty).
struct ParquetRecord {
    ParquetRecordKind kind = ParquetRecordKind::Text;
    std::uint64_t row = 0;  // in the file, counting from 0
    std::string text;
    std::string prompt;
    std::string response;  // the response or the completion
    std::vector<ChatMessage> messages;
    // Not empty when a string of the row is not valid UTF-8 (what and where): the fields then
    // hold its bytes as they are.
    std::string problem;
};

struct ParquetReadOptions {
    // The column to read. When it was not given (text_field_given false) and the file has no
    // column of that name, prompt/response and chat data are found by their structure.
    std::string text_field = "text";
    bool text_field_given = false;
    // A page needing more memory than this is refused.
    std::size_t max_page_bytes = std::size_t{1} << 30;
};

// Which columns of a schema make the records, and how.
struct ParquetLayout {
    ParquetRecordKind kind = ParquetRecordKind::Text;
    // Leaf columns: Text {text}; PromptResponse/PromptCompletion {prompt, response}; Chat {role,
    // content}.
    std::vector<std::size_t> leaves;
    // For messages: "column 'text'", "columns 'prompt' and 'response'", "chat column 'messages'
    // (a list of role/content)".
    std::string description;
    std::string column;  // the (first) top-level column's name
    // Chat: the definition levels at which a list entry exists, and at which its struct does.
    int entry_defined = 0;
    int struct_defined = 0;
};

// The layout `options` choose in `schema`. InputError after `context` (the file) naming what
// is missing or of the wrong type, and the columns there are.
[[nodiscard]] ParquetLayout choose_parquet_layout(const parquet::ParquetSchema& schema,
                                                  const ParquetReadOptions& options,
                                                  const std::string& context);

class ParquetReader {
  public:
    // Reads and checks the footer and chooses the columns. InputError naming the file for what
    // cannot be read: not Parquet, encrypted (PARE), a footer cut short or inconsistent, a
    // missing or non-string column, a codec other than UNCOMPRESSED, SNAPPY, GZIP and ZSTD.
    ParquetReader(const std::filesystem::path& path, const ParquetReadOptions& options);
    ~ParquetReader();
    ParquetReader(const ParquetReader&) = delete;
    ParquetReader& operator=(const ParquetReader&) = delete;

    [[nodiscard]] const ParquetLayout& layout() const;
    [[nodiscard]] std::uint64_t rows() const;  // as the footer counts them
    // The next row that makes a document; false at the end. Rows whose text is null, and
    // conversations that are null, empty or whose every message lacks a role or content, are
    // skipped and counted. InputError naming the file, column and row group for corrupt data.
    [[nodiscard]] bool next(ParquetRecord& record);
    [[nodiscard]] std::uint64_t null_rows() const;      // rows skipped
    [[nodiscard]] std::uint64_t null_messages() const;  // messages left out of conversations
    // The pages read so far, by kind, encoding and codec.
    [[nodiscard]] const parquet::ParquetReadStats& stats() const;
    // Bytes of the file read so far (all of it once the reader reached its end).
    [[nodiscard]] std::uint64_t stored_bytes_read() const;

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// A record as the text of one document:
//   Text              the string
//   PromptResponse    prompt + "\n\n" + response
//   PromptCompletion  prompt + completion (as TRL and OpenAI define that format: the prompt
//                     carries its own separator)
//   Chat              each message as role + ": " + content, the messages joined by "\n\n"
//                     (data/chat_template.hpp, which inference --chat uses too)
void record_text(const ParquetRecord& record, std::string& text);

// The spans of record_text's text that a loss on the response trains: PromptResponse and
// PromptCompletion, the response (the prompt and its separator are not); Chat, the content of
// every message whose role is a response's (is_response_role), nothing else (roles, separators,
// the other messages). Text records have none (spans is left empty).
void record_spans(const ParquetRecord& record, std::vector<TextSpan>& spans);

// The roles whose messages are responses: "assistant" (OpenAI's chat format), "gpt" (ShareGPT's),
// "model" (Gemma's).
[[nodiscard]] bool is_response_role(std::string_view role);

}  // namespace gpt2
