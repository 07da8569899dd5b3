#include "formats/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>

#include "core/bytes.hpp"
#include "core/error.hpp"

namespace gpt2 {

namespace {
constexpr std::size_t kHeaderInts = 256;
constexpr std::size_t kHeaderBytes = kHeaderInts * sizeof(std::int32_t);
// Footer: magic, trailer offset, checksum of everything before the footer.
constexpr std::array<char, 8> kFooterMagic = {'G', 'P', 'T', '2', 'C', 'K', 'P', '1'};
constexpr std::size_t kFooterBytes = 8 + 8 + 8;
// Sections an earlier build does not know it skips; the record comes only in version-30 files.
enum class TrailerTag : std::uint32_t { Tokenizer = 1, ConfigJson = 2, ConfigRecord = 3 };
constexpr std::size_t kSectionHeader = sizeof(std::uint32_t) + sizeof(std::uint64_t);

std::span<const std::uint8_t> record_bytes(const ConfigRecord& record) {
    return {reinterpret_cast<const std::uint8_t*>(record.data()), sizeof(record)};
}

std::array<std::int32_t, kHeaderInts> llmc_header(const ModelConfig& c, std::int32_t version) {
    std::array<std::int32_t, kHeaderInts> header{};
    header[0] = kLlmcModelMagic;
    header[1] = version;
    header[2] = c.max_seq_len;
    header[3] = c.vocab_size;
    header[4] = c.num_layers;
    header[5] = c.num_heads;
    header[6] = c.channels;
    header[7] = c.padded_vocab_size;
    return header;
}

}  // namespace

std::filesystem::path save_llmc_model(const std::filesystem::path& path, const Model& model,
                                      std::int32_t version) {
    if (!model.config.is_gpt2()) {
        throw InputError(path.string() + ": llm.c's model files hold GPT-2 only, not a " +
                         describe(model.config) + " model (write a checkpoint instead)");
    }
    if (version == kLlmcModelVersionFp32) return save_checkpoint(path, model, std::nullopt);
    if (version != kLlmcModelVersionBf16) {
        throw InputError(path.string() +
                         ": llm.c model files are version 3 (fp32) or 5 (bf16), not " +
                         std::to_string(version));
    }
    const auto header = llmc_header(model.config, version);
    AtomicFileWriter file(path);
    file.write(std::span(reinterpret_cast<const std::uint8_t*>(header.data()), kHeaderBytes));
    // Rounded a piece at a time: no bf16 copy of the whole model in memory.
    constexpr std::size_t kPiece = std::size_t{1} << 22;
    std::vector<Bf16> piece(std::min(kPiece, model.params.size()));
    for (std::size_t first = 0; first < model.params.size(); first += kPiece) {
        const std::size_t count = std::min(kPiece, model.params.size() - first);
        convert_to_bf16(piece.data(), model.params.data() + first, count);
        file.write(
            std::span(reinterpret_cast<const std::uint8_t*>(piece.data()), count * sizeof(Bf16)));
    }
    file.commit();
    return path;
}

std::filesystem::path save_checkpoint(const std::filesystem::path& path, const Model& model,
                                      const std::optional<CheckpointExtras>& extras) {
    const std::span<const float> params = model.params.span();
    return save_checkpoint(
        path, model.config, [&](const ParameterSink& sink) { sink(params); }, extras);
}

std::filesystem::path save_checkpoint(const std::filesystem::path& path, const ModelConfig& config,
                                      const ParameterSource& source,
                                      const std::optional<CheckpointExtras>& extras) {
    const bool record = !config.is_gpt2();
    const auto header =
        llmc_header(config, record ? kModelVersionWithRecord : kLlmcModelVersionFp32);
    const std::span<const std::uint8_t> header_bytes(
        reinterpret_cast<const std::uint8_t*>(header.data()), kHeaderBytes);
    const std::size_t param_count = ParameterLayout(config).total();
    const bool trailer_follows = extras.has_value() || record;
    AtomicFileWriter file(path);
    file.write(header_bytes);
    // The checksum is chained as the reader chains it: header, then parameters (as one piece of
    // bytes however the source cuts them), then the trailer.
    Checksum64 param_sum(checksum64(header_bytes));
    std::size_t written = 0;
    source([&](std::span<const float> piece) {
        if (piece.size() > param_count - written) {
            throw std::logic_error("save_checkpoint: the parameter source gives more than " +
                                   std::to_string(param_count) + " parameters");
        }
        const std::span<const std::uint8_t> bytes(
            reinterpret_cast<const std::uint8_t*>(piece.data()), piece.size_bytes());
        file.write(bytes);
        if (trailer_follows) param_sum.add(bytes);
        written += piece.size();
    });
    if (written != param_count) {
        throw std::logic_error("save_checkpoint: the parameter source gave " +
                               std::to_string(written) + " parameters of " +
                               std::to_string(param_count));
    }
    if (trailer_follows) {
        ByteWriter trailer;
        const auto add_section = [&](TrailerTag tag, std::span<const std::uint8_t> bytes) {
            trailer.put(static_cast<std::uint32_t>(tag));
            trailer.put(static_cast<std::uint64_t>(bytes.size()));
            trailer.raw(bytes);
        };
        const CheckpointExtras none;
        const CheckpointExtras& e = extras ? *extras : none;
        add_section(TrailerTag::Tokenizer, e.tokenizer);
        add_section(TrailerTag::ConfigJson,
                    std::span(reinterpret_cast<const std::uint8_t*>(e.config_json.data()),
                              e.config_json.size()));
        if (record) add_section(TrailerTag::ConfigRecord, record_bytes(to_config_record(config)));
        const std::uint64_t sum = checksum64(trailer.bytes(), param_sum.value());
        trailer.raw(std::string_view(kFooterMagic.data(), kFooterMagic.size()));
        trailer.put(static_cast<std::uint64_t>(kHeaderBytes + param_count * sizeof(float)));
        trailer.put(sum);
        file.write(trailer.bytes());
    }
    file.commit();
    return path;
}

std::uintmax_t checkpoint_file_bytes(const ModelConfig& config, std::size_t tokenizer_bytes,
                                     std::size_t config_json_bytes) {
    const std::size_t record = config.is_gpt2() ? 0 : kSectionHeader + sizeof(ConfigRecord);
    return kHeaderBytes + ParameterLayout(config).total() * sizeof(float) + 2 * kSectionHeader +
           tokenizer_bytes + config_json_bytes + record + kFooterBytes;
}

namespace {

// The parameters are copied out of the mapped file this many bytes at a time, each piece's pages
// handed back once copied: the file never sits in memory beside the model it fills.
constexpr std::size_t kLoadPieceBytes = std::size_t{16} << 20;

// llm.c's bf16 model file: the same layout in bf16, nothing after it. Widened exactly.
LoadedModel load_llmc_bf16(const MappedFile& file, const std::string& name,
                           const ModelConfig& config, const ParameterLayout& layout) {
    const std::span<const std::uint8_t> bytes = file.bytes();
    const std::size_t bf16_bytes = kHeaderBytes + layout.total() * sizeof(Bf16);
    if (bytes.size() != bf16_bytes) {
        throw InputError(name + ": " + std::to_string(bytes.size()) + " bytes, but an llm.c bf16 " +
                         describe(config) + " model file has " + std::to_string(bf16_bytes) +
                         " (truncated or not a model file)");
    }
    LoadedModel loaded{Model(config), std::nullopt};
    constexpr std::size_t kPiece = kLoadPieceBytes / sizeof(Bf16);
    for (std::size_t first = 0; first < layout.total(); first += kPiece) {
        const std::size_t count = std::min(kPiece, layout.total() - first);
        const auto piece = bytes.subspan(kHeaderBytes + first * sizeof(Bf16), count * sizeof(Bf16));
        for (std::size_t i = 0; i < count; ++i) {
            std::uint16_t bits;
            std::memcpy(&bits, piece.data() + i * sizeof(bits), sizeof(bits));
            loaded.model.params[first + i] = to_float(static_cast<Bf16>(bits));
        }
        file.release(piece);
    }
    return loaded;
}

// Calls visit(tag, bytes) for each tagged section of a trailer's `sections`.
template <typename Visit>
void for_each_section(std::span<const std::uint8_t> sections, const std::string& name,
                      Visit&& visit) {
    ByteReader trailer(sections, name + ": corrupt checkpoint trailer");
    while (trailer.remaining() > 0) {
        const auto tag = static_cast<TrailerTag>(trailer.get<std::uint32_t>("section tag"));
        const auto length = trailer.get<std::uint64_t>("section length");
        if (length > trailer.remaining()) throw InputError(name + ": corrupt checkpoint trailer");
        visit(tag, trailer.take(static_cast<std::size_t>(length), "section"));
    }
}

// Our trailer, `tail`: the file's bytes after the model's `model_bytes`, tagged sections
// (tokenizer, configuration) and a footer whose checksum covers the whole file; `model_sum` is that
// checksum chained over the header and the parameters.
CheckpointExtras read_trailer(std::span<const std::uint8_t> tail, const std::string& name,
                              std::size_t model_bytes, std::uint64_t model_sum) {
    // A trailer must end in our footer and match its checksum.
    if (tail.size() < kFooterBytes ||
        std::memcmp(tail.data() + tail.size() - kFooterBytes, kFooterMagic.data(), 8) != 0) {
        throw InputError(name +
                         ": unexpected bytes after the model (truncated or corrupt checkpoint)");
    }
    const std::size_t footer = tail.size() - kFooterBytes;
    ByteReader footer_reader(tail.subspan(footer + 8), name);
    const auto trailer_offset = footer_reader.get<std::uint64_t>("trailer offset");
    const auto stored_sum = footer_reader.get<std::uint64_t>("checksum");
    if (trailer_offset != model_bytes) {
        throw InputError(name + ": checkpoint footer does not match the model size (corrupt)");
    }
    // Chained over the same three pieces the writer hashed.
    if (checksum64(tail.first(footer), model_sum) != stored_sum) {
        throw InputError(name + ": checksum mismatch, the file is corrupt");
    }
    CheckpointExtras extras;
    for_each_section(tail.first(footer), name,
                     [&](TrailerTag tag, std::span<const std::uint8_t> section) {
                         if (tag == TrailerTag::Tokenizer) {
                             extras.tokenizer.assign(section.begin(), section.end());
                         }
                         if (tag == TrailerTag::ConfigJson) {
                             extras.config_json.assign(section.begin(), section.end());
                         }
                     });
    return extras;
}

// A version-30 file's configuration: its trailer's record (found through the footer before the
// weights are read; the checksum is verified with the rest afterwards), which must agree with the
// header's dimensions.
ModelConfig recorded_config(std::span<const std::uint8_t> bytes, const std::string& name,
                            const std::array<std::int32_t, kHeaderInts>& header) {
    if (bytes.size() < kHeaderBytes + kFooterBytes ||
        std::memcmp(bytes.data() + bytes.size() - kFooterBytes, kFooterMagic.data(), 8) != 0) {
        throw InputError(name + ": a version-30 checkpoint without its trailer (truncated)");
    }
    ByteReader footer(bytes.subspan(bytes.size() - kFooterBytes + 8), name);
    const auto offset = footer.get<std::uint64_t>("trailer offset");
    if (offset < kHeaderBytes || offset > bytes.size() - kFooterBytes) {
        throw InputError(name + ": checkpoint footer out of range (corrupt)");
    }
    std::optional<ConfigRecord> record;
    for_each_section(bytes.subspan(offset, bytes.size() - kFooterBytes - offset), name,
                     [&](TrailerTag tag, std::span<const std::uint8_t> section) {
                         if (tag != TrailerTag::ConfigRecord) return;
                         record = config_record_of_bytes(section, name);  // version 1 or 2
                     });
    if (!record)
        throw InputError(name + ": a version-30 checkpoint without its configuration record");
    const ModelConfig config = from_config_record(*record, name);
    if (config.max_seq_len != header[2] || config.vocab_size != header[3] ||
        config.num_layers != header[4] || config.num_heads != header[5] ||
        config.channels != header[6] || config.padded_vocab_size != header[7]) {
        throw InputError(name +
                         ": the header's dimensions differ from the configuration record's "
                         "(corrupt)");
    }
    return config;
}

}  // namespace

LoadedModel load_checkpoint(const std::filesystem::path& path) {
    const MappedFile file(path);
    const std::span<const std::uint8_t> bytes = file.bytes();
    const std::string name = path.string();
    if (bytes.size() < kHeaderBytes) {
        throw InputError(name + ": too short for an llm.c model header (" +
                         std::to_string(bytes.size()) + " bytes), truncated or not a model file");
    }
    const auto header =
        ByteReader(bytes.first(kHeaderBytes), name).get_array<std::int32_t, kHeaderInts>("header");
    const auto h = [&](std::size_t i) { return header[i]; };
    if (h(0) != kLlmcModelMagic) {
        // A file of a known kind is named as such (a shard, a resume state, a tokenizer file...).
        const std::string_view head(reinterpret_cast<const char*>(bytes.data()), 64);
        if (const std::optional<std::string> kind = known_file_kind(head)) {
            throw InputError(name + " is " + *kind + ", not a model file");
        }
        throw InputError(name + ": bad magic " + std::to_string(h(0)) + " (expected " +
                         std::to_string(kLlmcModelMagic) + "), not an llm.c model file");
    }
    if (h(1) != kLlmcModelVersionFp32 && h(1) != kLlmcModelVersionBf16 &&
        h(1) != kModelVersionWithRecord) {
        throw InputError(name + ": unsupported version " + std::to_string(h(1)) +
                         " (3, float32, and 5, llm.c's bf16, are supported, and 30, a checkpoint "
                         "of another architecture than GPT-2)");
    }
    ModelConfig config{h(2), h(3), h(7), h(4), h(5), h(6)};
    validate_config(config, name);
    if (h(1) == kModelVersionWithRecord) config = recorded_config(bytes, name, header);
    const ParameterLayout layout(config);
    if (h(1) == kLlmcModelVersionBf16) return load_llmc_bf16(file, name, config, layout);
    const std::size_t model_bytes = kHeaderBytes + layout.total() * sizeof(float);
    if (bytes.size() < model_bytes) {
        throw InputError(name + ": truncated: " + std::to_string(bytes.size()) + " bytes, the " +
                         describe(config) + " model needs " + std::to_string(model_bytes));
    }
    const bool has_trailer = bytes.size() > model_bytes;  // else a plain llm.c model file
    LoadedModel loaded{Model(config), std::nullopt};
    auto* params = reinterpret_cast<std::uint8_t*>(loaded.model.params.data());
    Checksum64 model_sum(checksum64(bytes.first(kHeaderBytes)));
    for (std::size_t offset = kHeaderBytes; offset < model_bytes; offset += kLoadPieceBytes) {
        const auto piece = bytes.subspan(offset, std::min(kLoadPieceBytes, model_bytes - offset));
        std::memcpy(params + (offset - kHeaderBytes), piece.data(), piece.size());
        if (has_trailer) model_sum.add(piece);
        file.release(piece);
    }
    if (has_trailer) {
        loaded.extras =
            read_trailer(bytes.subspan(model_bytes), name, model_bytes, model_sum.value());
    }
    return loaded;
}

ModelFileKind model_file_kind(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in) return ModelFileKind::Other;
    const auto size = static_cast<std::size_t>(in.tellg());
    std::int32_t magic = 0;
    if (size < kHeaderBytes || !in.seekg(0) ||
        !in.read(reinterpret_cast<char*>(&magic), sizeof(magic)) || magic != kLlmcModelMagic) {
        return ModelFileKind::Other;
    }
    std::array<char, 8> footer{};
    if (size >= kHeaderBytes + kFooterBytes &&
        in.seekg(static_cast<std::streamoff>(size - kFooterBytes)) &&
        in.read(footer.data(), footer.size()) && footer == kFooterMagic) {
        return ModelFileKind::Checkpoint;
    }
    return ModelFileKind::PlainLlmc;
}

}  // namespace gpt2
