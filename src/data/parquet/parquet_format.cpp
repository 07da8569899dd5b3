#include "data/parquet/parquet_format.hpp"

#include <array>
#include <utility>

#include "core/error.hpp"
#include "data/parquet/thrift_compact.hpp"

namespace gpt2::parquet {

namespace {

using thrift::CompactReader;
using thrift::Type;

// Schemas nest a few levels (a list of structs: four); deeper is refused before recursion can
// exhaust the stack.
constexpr int kMaxSchemaDepth = 64;

template <std::size_t N>
std::string name_in(const std::array<const char*, N>& names, std::int32_t value) {
    if (value >= 0 && static_cast<std::size_t>(value) < N && names[value][0] != '\0')
        return names[static_cast<std::size_t>(value)];
    return "unknown (" + std::to_string(value) + ")";
}

SchemaElement read_schema_element(CompactReader& r) {
    SchemaElement e;
    bool named = false;
    r.read_struct([&](std::int16_t id, Type type) {
        switch (id) {
            case 1:
                e.type = r.i32(type, "SchemaElement.type");
                return true;
            case 3: {
                const std::int32_t repetition = r.i32(type, "SchemaElement.repetition_type");
                if (repetition < 0 || repetition > 2)
                    r.fail("unknown repetition type " + std::to_string(repetition));
                e.repetition = static_cast<Repetition>(repetition);
                return true;
            }
            case 4:
                e.name = std::string(r.binary(type, "SchemaElement.name"));
                named = true;
                return true;
            case 5:
                e.num_children = r.i32(type, "SchemaElement.num_children");
                return true;
            case 6:
                e.converted_type = r.i32(type, "SchemaElement.converted_type");
                return true;
            case 10:  // LogicalType, a union: the id of its one member says which
                r.read_struct(type, "SchemaElement.logicalType", [&](std::int16_t member, Type) {
                    e.logical_type = member;
                    return false;
                });
                return true;
            default:
                return false;
        }
    });
    if (!named) r.fail("a schema element without a name");
    return e;
}

std::vector<SchemaElement> read_schema(CompactReader& r, Type type) {
    const auto [element, size] = r.list(type, "FileMetaData.schema");
    std::vector<SchemaElement> elements;  // grown as read: `size` is not trusted yet
    for (std::size_t i = 0; i < size; ++i) {
        if (element != Type::Struct) r.fail("FileMetaData.schema is not a list of structs");
        elements.push_back(read_schema_element(r));
    }
    return elements;
}

void read_column_metadata(CompactReader& r, Type type, ColumnChunkMeta& c, const LeafColumn* leaf) {
    bool has_type = false, has_codec = false, has_values = false, has_size = false,
         has_offset = false, has_path = false;
    r.read_struct(type, "ColumnChunk.meta_data", [&](std::int16_t id, Type t) {
        switch (id) {
            case 1:
                c.type = r.i32(t, "ColumnMetaData.type");
                has_type = true;
                return true;
            case 3: {
                const auto [element, size] = r.list(t, "ColumnMetaData.path_in_schema");
                bool matches = leaf != nullptr && leaf->path.size() == size;
                for (std::size_t i = 0; i < size; ++i) {
                    const std::string_view name = r.binary(element, "path_in_schema");
                    matches = matches && leaf->path[i] == name;
                }
                c.path_matches = matches;
                has_path = true;
                return true;
            }
            case 4:
                c.codec = r.i32(t, "ColumnMetaData.codec");
                has_codec = true;
                return true;
            case 5:
                c.num_values = r.i64(t, "ColumnMetaData.num_values");
                has_values = true;
                return true;
            case 7:
                c.total_compressed_size = r.i64(t, "ColumnMetaData.total_compressed_size");
                has_size = true;
                return true;
            case 9:
                c.data_page_offset = r.i64(t, "ColumnMetaData.data_page_offset");
                has_offset = true;
                return true;
            case 11:
                c.dictionary_page_offset = r.i64(t, "ColumnMetaData.dictionary_page_offset");
                return true;
            default:
                return false;
        }
    });
    if (!(has_type && has_codec && has_values && has_size && has_offset && has_path))
        r.fail("a column's metadata lacks a required field");
    c.has_metadata = true;
}

RowGroupMeta read_row_group(CompactReader& r, const ParquetSchema* schema) {
    RowGroupMeta group;
    bool has_rows = false, has_columns = false;
    r.read_struct([&](std::int16_t id, Type type) {
        if (id == 3) {
            group.num_rows = r.i64(type, "RowGroup.num_rows");
            has_rows = true;
            return true;
        }
        if (id != 1) return false;
        const auto [element, size] = r.list(type, "RowGroup.columns");
        if (element != Type::Struct) r.fail("RowGroup.columns is not a list of structs");
        for (std::size_t i = 0; i < size; ++i) {
            ColumnChunkMeta& c = group.columns.emplace_back();
            const LeafColumn* leaf =
                schema != nullptr && i < schema->leaves.size() ? &schema->leaves[i] : nullptr;
            r.read_struct([&](std::int16_t field, Type t) {
                switch (field) {
                    case 1:
                        c.in_other_file = !r.binary(t, "ColumnChunk.file_path").empty();
                        return true;
                    case 3:
                        read_column_metadata(r, t, c, leaf);
                        return true;
                    case 8:
                    case 9:
                        c.encrypted = true;
                        return false;
                    default:
                        return false;
                }
            });
        }
        has_columns = true;
        return true;
    });
    if (!has_rows || !has_columns) r.fail("a row group without its row count or columns");
    return group;
}

// Adds the subtree of elements[next] (the node's children follow it depth first).
void add_subtree(ParquetSchema& schema, std::vector<SchemaElement>& elements, std::size_t& next,
                 std::size_t parent, int depth, std::vector<std::string>& path,
                 const std::string& context) {
    if (depth > kMaxSchemaDepth) throw InputError(context + ": the schema nests too deeply");
    const std::size_t index = schema.nodes.size();
    SchemaNode node;
    node.element = std::move(elements[next++]);
    node.parent = parent;
    node.depth = depth;
    const std::optional<std::int32_t> children = node.element.num_children;
    const bool leaf = node.element.type.has_value();
    if (leaf && children.value_or(0) != 0) {
        throw InputError(context + ": schema element '" + node.element.name +
                         "' has both a type and children");
    }
    if (!leaf && !children)
        throw InputError(context + ": schema element '" + node.element.name + "' has no type");
    if (children &&
        (*children < 0 || static_cast<std::size_t>(*children) > elements.size() - next)) {
        throw InputError(context + ": schema element '" + node.element.name + "' claims " +
                         std::to_string(*children) + " children, more than the schema holds");
    }
    schema.nodes.push_back(std::move(node));
    if (index != 0) {
        schema.nodes[parent].children.push_back(index);
        path.push_back(schema.nodes[index].element.name);
    }
    if (leaf) {
        LeafColumn column;
        column.node = index;
        column.path = path;
        for (std::size_t n = index; n != 0; n = schema.nodes[n].parent) {
            const Repetition repetition = schema.nodes[n].element.repetition;
            if (repetition != Repetition::Required) ++column.max_definition;
            if (repetition == Repetition::Repeated) ++column.max_repetition;
        }
        schema.leaves.push_back(std::move(column));
    } else {
        for (std::int32_t i = 0; i < *children; ++i) {
            if (next >= elements.size())
                throw InputError(context + ": the schema's children do not add up");
            add_subtree(schema, elements, next, index, depth + 1, path, context);
        }
    }
    if (index != 0) path.pop_back();
}

}  // namespace

std::string codec_name(std::int32_t codec) {
    static constexpr std::array<const char*, 8> kNames = {
        "UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW"};
    return name_in(kNames, codec);
}

std::string encoding_name(std::int32_t encoding) {
    static constexpr std::array<const char*, 10> kNames = {"PLAIN",
                                                           "",
                                                           "PLAIN_DICTIONARY",
                                                           "RLE",
                                                           "BIT_PACKED",
                                                           "DELTA_BINARY_PACKED",
                                                           "DELTA_LENGTH_BYTE_ARRAY",
                                                           "DELTA_BYTE_ARRAY",
                                                           "RLE_DICTIONARY",
                                                           "BYTE_STREAM_SPLIT"};
    return name_in(kNames, encoding);
}

std::string physical_type_name(std::int32_t type) {
    static constexpr std::array<const char*, 8> kNames = {
        "BOOLEAN", "INT32",  "INT64",      "INT96",
        "FLOAT",   "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"};
    return name_in(kNames, type);
}

bool SchemaElement::is_string() const {
    if (type != static_cast<std::int32_t>(PhysicalType::ByteArray)) return false;
    if (logical_type != 0) return logical_type == 1 || logical_type == 4 || logical_type == 12;
    return converted_type == 0 || converted_type == 4 || converted_type == 19;
}

std::optional<std::size_t> ParquetSchema::leaf_of(std::size_t node) const {
    for (std::size_t i = 0; i < leaves.size(); ++i) {
        if (leaves[i].node == node) return i;
    }
    return std::nullopt;
}

int ParquetSchema::definition_level(std::size_t node) const {
    int level = 0;
    for (std::size_t n = node; n != 0; n = nodes[n].parent) {
        if (nodes[n].element.repetition != Repetition::Required) ++level;
    }
    return level;
}

ParquetSchema build_schema(std::vector<SchemaElement> elements, const std::string& context) {
    if (elements.empty()) throw InputError(context + ": the schema is empty");
    if (!elements[0].num_children) throw InputError(context + ": the schema's root is no group");
    ParquetSchema schema;
    schema.nodes.reserve(elements.size());
    std::size_t next = 0;
    std::vector<std::string> path;
    add_subtree(schema, elements, next, 0, 0, path, context);
    if (next != elements.size()) {
        throw InputError(context + ": the schema has " + std::to_string(elements.size()) +
                         " elements, its root's tree " + std::to_string(next));
    }
    return schema;
}

FileMetaData parse_file_metadata(std::span<const std::uint8_t> bytes, const std::string& context) {
    CompactReader r(bytes, context);
    FileMetaData meta;
    bool has_schema = false, has_rows = false, has_groups = false;
    r.read_struct([&](std::int16_t id, Type type) {
        switch (id) {
            case 2:
                meta.schema = build_schema(read_schema(r, type), context);
                has_schema = true;
                return true;
            case 3:
                meta.num_rows = r.i64(type, "FileMetaData.num_rows");
                has_rows = true;
                return true;
            case 4: {
                const auto [element, size] = r.list(type, "FileMetaData.row_groups");
                if (element != Type::Struct) r.fail("row_groups is not a list of structs");
                for (std::size_t i = 0; i < size; ++i)
                    meta.row_groups.push_back(
                        read_row_group(r, has_schema ? &meta.schema : nullptr));
                has_groups = true;
                return true;
            }
            case 6:
                meta.created_by = std::string(r.binary(type, "FileMetaData.created_by"));
                return true;
            case 8:
                meta.encrypted = true;
                return false;
            default:
                return false;
        }
    });
    if (!has_schema || !has_rows || !has_groups)
        throw InputError(context + ": no " +
                         (!has_schema ? "schema"
                          : !has_rows ? "row count"
                                      : "row groups"));
    return meta;
}

PageHeader parse_page_header(std::span<const std::uint8_t> bytes, const std::string& context) {
    CompactReader r(bytes, context);
    PageHeader h;
    r.read_struct([&](std::int16_t id, Type type) {
        switch (id) {
            case 1:
                h.type = r.i32(type, "PageHeader.type");
                return true;
            case 2:
                h.uncompressed_size = r.i32(type, "PageHeader.uncompressed_page_size");
                return true;
            case 3:
                h.compressed_size = r.i32(type, "PageHeader.compressed_page_size");
                return true;
            case 5:  // DataPageHeader
                r.read_struct(type, "DataPageHeader", [&](std::int16_t f, Type t) {
                    switch (f) {
                        case 1:
                            h.num_values = r.i32(t, "DataPageHeader.num_values");
                            return true;
                        case 2:
                            h.encoding = r.i32(t, "DataPageHeader.encoding");
                            return true;
                        case 3:
                            h.definition_level_encoding =
                                r.i32(t, "DataPageHeader.definition_level_encoding");
                            return true;
                        case 4:
                            h.repetition_level_encoding =
                                r.i32(t, "DataPageHeader.repetition_level_encoding");
                            return true;
                        default:
                            return false;
                    }
                });
                return true;
            case 7:  // DictionaryPageHeader
                r.read_struct(type, "DictionaryPageHeader", [&](std::int16_t f, Type t) {
                    if (f == 1) {
                        h.num_values = r.i32(t, "DictionaryPageHeader.num_values");
                        return true;
                    }
                    if (f == 2) {
                        h.encoding = r.i32(t, "DictionaryPageHeader.encoding");
                        return true;
                    }
                    return false;
                });
                return true;
            case 8:  // DataPageHeaderV2
                r.read_struct(type, "DataPageHeaderV2", [&](std::int16_t f, Type t) {
                    switch (f) {
                        case 1:
                            h.num_values = r.i32(t, "DataPageHeaderV2.num_values");
                            return true;
                        case 2:
                            h.num_nulls = r.i32(t, "DataPageHeaderV2.num_nulls");
                            return true;
                        case 3:
                            h.num_rows = r.i32(t, "DataPageHeaderV2.num_rows");
                            return true;
                        case 4:
                            h.encoding = r.i32(t, "DataPageHeaderV2.encoding");
                            return true;
                        case 5:
                            h.definition_levels_size =
                                r.i32(t, "DataPageHeaderV2.definition_levels_byte_length");
                            return true;
                        case 6:
                            h.repetition_levels_size =
                                r.i32(t, "DataPageHeaderV2.repetition_levels_byte_length");
                            return true;
                        case 7:
                            h.is_compressed = r.boolean(t, "DataPageHeaderV2.is_compressed");
                            return true;
                        default:
                            return false;
                    }
                });
                return true;
            default:
                return false;
        }
    });
    h.header_size = r.offset();
    if (h.type < 0 || h.uncompressed_size < 0 || h.compressed_size < 0)
        r.fail("a page header without its type or sizes");
    return h;
}

}  // namespace gpt2::parquet
