#include "formats/model_file.hpp"

#include <algorithm>
#include <map>

#include "core/error.hpp"
#include "formats/gguf.hpp"
#include "formats/hugging_face.hpp"

namespace gpt2 {

namespace {

// As --to spells it.
std::string format_name(OutputFormat format) {
    switch (format) {
        case OutputFormat::HuggingFace:
            return "hf";
        case OutputFormat::Gguf:
            return "gguf";
        case OutputFormat::Llmc:
            return "llmc";
    }
    return "hf";
}

// The dtypes a format has, in the order a refusal lists them.
std::vector<std::string> dtypes(OutputFormat format) {
    switch (format) {
        case OutputFormat::HuggingFace:
            return {"f32", "f16", "bf16"};
        case OutputFormat::Gguf:
            return {"f32", "f16", "bf16", "q8_0"};
        case OutputFormat::Llmc:
            return {"f32", "bf16"};
    }
    return {};
}

std::string write_as_llmc(const ModelOutput& output, const Model& model, const Tokenizer* tokenizer,
                          std::vector<std::string>& notes) {
    const bool bf16 = output.dtype == "bf16";
    save_llmc_model(output.path, model, bf16 ? kLlmcModelVersionBf16 : kLlmcModelVersionFp32);
    if (tokenizer != nullptr) {
        notes.push_back(
            "llm.c's model file holds no tokenizer: give llm.c its own "
            "gpt2_tokenizer.bin (prepare_data writes one)");
    }
    return "llm.c model file, version " + std::string(bf16 ? "5" : "3") + " (" + output.dtype + ")";
}

std::string write_as_gguf(const ModelOutput& output, const Model& model, const Tokenizer* tokenizer,
                          const std::filesystem::path& input) {
    if (tokenizer == nullptr) {
        throw InputError(input.string() +
                         " has no tokenizer, and a GGUF file must embed one: pass "
                         "--tokenizer-dir DIR (GPT-2's encoder.json and vocab.bpe)");
    }
    const std::map<std::string, GgufWeights> weights = {{"f32", GgufWeights::F32},
                                                        {"f16", GgufWeights::F16},
                                                        {"bf16", GgufWeights::Bf16},
                                                        {"q8_0", GgufWeights::Q8_0}};
    const std::string name = output.name.empty() ? output.path.stem().string() : output.name;
    write_gguf(output.path, model, *tokenizer, weights.at(output.dtype), name);
    return "GGUF v3, llama.cpp architecture gpt2, " + output.dtype + " matrices";
}

std::string write_as_hugging_face(const ModelOutput& output, const Model& model,
                                  const Tokenizer* tokenizer, const std::filesystem::path& input) {
    if (tokenizer != nullptr && tokenizer->kind() == TokenizerKind::Char && !output.weights_only) {
        throw InputError(
            input.string() +
            ": its char tokenizer has no Hugging Face form (GPT-2's tokenizer classes are "
            "byte-level BPE): pass --weights-only to write the weights without tokenizer files");
    }
    const ElementType type = output.dtype == "f32"   ? ElementType::F32
                             : output.dtype == "f16" ? ElementType::F16
                                                     : ElementType::Bf16;
    const bool with_tokenizer = tokenizer != nullptr && !output.weights_only;
    write_hugging_face_model(output.path, model, with_tokenizer ? tokenizer : nullptr, type);
    return "Hugging Face GPT2LMHeadModel, model.safetensors " + output.dtype +
           (with_tokenizer ? ", vocab.json, merges.txt" : ", no tokenizer files");
}

}  // namespace

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

OutputFormat output_format(const std::filesystem::path& path, std::string_view to) {
    if (to == "hf") return OutputFormat::HuggingFace;
    if (to == "gguf") return OutputFormat::Gguf;
    if (to == "llmc") return OutputFormat::Llmc;
    if (path.extension() == ".gguf") return OutputFormat::Gguf;
    if (path.extension() == ".bin") return OutputFormat::Llmc;
    return OutputFormat::HuggingFace;
}

void check_model_output(const ModelOutput& output, const std::filesystem::path& input) {
    const std::string format = format_name(output.format);
    const std::vector<std::string> allowed = dtypes(output.format);
    if (std::find(allowed.begin(), allowed.end(), output.dtype) == allowed.end()) {
        std::string list;
        for (const std::string& d : allowed)
            list += (list.empty() ? "" : ", ") + d;
        throw UsageError("--dtype " + output.dtype + " is not available for " + format +
                         " output (" + list + ")");
    }
    if (output.weights_only && output.format != OutputFormat::HuggingFace) {
        throw UsageError("--weights-only applies to Hugging Face output only (" + format +
                         " is written as it is)");
    }
    if (!output.name.empty() && output.format != OutputFormat::Gguf) {
        throw UsageError("--name sets general.name of GGUF output only; " + format +
                         " output has no name to set");
    }
    std::error_code ec;
    if (std::filesystem::exists(output.path, ec) &&
        std::filesystem::equivalent(input, output.path, ec)) {
        throw UsageError(output.path.string() + ": the output is the input");
    }
}

OutputTokenizer output_tokenizer(const LoadedModel& loaded, const std::filesystem::path& input,
                                 const std::filesystem::path& tokenizer_dir) {
    OutputTokenizer out;
    if (loaded.extras && !loaded.extras->tokenizer.empty()) {
        out.tokenizer = deserialize_tokenizer(loaded.extras->tokenizer);
        out.origin = "the input's own";
        if (!tokenizer_dir.empty()) {
            throw UsageError("--tokenizer-dir " + tokenizer_dir.string() + ": " + input.string() +
                             " carries its own tokenizer; leave out --tokenizer-dir");
        }
    } else if (!tokenizer_dir.empty()) {
        out.tokenizer = load_gpt2_tokenizer(tokenizer_dir);
        out.origin = "GPT-2's from " + tokenizer_dir.string();
        if (out.tokenizer->vocab_size() != loaded.model.config.vocab_size) {
            throw InputError("--tokenizer-dir " + tokenizer_dir.string() + ": " +
                             std::to_string(out.tokenizer->vocab_size()) +
                             " tokens, but the model has a vocabulary of " +
                             std::to_string(loaded.model.config.vocab_size));
        }
    }
    return out;
}

std::string write_model_file(const ModelOutput& output, const Model& model,
                             const Tokenizer* tokenizer, const std::filesystem::path& input,
                             std::vector<std::string>& notes) {
    if (output.format == OutputFormat::Llmc) return write_as_llmc(output, model, tokenizer, notes);
    if (output.format == OutputFormat::Gguf) return write_as_gguf(output, model, tokenizer, input);
    return write_as_hugging_face(output, model, tokenizer, input);
}

}  // namespace gpt2
