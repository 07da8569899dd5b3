// Fuzzes gpt2::SafetensorsFile::parse (Hugging Face's safetensors header and data ranges).
#include <cstdint>
#include <cstring>
#include <vector>

#include "formats/safetensors.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size > gpt2::fuzz::kMaxInputBytes) return -1;
    try {
        const gpt2::SafetensorsFile file =
            gpt2::SafetensorsFile::parse(std::vector<std::uint8_t>(data, data + size), "fuzz");
        // What the reader promises: the tensors tile the data after the header exactly, each
        // holding shape x dtype bytes, in order.
        std::uint64_t header = 0;
        std::memcpy(&header, data, 8);
        std::size_t covered = 0;
        for (const gpt2::SafetensorsTensor& t : file.tensors()) {
            if (t.type) {
                FUZZ_CHECK(t.bytes.size() ==
                           static_cast<std::size_t>(t.elements()) * gpt2::element_bytes(*t.type));
                std::vector<float> values(static_cast<std::size_t>(t.elements()));
                gpt2::read_elements(values, t.bytes, *t.type);
            }
            covered += t.bytes.size();
        }
        FUZZ_CHECK(8 + header + covered == size);
    } catch (const gpt2::InputError& error) {
        gpt2::fuzz::rejected(error);
    }
    return 0;
}
