#include "data/parquet/parquet.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <utility>

#include "core/error.hpp"
#include "core/utf8.hpp"
#include "data/parquet/parquet_column.hpp"
#include "data/parquet/thrift_compact.hpp"

namespace gpt2 {

namespace fs = std::filesystem;
using parquet::ColumnChunkMeta;
using parquet::ParquetSchema;
using parquet::Repetition;
using parquet::SchemaNode;

namespace {

constexpr std::array<char, 4> kMagic = {'P', 'A', 'R', '1'};
constexpr std::array<char, 4> kEncryptedMagic = {'P', 'A', 'R', 'E'};
// A footer is read whole; past this it is not plausible (FineWeb's 2 GB files: about 1 MB).
constexpr std::uint64_t kMaxFooterBytes = std::uint64_t{1} << 30;
// The top-level columns a "no such column" error lists before "...".
constexpr std::size_t kListedColumns = 20;

bool is_string_leaf(const SchemaNode& node) {
    return node.children.empty() && node.element.repetition != Repetition::Repeated &&
           node.element.is_string();
}

bool is_list_annotated(const SchemaNode& node) {
    return node.element.converted_type == 3 || node.element.logical_type == 3;
}

// What a column is, in words: "INT64", "BYTE_ARRAY without a string annotation (binary)", ...
std::string describe_node(const SchemaNode& node) {
    if (!node.children.empty()) {
        if (node.element.repetition == Repetition::Repeated) return "a repeated group";
        return is_list_annotated(node) ? "a list" : "a group (struct)";
    }
    const std::int32_t type = node.element.type.value_or(-1);
    std::string what = parquet::physical_type_name(type);
    if (type == static_cast<std::int32_t>(parquet::PhysicalType::ByteArray) &&
        !node.element.is_string())
        what += " without a string annotation (binary)";
    else if (node.element.is_string())
        what = "a string";
    if (node.element.repetition == Repetition::Repeated) what = "a repeated " + what;
    return what;
}

std::string list_columns(const ParquetSchema& schema) {
    const std::vector<std::size_t>& top = schema.nodes[0].children;
    std::string text;
    for (std::size_t i = 0; i < top.size() && i < kListedColumns; ++i) {
        const SchemaNode& node = schema.nodes[top[i]];
        text += (i == 0 ? "" : ", ") + node.element.name + " (" + describe_node(node) + ")";
    }
    if (top.size() > kListedColumns) text += ", ... (" + std::to_string(top.size()) + " columns)";
    return top.empty() ? "none" : text;
}

std::optional<std::size_t> top_level(const ParquetSchema& schema, const std::string& name) {
    for (const std::size_t child : schema.nodes[0].children) {
        if (schema.nodes[child].element.name == name) return child;
    }
    return std::nullopt;
}

std::optional<std::size_t> child_named(const ParquetSchema& schema, const SchemaNode& node,
                                       std::string_view name) {
    for (const std::size_t child : node.children) {
        if (schema.nodes[child].element.name == name) return child;
    }
    return std::nullopt;
}

// The role and content leaves of a conversation's message struct: role/content, or ShareGPT's
// from/value.
std::optional<std::pair<std::size_t, std::size_t>> message_fields(const ParquetSchema& schema,
                                                                  const SchemaNode& node) {
    static constexpr std::array<std::pair<std::string_view, std::string_view>, 2> kNames = {
        std::pair{"role", "content"}, std::pair{"from", "value"}};
    for (const auto& [role_name, content_name] : kNames) {
        const auto role = child_named(schema, node, role_name);
        const auto content = child_named(schema, node, content_name);
        if (role && content && is_string_leaf(schema.nodes[*role]) &&
            is_string_leaf(schema.nodes[*content]))
            return std::pair{*role, *content};
    }
    return std::nullopt;
}

// A chat column: a list of message structs, by its structure. The list may be the standard three
// levels (`messages` LIST > repeated `list` > `element` or older pyarrow's `item` > fields), the
// legacy two (the repeated group is the struct: `array`, `bag`, ...), or an unannotated
// repeated group of the fields.
std::optional<ParquetLayout> chat_layout(const ParquetSchema& schema, std::size_t column) {
    const SchemaNode& top = schema.nodes[column];
    if (top.children.empty()) return std::nullopt;
    std::size_t repeated = column;
    if (top.element.repetition != Repetition::Repeated) {
        if (top.children.size() != 1) return std::nullopt;
        repeated = top.children[0];
        if (schema.nodes[repeated].element.repetition != Repetition::Repeated ||
            schema.nodes[repeated].children.empty())
            return std::nullopt;
    }
    std::size_t message = repeated;
    std::optional<std::pair<std::size_t, std::size_t>> fields =
        message_fields(schema, schema.nodes[repeated]);
    if (!fields && schema.nodes[repeated].children.size() == 1) {
        message = schema.nodes[repeated].children[0];
        const SchemaNode& inner = schema.nodes[message];
        if (inner.children.empty() || inner.element.repetition == Repetition::Repeated)
            return std::nullopt;
        fields = message_fields(schema, inner);
    }
    if (!fields) return std::nullopt;
    const auto role = schema.leaf_of(fields->first);
    const auto content = schema.leaf_of(fields->second);
    if (!role || !content || schema.leaves[*role].max_repetition != 1) return std::nullopt;
    ParquetLayout layout;
    layout.kind = ParquetRecordKind::Chat;
    layout.leaves = {*role, *content};
    layout.column = top.element.name;
    layout.description = "chat column '" + top.element.name + "' (a list of " +
                         schema.nodes[fields->first].element.name + "/" +
                         schema.nodes[fields->second].element.name + ")";
    layout.entry_defined = schema.definition_level(repeated);
    layout.struct_defined = schema.definition_level(message);
    return layout;
}

ParquetLayout text_layout(const ParquetSchema& schema, std::size_t column) {
    ParquetLayout layout;
    layout.kind = ParquetRecordKind::Text;
    layout.leaves = {*schema.leaf_of(column)};
    layout.column = schema.nodes[column].element.name;
    layout.description = "column '" + layout.column + "'";
    return layout;
}

std::string row_group_context(const std::string& file, const ParquetLayout& layout,
                              std::size_t group) {
    return file + ": " + layout.description + " in row group " + std::to_string(group);
}

}  // namespace

ParquetLayout choose_parquet_layout(const ParquetSchema& schema, const ParquetReadOptions& options,
                                    const std::string& context) {
    const std::string& name = options.text_field;
    if (const auto column = top_level(schema, name)) {
        if (is_string_leaf(schema.nodes[*column])) return text_layout(schema, *column);
        if (auto chat = chat_layout(schema, *column)) return *chat;
        throw InputError(context + ": column '" + name + "' is " +
                         describe_node(schema.nodes[*column]) +
                         ", not a string (nor a list of role/content messages)");
    }
    if (options.text_field_given) {
        throw InputError(context + ": no column '" + name +
                         "' (--text-field); its columns: " + list_columns(schema));
    }
    std::vector<ParquetLayout> chats;
    for (const std::size_t child : schema.nodes[0].children) {
        if (auto chat = chat_layout(schema, child)) chats.push_back(std::move(*chat));
    }
    if (chats.size() == 1) return chats[0];
    if (chats.size() > 1) {
        std::string names;
        for (const ParquetLayout& chat : chats)
            names += (names.empty() ? "'" : ", '") + chat.column + "'";
        throw InputError(context + ": no column '" + name + "' and several chat columns (" + names +
                         "): choose one with --text-field");
    }
    const auto prompt = top_level(schema, "prompt");
    if (prompt && is_string_leaf(schema.nodes[*prompt])) {
        for (const auto& [answer, kind] :
             {std::pair{"response", ParquetRecordKind::PromptResponse},
              std::pair{"completion", ParquetRecordKind::PromptCompletion}}) {
            const auto column = top_level(schema, answer);
            if (!column || !is_string_leaf(schema.nodes[*column])) continue;
            ParquetLayout layout;
            layout.kind = kind;
            layout.leaves = {*schema.leaf_of(*prompt), *schema.leaf_of(*column)};
            layout.column = "prompt";
            layout.description = std::string("columns 'prompt' and '") + answer + "'";
            return layout;
        }
    }
    throw InputError(context + ": no column '" + name +
                     "', nor prompt/response or chat columns; its columns: " +
                     list_columns(schema) + " (--text-field names the text column)");
}

void record_text(const ParquetRecord& record, std::string& text) {
    switch (record.kind) {
        case ParquetRecordKind::Text:
            text = record.text;
            return;
        case ParquetRecordKind::PromptResponse:
            text = record.prompt;
            text += "\n\n";
            text += record.response;
            return;
        case ParquetRecordKind::PromptCompletion:
            text = record.prompt;
            text += record.response;
            return;
        case ParquetRecordKind::Chat:
            text.clear();
            append_chat_text(record.messages, text);
            return;
    }
}

bool is_response_role(std::string_view role) {
    return role == "assistant" || role == "gpt" || role == "model";
}

void record_spans(const ParquetRecord& record, std::vector<TextSpan>& spans) {
    spans.clear();
    // Adds the stretch up to `end`, merged into the last one when it is trained alike.
    const auto add = [&spans](std::size_t end, bool trained) {
        const std::size_t begin = spans.empty() ? 0 : spans.back().end;
        if (end == begin) return;
        if (!spans.empty() && spans.back().trained == trained) {
            spans.back().end = end;
        } else {
            spans.push_back(TextSpan{end, trained});
        }
    };
    switch (record.kind) {
        case ParquetRecordKind::Text:
            return;
        case ParquetRecordKind::PromptResponse:
            add(record.prompt.size() + 2, false);
            add(record.prompt.size() + 2 + record.response.size(), true);
            return;
        case ParquetRecordKind::PromptCompletion:
            add(record.prompt.size(), false);
            add(record.prompt.size() + record.response.size(), true);
            return;
        case ParquetRecordKind::Chat: {
            std::size_t at = 0;  // as record_text lays the messages out
            for (std::size_t m = 0; m < record.messages.size(); ++m) {
                const ChatMessage& message = record.messages[m];
                if (m > 0) at += kChatMessageSeparator.size();
                at += message.role.size() + kChatRoleSeparator.size();
                add(at, false);
                at += message.content.size();
                add(at, is_response_role(message.role));
            }
            // A conversation whose every message is empty still covers its text.
            add(at, false);
            return;
        }
    }
}

struct ParquetReader::Impl {
    std::string name;  // the path, for messages
    ParquetReadOptions options;
    std::unique_ptr<parquet::ParquetFile> file;
    parquet::FileMetaData meta;
    ParquetLayout layout;
    std::size_t group = 0;                       // the next row group to open
    std::vector<parquet::ColumnCursor> cursors;  // of the open row group, one per layout leaf
    std::vector<parquet::LevelEntry> ahead;      // chat: each cursor's next entry
    std::vector<bool> has_ahead;
    std::string context;           // of the open row group
    std::uint64_t group_rows = 0;  // rows read in the open row group
    std::uint64_t row = 0;         // rows read in the file
    std::uint64_t null_rows = 0;
    std::uint64_t null_messages = 0;
    parquet::ParquetReadStats stats;
    bool done = false;

    [[noreturn]] void fail(const std::string& what) const { throw InputError(name + ": " + what); }

    void read_footer() {
        const std::uint64_t size = file->size();
        if (size < 12) fail("not a Parquet file (" + std::to_string(size) + " bytes)");
        std::array<std::uint8_t, 8> tail{};
        file->read(size - 8, tail);
        std::array<std::uint8_t, 4> head{};
        file->read(0, head);
        if (std::memcmp(tail.data() + 4, kEncryptedMagic.data(), 4) == 0 ||
            std::memcmp(head.data(), kEncryptedMagic.data(), 4) == 0)
            fail("an encrypted Parquet file (its magic is PARE): decrypt it first");
        if (std::memcmp(head.data(), kMagic.data(), 4) != 0)
            fail("not a Parquet file (it does not start with PAR1)");
        if (std::memcmp(tail.data() + 4, kMagic.data(), 4) != 0)
            fail("a Parquet file cut short (it does not end with PAR1)");
        const std::uint64_t footer = static_cast<std::uint64_t>(tail[0]) | tail[1] << 8 |
                                     tail[2] << 16 | static_cast<std::uint64_t>(tail[3]) << 24;
        if (footer > size - 12 || footer > kMaxFooterBytes)
            fail("a footer of " + std::to_string(footer) + " bytes in a file of " +
                 std::to_string(size) + ": cut short or corrupt");
        std::vector<std::uint8_t> bytes(static_cast<std::size_t>(footer));
        file->read(size - 8 - footer, bytes);
        try {
            meta = parquet::parse_file_metadata(bytes, name + ": footer");
        } catch (const gpt2::thrift::OutOfBytes&) {
            fail("the footer is cut short or corrupt (its fields run past its " +
                 std::to_string(footer) + " bytes)");
        }
        if (meta.encrypted)
            fail(
                "a Parquet file with encrypted columns (the footer names an encryption "
                "algorithm): decrypt it first");
    }

    void check_footer(std::uint64_t data_end) {
        const ParquetSchema& schema = meta.schema;
        std::uint64_t rows = 0;
        for (std::size_t g = 0; g < meta.row_groups.size(); ++g) {
            const parquet::RowGroupMeta& group = meta.row_groups[g];
            const std::string where = "row group " + std::to_string(g);
            if (group.columns.size() != schema.leaves.size())
                fail("inconsistent footer: " + where + " has " +
                     std::to_string(group.columns.size()) + " columns, the schema " +
                     std::to_string(schema.leaves.size()));
            if (group.num_rows < 0)
                fail("inconsistent footer: " + where + " has a negative row count");
            rows += static_cast<std::uint64_t>(group.num_rows);
            for (const std::size_t leaf : layout.leaves) {
                const ColumnChunkMeta& c = group.columns[leaf];
                std::string column = "'";
                column += join_path(schema.leaves[leaf].path);
                column += '\'';
                if (c.encrypted || !c.has_metadata)
                    fail("column " + column + " is encrypted in " + where + ": decrypt it first");
                if (c.in_other_file)
                    fail("column " + column + " of " + where +
                         " is in another file (ColumnChunk.file_path), which is not read");
                if (!c.path_matches)
                    fail("inconsistent footer: the column chunk of " + column + " in " + where +
                         " names another column");
                if (c.type != static_cast<std::int32_t>(parquet::PhysicalType::ByteArray))
                    fail("inconsistent footer: column " + column + " is " +
                         parquet::physical_type_name(c.type) + " in " + where +
                         ", BYTE_ARRAY in the schema");
                using parquet::Codec;
                if (c.codec != static_cast<std::int32_t>(Codec::Uncompressed) &&
                    c.codec != static_cast<std::int32_t>(Codec::Snappy) &&
                    c.codec != static_cast<std::int32_t>(Codec::Gzip) &&
                    c.codec != static_cast<std::int32_t>(Codec::Zstd))
                    fail("column " + column + " is compressed with " +
                         parquet::codec_name(c.codec) +
                         ", which this reader does not read (it reads UNCOMPRESSED, SNAPPY, "
                         "GZIP and ZSTD): rewrite the file with one of those");
                const std::int64_t start =
                    c.dictionary_page_offset && *c.dictionary_page_offset > 0
                        ? std::min(*c.dictionary_page_offset, c.data_page_offset)
                        : c.data_page_offset;
                if (start < 4 || c.total_compressed_size < 0 ||
                    static_cast<std::uint64_t>(start) > data_end ||
                    static_cast<std::uint64_t>(c.total_compressed_size) >
                        data_end - static_cast<std::uint64_t>(start))
                    fail("inconsistent footer: column " + column + " of " + where +
                         " would be at bytes " + std::to_string(start) + ".." +
                         std::to_string(start + c.total_compressed_size) +
                         ", outside the data (bytes 4.." + std::to_string(data_end) +
                         "): the file is cut short or corrupt");
                // One value (null or not) per row, or, in a list, at least one.
                const bool flat = schema.leaves[leaf].max_repetition == 0;
                if (flat ? c.num_values != group.num_rows : c.num_values < group.num_rows)
                    fail("inconsistent footer: column " + column + " of " + where + " has " +
                         std::to_string(c.num_values) + " values for " +
                         std::to_string(group.num_rows) + " rows");
            }
        }
        if (meta.num_rows < 0 || rows != static_cast<std::uint64_t>(meta.num_rows))
            fail("inconsistent footer: its row groups hold " + std::to_string(rows) +
                 " rows, the file " + std::to_string(meta.num_rows));
    }

    static std::string join_path(const std::vector<std::string>& path) {
        std::string joined;
        for (const std::string& part : path)
            joined += (joined.empty() ? "" : ".") + part;
        return joined;
    }

    // Opens the next row group; false when there is none.
    bool open_group() {
        cursors.clear();
        if (group >= meta.row_groups.size()) return false;
        context = row_group_context(name, layout, group);
        for (const std::size_t leaf : layout.leaves) {
            cursors.emplace_back(*file, meta.schema.leaves[leaf],
                                 meta.row_groups[group].columns[leaf], context,
                                 options.max_page_bytes, stats);
        }
        ahead.assign(cursors.size(), parquet::LevelEntry{});
        has_ahead.assign(cursors.size(), false);
        group_rows = 0;
        ++group;
        return true;
    }

    void close_group() {
        const std::int64_t expected = meta.row_groups[group - 1].num_rows;
        if (group_rows != static_cast<std::uint64_t>(expected))
            fail(layout.description + " holds " + std::to_string(group_rows) +
                 " rows in row group " + std::to_string(group - 1) + ", the footer says " +
                 std::to_string(expected));
        cursors.clear();
    }

    void count_row() {
        const std::int64_t expected = meta.row_groups[group - 1].num_rows;
        if (++group_rows > static_cast<std::uint64_t>(expected))
            fail(layout.description + " holds more rows in row group " + std::to_string(group - 1) +
                 " than the footer's " + std::to_string(expected));
    }

    void take(std::string& field, const parquet::LevelEntry& entry, const char* what,
              ParquetRecord& record) const {
        field.assign(entry.value);
        if (record.problem.empty() && !is_valid_utf8(field))
            record.problem =
                std::string(what) + " in " + layout.description + " is not valid UTF-8";
    }

    enum class Step { Row, Skipped, GroupEnd };

    // Flat layouts: one entry per row from each cursor.
    Step next_flat(ParquetRecord& record) {
        std::array<parquet::LevelEntry, 2> entries;
        bool any = false, all = true;
        for (std::size_t i = 0; i < cursors.size(); ++i) {
            const bool got = cursors[i].next(entries[i]);
            any = any || got;
            all = all && got;
        }
        if (!all) {
            if (any) fail(context + ": its columns hold different numbers of rows");
            return Step::GroupEnd;
        }
        count_row();
        record.row = row++;
        for (std::size_t i = 0; i < cursors.size(); ++i) {
            if (!entries[i].has_value) {
                ++null_rows;
                return Step::Skipped;
            }
        }
        record.problem.clear();
        if (layout.kind == ParquetRecordKind::Text) {
            take(record.text, entries[0], "a value", record);
        } else {
            take(record.prompt, entries[0], "a prompt", record);
            take(record.response, entries[1], "a response", record);
        }
        return Step::Row;
    }

    bool peek(std::size_t i) {
        if (!has_ahead[i]) has_ahead[i] = cursors[i].next(ahead[i]);
        return has_ahead[i];
    }

    // A chat row: entries from both cursors until the next row starts.
    Step next_chat(ParquetRecord& record) {
        const bool role = peek(0), content = peek(1);
        if (!role || !content) {
            if (role || content) fail(context + ": its columns hold different numbers of rows");
            return Step::GroupEnd;
        }
        if (ahead[0].repetition != 0) fail(context + ": a row starts with a repeated entry");
        record.messages.clear();
        record.problem.clear();
        record.row = row++;
        count_row();
        do {
            const parquet::LevelEntry& r = ahead[0];
            const parquet::LevelEntry& c = ahead[1];
            if (r.repetition != c.repetition || std::min(r.definition, layout.struct_defined) !=
                                                    std::min(c.definition, layout.struct_defined))
                fail(context + ": the role and content columns disagree on the list's shape");
            if (r.definition >= layout.struct_defined && r.has_value && c.has_value) {
                ChatMessage& message = record.messages.emplace_back();
                take(message.role, r, "a role", record);
                take(message.content, c, "a message", record);
            } else if (r.definition >= layout.entry_defined) {
                ++null_messages;  // a null message, or one without role or content
            }
            has_ahead[0] = has_ahead[1] = false;
        } while (peek(0) && peek(1) && ahead[0].repetition != 0);
        if (has_ahead[0] != has_ahead[1])
            fail(context + ": its columns hold different numbers of values");
        if (record.messages.empty()) {
            ++null_rows;
            return Step::Skipped;
        }
        return Step::Row;
    }
};

ParquetReader::ParquetReader(const fs::path& path, const ParquetReadOptions& options)
    : impl_(std::make_unique<Impl>()) {
    Impl& r = *impl_;
    r.name = path.string();
    r.options = options;
    r.file = std::make_unique<parquet::ParquetFile>(path);
    r.read_footer();
    r.layout = choose_parquet_layout(r.meta.schema, options, r.name);
    r.check_footer(r.file->size() - 8);
}

ParquetReader::~ParquetReader() = default;

const ParquetLayout& ParquetReader::layout() const {
    return impl_->layout;
}

std::uint64_t ParquetReader::rows() const {
    return static_cast<std::uint64_t>(impl_->meta.num_rows);
}

bool ParquetReader::next(ParquetRecord& record) {
    Impl& r = *impl_;
    record.kind = r.layout.kind;
    while (!r.done) {
        if (r.cursors.empty() && !r.open_group()) {
            r.done = true;
            break;
        }
        const Impl::Step step =
            r.layout.kind == ParquetRecordKind::Chat ? r.next_chat(record) : r.next_flat(record);
        if (step == Impl::Step::GroupEnd) {
            r.close_group();
        } else if (step == Impl::Step::Row) {
            return true;
        }
    }
    record.problem.clear();
    return false;
}

std::uint64_t ParquetReader::null_rows() const {
    return impl_->null_rows;
}
std::uint64_t ParquetReader::null_messages() const {
    return impl_->null_messages;
}
const parquet::ParquetReadStats& ParquetReader::stats() const {
    return impl_->stats;
}
std::uint64_t ParquetReader::stored_bytes_read() const {
    return impl_->done ? impl_->file->size() : impl_->file->furthest_read();
}

}  // namespace gpt2
