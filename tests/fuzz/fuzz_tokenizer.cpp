// Fuzzes gpt2::deserialize_tokenizer (checkpoint/tokenizer.bin bytes), then uses the result.
#include <cstdint>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size > gpt2::fuzz::kMaxInputBytes) return -1;
    const std::span<const std::uint8_t> input(data, size);
    std::unique_ptr<gpt2::Tokenizer> tokenizer;
    try {
        tokenizer = gpt2::deserialize_tokenizer(input);
    } catch (const gpt2::InputError& error) {
        gpt2::fuzz::rejected(error);
        return 0;
    }
    // The format is canonical: what was accepted serializes back to the same bytes.
    const std::vector<std::uint8_t> serialized = tokenizer->serialize();
    FUZZ_CHECK(std::equal(serialized.begin(), serialized.end(), input.begin(), input.end()));
    gpt2::fuzz::exercise_tokenizer(*tokenizer,
                                   std::string_view(reinterpret_cast<const char*>(data), size));
    return 0;
}
