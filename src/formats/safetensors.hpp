// Hugging Face's safetensors files: an 8-byte little-endian header length, a JSON header giving
// each tensor's dtype, shape and byte range, then the tensors' bytes. A strict reader (every byte
// of the data accounted for exactly once, sizes equal to shape x dtype) and an atomic writer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/file_io.hpp"
#include "formats/element_type.hpp"

namespace gpt2 {

// The largest header the reader accepts (safetensors' own limit is 100 MB).
inline constexpr std::uint64_t kMaxSafetensorsHeader = 100'000'000;

struct SafetensorsTensor {
    std::string name;
    std::string dtype;                // as the file spells it ("F32", "I64", ...)
    std::optional<ElementType> type;  // set for the types we convert (F32, F16, BF16)
    std::vector<std::int64_t> shape;
    std::span<const std::uint8_t> bytes;
    [[nodiscard]] std::int64_t elements() const;
    // Hands back the memory of `bytes` once read (a mapped file's pages; see MappedFile), so a
    // model read tensor by tensor never holds the whole file beside itself.
    void release_bytes() const {
        if (mapped != nullptr) mapped->release(bytes);
    }
    const MappedFile* mapped = nullptr;  // the file `bytes` lies in, when mapped
};

class SafetensorsFile {
  public:
    // Reads and checks `path`; InputError naming the file and the field at fault.
    [[nodiscard]] static SafetensorsFile read(const std::filesystem::path& path);
    // The same for bytes already in memory (`name` is how errors name them).
    [[nodiscard]] static SafetensorsFile parse(std::vector<std::uint8_t> bytes, std::string name);

    SafetensorsFile(SafetensorsFile&&) = default;
    SafetensorsFile& operator=(SafetensorsFile&&) = default;
    SafetensorsFile(const SafetensorsFile&) = delete;
    SafetensorsFile& operator=(const SafetensorsFile&) = delete;

    [[nodiscard]] const std::string& name() const { return name_; }
    // In the order of their data in the file.
    [[nodiscard]] const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
    [[nodiscard]] const SafetensorsTensor* find(std::string_view tensor) const;
    [[nodiscard]] const std::map<std::string, std::string>& metadata() const { return metadata_; }

  private:
    SafetensorsFile() = default;
    std::string name_;
    // The tensors' spans point into one of these: bytes given to parse, or the file read.
    void index(std::span<const std::uint8_t> bytes);
    std::vector<std::uint8_t> bytes_;
    std::unique_ptr<const MappedFile> file_;
    std::vector<SafetensorsTensor> tensors_;
    std::map<std::string, std::string> metadata_;
};

// A tensor to write: its bytes in `type`, given, or made by `make_bytes` when the writer reaches
// the tensor (then shape's elements x the type's size of them), so that a model is written
// without a second copy of it in memory.
struct SafetensorsOutput {
    std::string name;
    ElementType type = ElementType::F32;
    std::vector<std::int64_t> shape;
    std::vector<std::uint8_t> bytes;
    std::function<std::vector<std::uint8_t>()> make_bytes = nullptr;  // set: `bytes` unread
    [[nodiscard]] std::uint64_t byte_count() const;
};

// Writes the tensors (data in the given order) and `metadata` as "__metadata__", atomically;
// returns path. InputError naming the file on failure.
std::filesystem::path write_safetensors(const std::filesystem::path& path,
                                        std::span<const SafetensorsOutput> tensors,
                                        const std::map<std::string, std::string>& metadata);

}  // namespace gpt2
