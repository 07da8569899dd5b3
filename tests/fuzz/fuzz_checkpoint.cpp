// Fuzzes gpt2::load_checkpoint on llm.c model files and checkpoints (header, sizes, trailer).
#include <cstdint>
#include <cstring>
#include <vector>

#include "formats/checkpoint.hpp"
#include "fuzz_support.hpp"

namespace {

constexpr std::size_t kHeaderBytes = 256 * sizeof(std::int32_t);
constexpr std::size_t kFooterBytes = 24;  // "GPT2CKP1", trailer offset, checksum

void load(const std::filesystem::path& path, std::span<const std::uint8_t> bytes) {
    gpt2::fuzz::write_bytes(path, bytes);
    try {
        const gpt2::LoadedModel loaded = gpt2::load_checkpoint(path);
        const gpt2::ParameterLayout layout(loaded.model.config);
        FUZZ_CHECK(loaded.model.params.size() == layout.total());
        // Header int 1 is the version: 5 (llm.c's bf16 file) holds 2-byte parameters and nothing
        // after them, 3 holds floats and optionally our trailer.
        std::int32_t version = 0;
        std::memcpy(&version, bytes.data() + sizeof(std::int32_t), sizeof(version));
        const std::size_t element = version == 5 ? 2 : sizeof(float);
        FUZZ_CHECK(kHeaderBytes + layout.total() * element <= bytes.size());
        FUZZ_CHECK(loaded.extras.has_value() ==
                   (bytes.size() != kHeaderBytes + layout.total() * element));
        // What the training and inference programs do next with a checkpoint's tokenizer.
        if (loaded.extras && !loaded.extras->tokenizer.empty()) {
            try {
                const auto tokenizer = gpt2::deserialize_tokenizer(loaded.extras->tokenizer);
                gpt2::fuzz::exercise_tokenizer(*tokenizer, loaded.extras->config_json);
            } catch (const gpt2::InputError& error) {
                gpt2::fuzz::rejected(error);
            }
        }
    } catch (const gpt2::InputError& error) {
        gpt2::fuzz::rejected(error);
    }
}

// The checksum stops mutations from reaching the trailer parser: recompute it the way the format
// defines it (header, parameters, trailer sections, chained) so mutated trailers get parsed too.
bool fix_checksum(std::vector<std::uint8_t>& bytes) {
    if (bytes.size() < kHeaderBytes + kFooterBytes) return false;
    const std::size_t footer = bytes.size() - kFooterBytes;
    if (std::memcmp(bytes.data() + footer, "GPT2CKP1", 8) != 0) return false;
    std::uint64_t trailer_offset = 0;
    std::memcpy(&trailer_offset, bytes.data() + footer + 8, 8);
    if (trailer_offset < kHeaderBytes || trailer_offset > footer) return false;
    const std::span<const std::uint8_t> all(bytes);
    std::uint64_t sum = gpt2::checksum64(all.first(kHeaderBytes));
    sum = gpt2::checksum64(all.subspan(kHeaderBytes, trailer_offset - kHeaderBytes), sum);
    sum = gpt2::checksum64(all.subspan(trailer_offset, footer - trailer_offset), sum);
    std::uint64_t stored = 0;
    std::memcpy(&stored, bytes.data() + footer + 16, 8);
    if (stored == sum) return false;  // already right: nothing new to load
    std::memcpy(bytes.data() + footer + 16, &sum, 8);
    return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size > gpt2::fuzz::kMaxInputBytes) return -1;
    const std::filesystem::path path = gpt2::fuzz::scratch_dir() / "model.bin";
    const std::span<const std::uint8_t> input(data, size);
    load(path, input);
    std::vector<std::uint8_t> fixed(input.begin(), input.end());
    if (fix_checksum(fixed)) load(path, fixed);
    return 0;
}
