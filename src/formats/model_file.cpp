#include "formats/model_file.hpp"

#include <algorithm>
#include <array>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "core/error.hpp"
#include "formats/gguf.hpp"
#include "formats/hugging_face.hpp"
#include "formats/resume_state.hpp"

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
        case OutputFormat::GgufLora:
            return "gguf-lora";
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
        case OutputFormat::GgufLora:  // Q8_0 blocks are longer than an adapter's rank
            return {"f32", "f16", "bf16"};
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

// alpha as a person writes it: 16, 0.5.
std::string format_alpha(float alpha) {
    std::ostringstream out;
    out << alpha;
    return out.str();
}

GgufWeights gguf_weights(const std::string& dtype) {
    const std::map<std::string, GgufWeights> weights = {{"f32", GgufWeights::F32},
                                                        {"f16", GgufWeights::F16},
                                                        {"bf16", GgufWeights::Bf16},
                                                        {"q8_0", GgufWeights::Q8_0}};
    return weights.at(dtype);
}

std::string write_as_gguf(const ModelOutput& output, const Model& model, const Tokenizer* tokenizer,
                          const std::filesystem::path& input) {
    if (tokenizer == nullptr) {
        throw InputError(input.string() +
                         " has no tokenizer, and a GGUF file must embed one: pass "
                         "--tokenizer-dir DIR (GPT-2's encoder.json and vocab.bpe)");
    }
    const std::string name = output.name.empty() ? output.path.stem().string() : output.name;
    write_gguf(output.path, model, *tokenizer, gguf_weights(output.dtype), name);
    return std::string("GGUF v3, llama.cpp architecture ") +
           (model.config.is_gpt2() ? "gpt2, " : "llama, ") + output.dtype + " matrices";
}

std::string write_as_hugging_face(const ModelOutput& output, const Model& model,
                                  const Tokenizer* tokenizer) {
    const ElementType type = output.dtype == "f32"   ? ElementType::F32
                             : output.dtype == "f16" ? ElementType::F16
                                                     : ElementType::Bf16;
    const bool with_tokenizer = tokenizer != nullptr && !output.weights_only;
    write_hugging_face_model(output.path, model, with_tokenizer ? tokenizer : nullptr, type);
    return std::string("Hugging Face ") +
           (model.config.is_gpt2() ? "GPT2LMHeadModel" : "LlamaForCausalLM") +
           ", model.safetensors " + output.dtype +
           (with_tokenizer ? ", vocab.json, merges.txt" : ", no tokenizer files");
}

}  // namespace

namespace {
// The model files of a run's --out-dir (model_N.bin), newest step first.
std::vector<std::pair<std::int64_t, std::filesystem::path>> checkpoint_models(
    const std::filesystem::path& dir) {
    std::vector<std::pair<std::int64_t, std::filesystem::path>> found;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        if (!entry.path().filename().string().starts_with("model_")) continue;
        if (const auto step = checkpoint_step(entry.path()))
            found.emplace_back(*step, entry.path());
    }
    std::sort(found.begin(), found.end(),
              [](const auto& a, const auto& b) { return a.first > b.first; });
    return found;
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
        // A run's --out-dir: its newest model file that verifies (as --resume auto takes).
        for (const auto& [step, file] : checkpoint_models(path)) {
            try {
                LoadedModel loaded = load_checkpoint(file);
                if (notes != nullptr) {
                    notes->push_back(path.string() + ": its newest checkpoint, " + file.string());
                }
                return loaded;
            } catch (const InputError& e) {
                if (notes != nullptr) notes->push_back(std::string(e.what()) + ": skipped");
            }
        }
        throw InputError(path.string() +
                         ": a directory, but neither a run's checkpoints (model_N.bin) nor a "
                         "Hugging Face model (config.json and model.safetensors)");
    }
    if (file_head(path.string(), 4) == "GGUF") return load_gguf_model(path);
    return load_checkpoint(path);
}

OutputFormat output_format(const std::filesystem::path& path, std::string_view to) {
    if (to == "hf") return OutputFormat::HuggingFace;
    if (to == "gguf") return OutputFormat::Gguf;
    if (to == "llmc") return OutputFormat::Llmc;
    if (to == "gguf-lora") return OutputFormat::GgufLora;
    if (path.extension() == ".gguf") return OutputFormat::Gguf;
    if (path.extension() == ".bin") return OutputFormat::Llmc;
    return OutputFormat::HuggingFace;
}

namespace {

namespace fs = std::filesystem;

// The directory a Hugging Face output at `path` writes: DIR/model.safetensors is DIR.
fs::path hugging_face_directory(const fs::path& path) {
    if (path.extension() != ".safetensors") return path;
    if (path.filename() != "model.safetensors") {
        throw UsageError(path.string() +
                         ": a Hugging Face model is a directory whose weights are "
                         "model.safetensors beside config.json: name the directory, or "
                         "DIR/model.safetensors to write the files into DIR");
    }
    return path.has_parent_path() ? path.parent_path() : fs::path(".");
}

// Why a file output may not replace what is at `path`, or nullopt: only a previous output of the
// same format is replaced, so a checkpoint (or anything else) given as OUT is never overwritten.
std::optional<std::string> file_output_conflict(const fs::path& path, OutputFormat format) {
    std::error_code ec;
    const fs::file_status status = fs::status(path, ec);
    if (!fs::exists(status)) return std::nullopt;
    const std::string name = path.string();
    const std::string advice =
        ": name another file (an existing one is replaced only when it is "
        "a previous conversion's)";
    if (!fs::is_regular_file(status)) return name + " exists and is not a file" + advice;
    if (format == OutputFormat::Gguf || format == OutputFormat::GgufLora) {
        std::array<char, 4> magic{};
        std::ifstream in(path, std::ios::binary);
        if (in.read(magic.data(), magic.size()) && std::string_view(magic.data(), 4) == "GGUF") {
            return std::nullopt;
        }
        return name + " exists and is not a GGUF file" + advice;
    }
    switch (model_file_kind(path)) {
        case ModelFileKind::PlainLlmc:
            return std::nullopt;
        case ModelFileKind::Checkpoint:
            return name +
                   " is a checkpoint (it carries its tokenizer and configuration), which "
                   "convert_model never overwrites" +
                   advice;
        case ModelFileKind::Other:
            break;
    }
    return name + " exists and is not an llm.c model file" + advice;
}

}  // namespace

ModelOutput checked_model_output(ModelOutput output, const std::filesystem::path& input) {
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
    const bool gguf =
        output.format == OutputFormat::Gguf || output.format == OutputFormat::GgufLora;
    if (!output.name.empty() && !gguf) {
        throw UsageError("--name sets general.name of GGUF output only; " + format +
                         " output has no name to set");
    }
    const fs::path given = output.path;
    if (output.format == OutputFormat::HuggingFace) output.path = hugging_face_directory(given);
    std::error_code ec;
    for (const fs::path& path : {given, output.path}) {
        if (fs::exists(path, ec) && fs::equivalent(input, path, ec)) {
            throw UsageError(given.string() + ": the output is the input");
        }
    }
    if (output.format != OutputFormat::HuggingFace) {
        if (const auto conflict = file_output_conflict(output.path, output.format)) {
            throw UsageError(*conflict);
        }
    } else if (const auto conflict = hugging_face_output_conflict(output.path)) {
        const std::string advice = ": " + std::string(kHuggingFaceOutputAdvice);
        if (given == output.path) throw UsageError(given.string() + " " + *conflict + advice);
        throw UsageError(given.string() + ": the Hugging Face files go beside it, into " +
                         output.path.string() + ", which " + *conflict + advice);
    }
    return output;
}

OutputTokenizer output_tokenizer(const LoadedModel& loaded, const std::filesystem::path& input,
                                 const TokenizerDir& dir, const ModelOutput& output) {
    OutputTokenizer out;
    if (loaded.extras && !loaded.extras->tokenizer.empty()) {
        if (dir.given) {
            throw UsageError("--tokenizer-dir " + dir.path.string() + ": " + input.string() +
                             " carries its own tokenizer; leave out --tokenizer-dir");
        }
        out.tokenizer = deserialize_tokenizer(loaded.extras->tokenizer);
        out.origin = "the input's own";
        return out;
    }
    const int vocab_size = loaded.model.config.vocab_size;
    if (dir.given) {
        out.tokenizer = load_gpt2_tokenizer(dir.path);
        out.origin = "GPT-2's from " + dir.path.string();
        if (out.tokenizer->vocab_size() != vocab_size) {
            throw InputError("--tokenizer-dir " + dir.path.string() + ": " +
                             std::to_string(out.tokenizer->vocab_size()) +
                             " tokens, but the model has a vocabulary of " +
                             std::to_string(vocab_size));
        }
        return out;
    }
    // The default directory, as the other programs use it: GPT-2's tokenizer for a model of
    // GPT-2's vocabulary, here only where the output holds a tokenizer.
    const bool holds_tokenizer =
        output.format == OutputFormat::Gguf ||
        (output.format == OutputFormat::HuggingFace && !output.weights_only);
    if (!holds_tokenizer || vocab_size != kGpt2VocabSize) return out;
    try {
        out.tokenizer = load_gpt2_tokenizer(dir.path);
    } catch (const InputError& e) {
        throw InputError(input.string() +
                         " has no tokenizer and GPT-2's vocabulary, and GPT-2's tokenizer " +
                         "could not be loaded from " + dir.path.string() +
                         " (the default --tokenizer-dir): " + e.what() +
                         (output.format == OutputFormat::HuggingFace
                              ? "; --weights-only writes the directory without tokenizer files"
                              : ""));
    }
    out.origin = "GPT-2's from " + dir.path.string();
    return out;
}

void check_lora_source(const std::filesystem::path& dir, OutputFormat format) {
    if (dir.empty()) {
        if (format == OutputFormat::GgufLora) {
            throw UsageError(
                "--to gguf-lora writes an adapter: name it with --lora-from DIR (a PEFT adapter "
                "directory)");
        }
        return;
    }
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
        throw InputError("--lora-from " + dir.string() +
                         ": no such directory (a PEFT adapter: adapter_config.json and "
                         "adapter_model.safetensors)");
    }
    for (const char* file : {"adapter_config.json", "adapter_model.safetensors"}) {
        if (!fs::is_regular_file(dir / file, ec)) {
            throw InputError("--lora-from " + dir.string() + ": no " + file +
                             " (a PEFT adapter directory holds adapter_config.json and "
                             "adapter_model.safetensors)");
        }
    }
}

std::string describe_adapter(const LoraConfig& config) {
    std::string targets;
    for (const std::string& module : lora_target_modules(config.targets))
        targets += (targets.empty() ? "" : ",") + module;
    return "LoRA r=" + std::to_string(config.rank) + ", alpha " + format_alpha(config.alpha) +
           " (scale " + format_alpha(config.scale()) + "), targets " + targets;
}

std::string write_lora_adapter_file(const ModelOutput& output, const LoraAdapter& adapter) {
    if (output.format != OutputFormat::GgufLora) {
        throw std::invalid_argument("write_lora_adapter_file: not an adapter output");
    }
    const std::string name = output.name.empty() ? output.path.stem().string() : output.name;
    write_gguf_lora(output.path, adapter, gguf_weights(output.dtype), name);
    return std::string("GGUF v3 LoRA adapter for llama.cpp's ") +
           (adapter.layout.model().is_gpt2() ? "gpt2" : "llama") +
           ", r=" + std::to_string(adapter.config.rank) + ", alpha " +
           format_alpha(adapter.config.alpha) + ", " + output.dtype + " tensors";
}

std::string write_model_file(const ModelOutput& output, const Model& model,
                             const Tokenizer* tokenizer, const std::filesystem::path& input,
                             std::vector<std::string>& notes) {
    if (output.format == OutputFormat::GgufLora) {
        throw std::invalid_argument("write_model_file: a gguf-lora output is an adapter's");
    }
    if (output.format == OutputFormat::Llmc) return write_as_llmc(output, model, tokenizer, notes);
    if (output.format == OutputFormat::Gguf) return write_as_gguf(output, model, tokenizer, input);
    return write_as_hugging_face(output, model, tokenizer);
}

}  // namespace gpt2
