// Fuzzes the Hugging Face config.json reader: the input is config.json beside a fixed, valid
// model.safetensors (L=1 NH=2 C=8 V=16 maxT=8), read through gpt2::load_model_file.
#include <cstdint>
#include <filesystem>

#include "formats/hugging_face.hpp"
#include "formats/model_file.hpp"
#include "fuzz_support.hpp"

namespace {

const gpt2::ModelConfig kShape{8, 16, 128, 1, 2, 8};

const std::filesystem::path& model_dir() {
    static const std::filesystem::path dir = [] {
        const std::filesystem::path d = gpt2::fuzz::scratch_dir() / "hf";
        gpt2::Model model(kShape);
        gpt2::init_parameters(model, 1);
        gpt2::write_hugging_face_model(d, model, nullptr, gpt2::ElementType::F32);
        return d;
    }();
    return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size > gpt2::fuzz::kMaxInputBytes) return -1;
    const std::filesystem::path& dir = model_dir();
    gpt2::fuzz::write_bytes(dir / "config.json", std::span<const std::uint8_t>(data, size));
    try {
        std::vector<std::string> notes;
        const gpt2::LoadedModel loaded = gpt2::load_model_file(dir, &notes);
        // A config is accepted only when it describes the tensors beside it (n_head aside, which
        // the tensors cannot tell, but must divide n_embd).
        FUZZ_CHECK(loaded.model.config.channels == kShape.channels);
        FUZZ_CHECK(loaded.model.config.vocab_size == kShape.vocab_size);
        FUZZ_CHECK(loaded.model.config.num_layers == kShape.num_layers);
        FUZZ_CHECK(loaded.model.config.max_seq_len == kShape.max_seq_len);
        FUZZ_CHECK(kShape.channels % loaded.model.config.num_heads == 0);
    } catch (const gpt2::InputError& error) {
        gpt2::fuzz::rejected(error);
    }
    return 0;
}
