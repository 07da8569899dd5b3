// Parquet's metadata as this project reads it: the footer (schema, row groups, column chunks) and
// page headers, decoded from the Thrift compact protocol, with the schema as a tree whose leaves
// know their repetition and definition levels. Only what reading string columns needs is kept;
// the rest (statistics, indexes, bloom filters) is skipped.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gpt2::parquet {

enum class PhysicalType : std::int32_t {
    Boolean = 0,
    Int32 = 1,
    Int64 = 2,
    Int96 = 3,
    Float = 4,
    Double = 5,
    ByteArray = 6,
    FixedLenByteArray = 7,
};

enum class Repetition : std::int32_t { Required = 0, Optional = 1, Repeated = 2 };

enum class Codec : std::int32_t {
    Uncompressed = 0,
    Snappy = 1,
    Gzip = 2,
    Lzo = 3,
    Brotli = 4,
    Lz4 = 5,
    Zstd = 6,
    Lz4Raw = 7,
};

enum class Encoding : std::int32_t {
    Plain = 0,
    PlainDictionary = 2,
    Rle = 3,
    BitPacked = 4,
    DeltaBinaryPacked = 5,
    DeltaLengthByteArray = 6,
    DeltaByteArray = 7,
    RleDictionary = 8,
    ByteStreamSplit = 9,
};

enum class PageType : std::int32_t { Data = 0, Index = 1, Dictionary = 2, DataV2 = 3 };

// The names the specification gives them ("SNAPPY", "DELTA_BYTE_ARRAY", "INT64"), for messages.
[[nodiscard]] std::string codec_name(std::int32_t codec);
[[nodiscard]] std::string encoding_name(std::int32_t encoding);
[[nodiscard]] std::string physical_type_name(std::int32_t type);

struct SchemaElement {
    std::optional<std::int32_t> type;  // PhysicalType; set on leaves only
    Repetition repetition = Repetition::Required;
    std::string name;
    std::optional<std::int32_t> num_children;    // set on groups only
    std::optional<std::int32_t> converted_type;  // 0: UTF8, 3: LIST, 4: ENUM, 19: JSON, ...
    // The field id of the LogicalType union's member (1: STRING, 3: LIST, 4: ENUM, 12: JSON), 0
    // when there is none.
    std::int32_t logical_type = 0;

    // Text by the annotations: STRING, ENUM or JSON (all UTF-8), or the older UTF8.
    [[nodiscard]] bool is_string() const;
};

// A node of the schema tree: an element and its children (indices into ParquetSchema::nodes).
struct SchemaNode {
    SchemaElement element;
    std::vector<std::size_t> children;
    std::size_t parent = 0;  // the root is its own parent
    int depth = 0;           // the root's children: 1
};

// A leaf column: its node, where it sits in each row group's columns, and its levels.
struct LeafColumn {
    std::size_t node = 0;
    std::vector<std::string> path;  // names from the root's child down
    int max_definition = 0;
    int max_repetition = 0;
};

struct ParquetSchema {
    std::vector<SchemaNode> nodes;   // nodes[0] is the root
    std::vector<LeafColumn> leaves;  // in the order of the column chunks
    // The leaf column at `node`, if it is one.
    [[nodiscard]] std::optional<std::size_t> leaf_of(std::size_t node) const;
    // The definition level a value reaches once every optional or repeated node from the root
    // down to and including `node` is present.
    [[nodiscard]] int definition_level(std::size_t node) const;
};

// The schema tree of the footer's flat, depth-first element list. Throws InputError (after
// `context`) when the counts of children do not add up or nest too deeply.
[[nodiscard]] ParquetSchema build_schema(std::vector<SchemaElement> elements,
                                         const std::string& context);

struct ColumnChunkMeta {
    std::int32_t type = -1;       // PhysicalType
    std::int32_t codec = 0;       // Codec
    std::int64_t num_values = 0;  // level entries, nulls included
    std::int64_t total_compressed_size = 0;
    std::int64_t data_page_offset = -1;
    std::optional<std::int64_t> dictionary_page_offset;
    bool has_metadata = false;   // ColumnMetaData present (not encrypted away)
    bool path_matches = false;   // path_in_schema is the leaf's path
    bool in_other_file = false;  // file_path set: the data is in another file
    bool encrypted = false;      // crypto metadata present
};

struct RowGroupMeta {
    std::vector<ColumnChunkMeta> columns;
    std::int64_t num_rows = 0;
};

struct FileMetaData {
    ParquetSchema schema;
    std::int64_t num_rows = 0;
    std::vector<RowGroupMeta> row_groups;
    bool encrypted = false;  // encryption_algorithm set (encrypted columns, plaintext footer)
    std::string created_by;
};

// The footer's FileMetaData. Throws InputError after `context` ("FILE: footer") for anything
// malformed or missing; thrift::OutOfBytes (an InputError) when the bytes end too soon.
[[nodiscard]] FileMetaData parse_file_metadata(std::span<const std::uint8_t> bytes,
                                               const std::string& context);

struct PageHeader {
    std::int32_t type = -1;  // PageType
    std::int32_t uncompressed_size = -1;
    std::int32_t compressed_size = -1;
    // Data pages (v1 and v2) and dictionary pages.
    std::int32_t num_values = -1;
    std::int32_t encoding = -1;
    // Data pages v1: how the levels are encoded.
    std::int32_t definition_level_encoding = static_cast<std::int32_t>(Encoding::Rle);
    std::int32_t repetition_level_encoding = static_cast<std::int32_t>(Encoding::Rle);
    // Data pages v2: the levels' sizes (stored uncompressed before the values) and whether the
    // values are compressed.
    std::int32_t num_nulls = 0;
    std::int32_t num_rows = 0;
    std::int32_t definition_levels_size = 0;
    std::int32_t repetition_levels_size = 0;
    bool is_compressed = true;
    std::size_t header_size = 0;  // bytes the header itself took
};

// A page header at the start of `bytes`. thrift::OutOfBytes when `bytes` ends inside it (read
// more and try again); InputError after `context` when it is malformed.
[[nodiscard]] PageHeader parse_page_header(std::span<const std::uint8_t> bytes,
                                           const std::string& context);

}  // namespace gpt2::parquet
