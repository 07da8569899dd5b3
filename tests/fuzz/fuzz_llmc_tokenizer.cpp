// Fuzzes gpt2::read_llmc_tokenizer (llm.c's decode-only gpt2_tokenizer.bin format).
#include <cstdint>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size > gpt2::fuzz::kMaxInputBytes) return -1;
    const std::filesystem::path path = gpt2::fuzz::scratch_dir() / "gpt2_tokenizer.bin";
    gpt2::fuzz::write_bytes(path, {data, size});
    try {
        const std::vector<std::string> tokens = gpt2::read_llmc_tokenizer(path);
        FUZZ_CHECK(!tokens.empty());
        std::size_t total = 1024;  // the header
        for (const std::string& token : tokens) {
            FUZZ_CHECK(!token.empty() && token.size() <= 255);
            total += 1 + token.size();
        }
        FUZZ_CHECK(total == size);
    } catch (const gpt2::InputError& error) {
        gpt2::fuzz::rejected(error);
    }
    return 0;
}
