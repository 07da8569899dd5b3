#include "formats/model_file.hpp"

#include "core/error.hpp"
#include "formats/hugging_face.hpp"

namespace gpt2 {

LoadedModel load_model_file(const std::filesystem::path& path, std::vector<std::string>* notes) {
    if (is_hugging_face_model(path)) {
        HuggingFaceNotes hf;
        LoadedModel loaded = load_hugging_face_model(path, &hf);
        if (notes != nullptr) notes->insert(notes->end(), hf.lines.begin(), hf.lines.end());
        return loaded;
    }
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
        throw InputError(path.string() +
                         ": a directory, but not a Hugging Face model (no config.json or "
                         "model.safetensors): expected a model file or such a directory");
    }
    return load_checkpoint(path);
}

}  // namespace gpt2
