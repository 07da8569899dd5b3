// Fuzzes gpt2::load_gguf_model on GGUF files (header, metadata, tokenizer, tensor table, data).
#include <cstdint>
#include <vector>

#include "formats/gguf.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size > gpt2::fuzz::kMaxInputBytes) return -1;
    const std::filesystem::path path = gpt2::fuzz::scratch_dir() / "model.gguf";
    gpt2::fuzz::write_bytes(path, std::span<const std::uint8_t>(data, size));
    try {
        const gpt2::LoadedModel loaded = gpt2::load_gguf_model(path);
        // What the reader promises: a model of the shape it says, and its own tokenizer, whose
        // vocabulary is the model's.
        const gpt2::ParameterLayout layout(loaded.model.config);
        FUZZ_CHECK(loaded.model.params.size() == layout.total());
        FUZZ_CHECK(loaded.extras.has_value());
        const auto tokenizer = gpt2::deserialize_tokenizer(loaded.extras->tokenizer);
        FUZZ_CHECK(tokenizer->vocab_size() == loaded.model.config.vocab_size);
        gpt2::fuzz::exercise_tokenizer(*tokenizer, loaded.extras->config_json);
    } catch (const gpt2::InputError& error) {
        gpt2::fuzz::rejected(error);
    }
    return 0;
}
