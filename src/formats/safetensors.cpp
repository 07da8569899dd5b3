#include "formats/safetensors.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "core/error.hpp"
#include "core/file_io.hpp"

namespace gpt2 {

namespace {

// Every dtype the format defines, with its size: a file may hold tensors we do not convert (a
// mask buffer, say), and their byte ranges must still be checked.
std::optional<std::size_t> dtype_bytes(std::string_view dtype) {
    static const std::map<std::string_view, std::size_t> kSizes = {
        {"BOOL", 1}, {"U8", 1},  {"I8", 1},   {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2},
        {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},     {"U32", 4},     {"F32", 4},
        {"I64", 8},  {"U64", 8}, {"F64", 8},  {"C64", 8}};
    const auto it = kSizes.find(dtype);
    if (it == kSizes.end()) return std::nullopt;
    return it->second;
}

std::optional<ElementType> element_type_of(std::string_view dtype) {
    if (dtype == "F32") return ElementType::F32;
    if (dtype == "F16") return ElementType::F16;
    if (dtype == "BF16") return ElementType::Bf16;
    return std::nullopt;
}

}  // namespace

std::int64_t SafetensorsTensor::elements() const {
    std::int64_t n = 1;
    for (const std::int64_t d : shape)
        n *= d;
    return n;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view tensor) const {
    for (const SafetensorsTensor& t : tensors_) {
        if (t.name == tensor) return &t;
    }
    return nullptr;
}

SafetensorsFile SafetensorsFile::read(const std::filesystem::path& path) {
    SafetensorsFile file;
    file.name_ = path.string();
    file.file_ = std::make_unique<const MappedFile>(path);
    file.index(file.file_->bytes());
    for (SafetensorsTensor& t : file.tensors_)
        t.mapped = file.file_.get();
    return file;
}

namespace {

// An error naming the file.
struct Failure {
    std::string file;
    [[nodiscard]] InputError operator()(const std::string& what) const {
        return InputError(file + ": " + what);
    }
};

// The JSON header after the 8-byte length, checked against the file's size.
nlohmann::json parse_header(std::span<const std::uint8_t> bytes, const Failure& fail,
                            std::uint64_t& header_size) {
    if (bytes.size() < 8) {
        throw fail("too short for a safetensors file (" + std::to_string(bytes.size()) +
                   " bytes; the header length alone takes 8)");
    }
    header_size = 0;
    std::memcpy(&header_size, bytes.data(), 8);
    if (header_size > kMaxSafetensorsHeader) {
        throw fail("header length " + std::to_string(header_size) + " exceeds the limit of " +
                   std::to_string(kMaxSafetensorsHeader) + " bytes (corrupt or not safetensors)");
    }
    if (header_size > bytes.size() - 8) {
        throw fail("header length " + std::to_string(header_size) + " runs past the end of the " +
                   std::to_string(bytes.size()) + "-byte file (truncated?)");
    }
    nlohmann::json header;
    try {
        header = nlohmann::json::parse(
            bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header_size));
    } catch (const nlohmann::json::exception& e) {
        throw fail(std::string("header is not valid JSON: ") + e.what());
    }
    if (!header.is_object()) throw fail("header is not a JSON object");

    return header;
}

// One tensor's entry: dtype, shape and data_offsets, whose byte count must be shape x dtype.
struct TensorBytes {
    std::uint64_t begin, end;
    std::size_t tensor;
};
SafetensorsTensor parse_tensor_entry(const std::string& key, const nlohmann::json& value,
                                     std::size_t data_size, const Failure& fail,
                                     std::uint64_t& begin, std::uint64_t& end) {
    const std::string where = "tensor " + key;
    if (!value.is_object()) throw fail(where + ": not a JSON object");
    SafetensorsTensor tensor;
    tensor.name = key;
    if (!value.contains("dtype") || !value["dtype"].is_string()) {
        throw fail(where + ": missing dtype");
    }
    tensor.dtype = value["dtype"].get<std::string>();
    const std::optional<std::size_t> size = dtype_bytes(tensor.dtype);
    if (!size) throw fail(where + ": unknown dtype \"" + tensor.dtype + "\"");
    tensor.type = element_type_of(tensor.dtype);
    if (!value.contains("shape") || !value["shape"].is_array()) {
        throw fail(where + ": missing shape");
    }
    // Products are checked against the file size as they grow, so none can overflow.
    std::uint64_t elements = 1;
    for (const auto& dim : value["shape"]) {
        if (!dim.is_number_unsigned())
            throw fail(where + ": shape " + value["shape"].dump() +
                       " is not a list of non-negative integers");
        const auto d = dim.get<std::uint64_t>();
        if (d != 0 && elements > data_size / d) {
            throw fail(where + ": shape " + value["shape"].dump() + " is larger than the file");
        }
        elements *= d;
        tensor.shape.push_back(static_cast<std::int64_t>(d));
    }
    const auto& offsets = value.contains("data_offsets") ? value["data_offsets"] : nullptr;
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
        throw fail(where + ": data_offsets must be [begin, end]");
    }
    begin = offsets[0].get<std::uint64_t>();
    end = offsets[1].get<std::uint64_t>();
    if (begin > end || end > data_size) {
        throw fail(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                   "] lie outside the " + std::to_string(data_size) + " bytes of data");
    }
    if (end - begin != elements * *size) {
        throw fail(where + ": data_offsets give " + std::to_string(end - begin) +
                   " bytes, but shape " + value["shape"].dump() + " of " + tensor.dtype +
                   " needs " + std::to_string(elements * *size));
    }
    return tensor;
}

// The ranges (sorted) must tile the data exactly: no hole, no overlap, nothing after the last.
void check_tiling(std::span<const TensorBytes> ranges, std::span<const SafetensorsTensor> tensors,
                  std::size_t data_size, const Failure& fail) {
    std::uint64_t covered = 0;
    for (const TensorBytes& r : ranges) {
        const std::string& tensor = tensors[r.tensor].name;
        if (r.begin < covered) {
            throw fail("tensor " + tensor + ": data_offsets [" + std::to_string(r.begin) + ", " +
                       std::to_string(r.end) + "] overlap the previous tensor's");
        }
        if (r.begin > covered) {
            throw fail("tensor " + tensor + ": data_offsets begin at " + std::to_string(r.begin) +
                       ", leaving a hole after byte " + std::to_string(covered));
        }
        covered = r.end;
    }
    if (covered != data_size) {
        throw fail(std::to_string(data_size - covered) +
                   " trailing bytes after the last tensor (truncated or corrupt header)");
    }
}

}  // namespace

SafetensorsFile SafetensorsFile::parse(std::vector<std::uint8_t> bytes, std::string name) {
    SafetensorsFile file;
    file.name_ = std::move(name);
    file.bytes_ = std::move(bytes);
    file.index(file.bytes_);
    return file;
}

void SafetensorsFile::index(std::span<const std::uint8_t> bytes) {
    const Failure fail{name_};
    std::uint64_t header_size = 0;
    const nlohmann::json header = parse_header(bytes, fail, header_size);
    SafetensorsFile& file = *this;
    const std::size_t data_start = 8 + static_cast<std::size_t>(header_size);
    const std::size_t data_size = bytes.size() - data_start;
    std::vector<TensorBytes> ranges;
    for (const auto& [key, value] : header.items()) {
        if (key == "__metadata__") {
            if (!value.is_object()) throw fail("__metadata__ is not a JSON object");
            for (const auto& [mkey, mvalue] : value.items()) {
                if (!mvalue.is_string()) {
                    throw fail("__metadata__." + mkey + " is not a string");
                }
                file.metadata_.emplace(mkey, mvalue.get<std::string>());
            }
            continue;
        }
        std::uint64_t begin = 0, end = 0;
        SafetensorsTensor tensor = parse_tensor_entry(key, value, data_size, fail, begin, end);
        ranges.push_back({begin, end, file.tensors_.size()});
        file.tensors_.push_back(std::move(tensor));
    }
    std::sort(ranges.begin(), ranges.end(), [](const TensorBytes& a, const TensorBytes& b) {
        return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
    });
    check_tiling(ranges, file.tensors_, data_size, fail);
    std::vector<SafetensorsTensor> ordered;
    ordered.reserve(ranges.size());
    for (const TensorBytes& r : ranges) {
        SafetensorsTensor t = std::move(file.tensors_[r.tensor]);
        t.bytes = bytes.subspan(data_start + static_cast<std::size_t>(r.begin),
                                static_cast<std::size_t>(r.end - r.begin));
        ordered.push_back(std::move(t));
    }
    file.tensors_ = std::move(ordered);
}

std::uint64_t SafetensorsOutput::byte_count() const {
    if (!make_bytes) return bytes.size();
    std::uint64_t elements = 1;
    for (const std::int64_t d : shape)
        elements *= static_cast<std::uint64_t>(d);
    return elements * element_bytes(type);
}

std::filesystem::path write_safetensors(const std::filesystem::path& path,
                                        std::span<const SafetensorsOutput> tensors,
                                        const std::map<std::string, std::string>& metadata) {
    nlohmann::json header = nlohmann::json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    std::uint64_t offset = 0;
    for (const SafetensorsOutput& t : tensors) {
        header[t.name] = {{"dtype", element_type_name(t.type)},
                          {"shape", t.shape},
                          {"data_offsets", {offset, offset + t.byte_count()}}};
        offset += t.byte_count();
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');  // data 8-byte aligned, as the library writes it
    const std::uint64_t header_size = text.size();
    std::vector<std::uint8_t> head(8 + text.size());
    std::memcpy(head.data(), &header_size, 8);
    std::memcpy(head.data() + 8, text.data(), text.size());
    AtomicFileWriter file(path);
    file.write(head);
    for (const SafetensorsOutput& t : tensors) {
        if (!t.make_bytes) {
            file.write(t.bytes);
            continue;
        }
        const std::vector<std::uint8_t> made = t.make_bytes();
        if (made.size() != t.byte_count()) {
            throw std::logic_error("write_safetensors: tensor " + t.name + " made " +
                                   std::to_string(made.size()) + " bytes, its shape needs " +
                                   std::to_string(t.byte_count()));
        }
        file.write(made);
    }
    file.commit();
    return path;
}

}  // namespace gpt2
