// Fuzzes gpt2::load_gpt2_tokenizer (encoder.json + vocab.bpe) and uses the tokenizer it returns.
#include <algorithm>
#include <cstdint>

#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size > gpt2::fuzz::kMaxInputBytes) return -1;
    const std::span<const std::uint8_t> input(data, size);
    // encoder.json is the input up to its first NUL byte, vocab.bpe the rest.
    const auto split = std::find(input.begin(), input.end(), std::uint8_t{0});
    const auto encoder = input.first(static_cast<std::size_t>(split - input.begin()));
    const auto merges = split == input.end() ? input.last(0) : input.subspan(encoder.size() + 1);
    const std::filesystem::path& dir = gpt2::fuzz::scratch_dir();
    gpt2::fuzz::write_bytes(dir / "encoder.json", encoder);
    gpt2::fuzz::write_bytes(dir / "vocab.bpe", merges);
    std::unique_ptr<gpt2::Tokenizer> tokenizer;
    try {
        tokenizer = gpt2::load_gpt2_tokenizer(dir);
    } catch (const gpt2::InputError& error) {
        gpt2::fuzz::rejected(error);
        return 0;
    }
    FUZZ_CHECK(tokenizer->kind() == gpt2::TokenizerKind::Gpt2);
    FUZZ_CHECK(tokenizer->token_bytes(*tokenizer->eot_id()) == "<|endoftext|>");
    gpt2::fuzz::exercise_tokenizer(
        *tokenizer, std::string_view(reinterpret_cast<const char*>(merges.data()), merges.size()));
    return 0;
}
