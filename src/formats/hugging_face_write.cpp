// Hugging Face exports: formats/hugging_face.hpp's write_hugging_face_model and the output
// directory's checks (GPT2LMHeadModel, or LlamaForCausalLM for the Llama family).
#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "formats/hugging_face.hpp"
#include "formats/hugging_face_names.hpp"
#include "formats/safetensors.hpp"

namespace gpt2 {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::string_view kPrefix = kHuggingFacePrefix;
constexpr std::string_view kModelFile = kHuggingFaceModelFile;

// The files an export writes: a directory holding only these is a previous export.
constexpr std::string_view kConfigFile = "config.json";
constexpr std::string_view kGenerationConfigFile = "generation_config.json";
constexpr std::array<std::string_view, 4> kTokenizerFiles = {
    "vocab.json", "merges.txt", "tokenizer_config.json", "tokenizer.json"};

bool is_export_file(std::string_view name) {
    return name == kModelFile || name == kConfigFile || name == kGenerationConfigFile ||
           std::find(kTokenizerFiles.begin(), kTokenizerFiles.end(), name) != kTokenizerFiles.end();
}

// config.json of GPT2LMHeadModel for `c`, with no dropout (none was trained with); `eot` null for
// a tokenizer without end-of-text.
nlohmann::ordered_json hugging_face_config(const ModelConfig& c, const nlohmann::ordered_json& eot,
                                           ElementType type) {
    return {
        {"activation_function", "gelu_new"},
        {"architectures", {"GPT2LMHeadModel"}},
        {"attn_pdrop", 0.0},
        {"bos_token_id", eot},
        {"embd_pdrop", 0.0},
        {"eos_token_id", eot},
        {"initializer_range", 0.02},
        {"layer_norm_epsilon", 1e-05},
        {"model_type", "gpt2"},
        {"n_ctx", c.max_seq_len},
        {"n_embd", c.channels},
        {"n_head", c.num_heads},
        {"n_inner", nullptr},
        {"n_layer", c.num_layers},
        {"n_positions", c.max_seq_len},
        {"reorder_and_upcast_attn", false},
        {"resid_pdrop", 0.0},
        {"scale_attn_by_inverse_layer_idx", false},
        {"scale_attn_weights", true},
        {"tie_word_embeddings", true},
        {"torch_dtype", torch_dtype_name(type)},
        {"use_cache", true},
        {"vocab_size", c.vocab_size},
    };
}

void write_text(const fs::path& path, const std::string& text) {
    write_file_atomically(
        path, std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
}

void write_json(const fs::path& path, const nlohmann::ordered_json& value) {
    write_text(path, value.dump(2) + "\n");
}

// The weights as Hugging Face names and lays them out (Conv1D weights transposed), in `type`.
std::vector<SafetensorsOutput> hugging_face_tensors(const Model& model, ElementType type) {
    const ModelConfig& c = model.config;
    const std::span<const float> params = model.weights();
    const ParameterLayout& layout = model.layout;
    const std::int64_t C = c.channels, V = c.vocab_size;
    std::vector<SafetensorsOutput> tensors;
    // Each tensor's bytes are made as the writer reaches it: one tensor in memory at a time.
    const auto add = [&](const std::string& name, std::vector<std::int64_t> shape,
                         std::span<const float> values, bool conv1d) {
        SafetensorsOutput out{
            (c.is_gpt2() ? std::string(kPrefix) : std::string()) + name, type, shape, {}, {}};
        out.make_bytes = [values, conv1d, shape, type] {
            std::vector<std::uint8_t> bytes;
            if (!conv1d) {
                append_elements(bytes, values, type);
                return bytes;
            }
            // ours (out, in) -> Conv1D (in, out)
            const auto rows = static_cast<std::size_t>(shape[1]),
                       cols = static_cast<std::size_t>(shape[0]);
            std::vector<float> transposed(values.size());
            for (std::size_t r = 0; r < rows; ++r)
                for (std::size_t k = 0; k < cols; ++k)
                    transposed[k * rows + r] = values[r * cols + k];
            append_elements(bytes, transposed, type);
            return bytes;
        };
        tensors.push_back(std::move(out));
    };
    if (!c.is_gpt2()) {  // LlamaForCausalLM's names, Q/K/V and gate/up as rows of ours
        for (const HuggingFacePiece& p : llama_pieces(c)) {
            const std::span<const float> whole =
                p.layer < 0 ? layout.tensor(params, p.ours) : layout.layer(params, p.ours, p.layer);
            add(p.name,
                p.vector ? std::vector<std::int64_t>{p.cols}
                         : std::vector<std::int64_t>{p.rows, p.cols},
                whole.subspan(static_cast<std::size_t>(p.first_row * p.cols),
                              static_cast<std::size_t>(p.rows * p.cols)),
                false);
        }
        return tensors;
    }
    add("wte.weight", {V, C}, layout.tensor(params, ParamTensor::wte).first(V * C), false);
    add("wpe.weight", {c.max_seq_len, C}, layout.tensor(params, ParamTensor::wpe), false);
    for (int l = 0; l < c.num_layers; ++l) {
        for (const Gpt2NamedTensor& t : kGpt2LayerTensors) {
            std::vector<std::int64_t> shape = gpt2_layer_shape(t.ours, c);
            if (t.conv1d) std::swap(shape[0], shape[1]);
            add("h." + std::to_string(l) + "." + std::string(t.name), shape,
                layout.layer(params, t.ours, l), t.conv1d);
        }
    }
    add("ln_f.weight", {C}, layout.tensor(params, ParamTensor::lnfw), false);
    add("ln_f.bias", {C}, layout.tensor(params, ParamTensor::lnfb), false);
    return tensors;
}

// vocab.json and merges.txt; vocab.json in id order, as the Hub's files are (written by hand: an
// ordered_json object looks each key up linearly, quadratic in 50k tokens).
void write_gpt2_tokenizer_files(const fs::path& dir, const SpelledBpe& spelled) {
    std::string vocab_text = "{";
    for (std::size_t id = 0; id < spelled.tokens.size(); ++id)
        vocab_text +=
            (id ? ", " : "") + json(spelled.tokens[id]).dump() + ": " + std::to_string(id);
    vocab_text += "}";
    write_text(dir / "vocab.json", vocab_text);
    std::string merges = "#version: 0.2\n";
    for (const std::string& merge : spelled.merges)
        merges += merge + "\n";
    write_text(dir / "merges.txt", merges);
}

// tokenizer.json (transformers' fast tokenizer, which reads it before vocab.json and merges.txt)
// for a BPE that splits every digit first, as SmolLM2's says it: what the slow GPT-2 tokenizer of
// vocab.json and merges.txt alone would not do.
void write_tokenizer_json(const fs::path& dir, const SpelledBpe& spelled) {
    const json byte_level = {{"type", "ByteLevel"},
                             {"add_prefix_space", false},
                             {"trim_offsets", true},
                             {"use_regex", true}};
    json vocab = json::object();
    for (std::size_t id = 0; id < spelled.tokens.size(); ++id)
        vocab[spelled.tokens[id]] = id;
    json added = json::array();
    if (spelled.eot_id) {
        added.push_back({{"id", *spelled.eot_id},
                         {"content", spelled.tokens[static_cast<std::size_t>(*spelled.eot_id)]},
                         {"single_word", false},
                         {"lstrip", false},
                         {"rstrip", false},
                         {"normalized", false},
                         {"special", true}});
    }
    const json tokenizer = {
        {"version", "1.0"},
        {"truncation", nullptr},
        {"padding", nullptr},
        {"added_tokens", added},
        {"normalizer", nullptr},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           json::array({{{"type", "Digits"}, {"individual_digits", true}}, byte_level})}}},
        {"post_processor", nullptr},
        {"decoder", byte_level},
        {"model",
         {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", false},
          {"byte_fallback", false},
          {"vocab", vocab},
          {"merges", spelled.merges}}}};
    write_text(dir / "tokenizer.json", tokenizer.dump() + "\n");
}

}  // namespace

std::optional<std::string> hugging_face_output_conflict(const fs::path& dir) {
    std::error_code ec;
    const fs::file_status status = fs::status(dir, ec);
    if (!fs::exists(status)) return std::nullopt;
    if (!fs::is_directory(status))
        return "exists and is not a directory (a Hugging Face model is one)";
    std::vector<std::string> foreign;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (!is_export_file(name) || !it->is_regular_file()) foreign.push_back(name);
    }
    if (ec) return "cannot be listed: " + ec.message();
    if (foreign.empty()) return std::nullopt;
    std::sort(foreign.begin(), foreign.end());
    constexpr std::size_t kNamed = 3;
    std::string names;
    for (std::size_t i = 0; i < std::min(foreign.size(), kNamed); ++i)
        names += (i ? ", " : "") + foreign[i];
    if (foreign.size() > kNamed)
        names += " and " + std::to_string(foreign.size() - kNamed) + " more";
    return "holds files a Hugging Face export does not write (" + names + ")";
}

void write_hugging_face_model(const fs::path& dir, const Model& model, const Tokenizer* tokenizer,
                              ElementType type) {
    const ModelConfig& c = model.config;
    if (!c.is_gpt2()) {
        if (const auto why = not_a_llama(c)) throw InputError(dir.string() + ": " + *why);
    }
    // Everything that can be refused is decided before the first file is written.
    if (const auto conflict = hugging_face_output_conflict(dir)) {
        throw InputError(dir.string() + " " + *conflict + ": " +
                         std::string(kHuggingFaceOutputAdvice));
    }
    std::optional<SpelledBpe> spelled;
    if (tokenizer != nullptr) {
        try {
            spelled = spell_byte_level_bpe(*tokenizer);
        } catch (const InputError& e) {
            throw InputError(dir.string() +
                             ": the tokenizer cannot be written as vocab.json and "
                             "merges.txt: " +
                             e.what());
        }
    }
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (!fs::is_directory(dir, ec)) {
        throw InputError(dir.string() + ": cannot create the output directory");
    }
    // Without a tokenizer the last id is taken for end-of-text, as in GPT-2's vocabulary; a
    // tokenizer without one (char) gets null: transformers then generates to max_new_tokens.
    const nlohmann::ordered_json eot = !spelled          ? nlohmann::ordered_json(c.vocab_size - 1)
                                       : spelled->eot_id ? nlohmann::ordered_json(*spelled->eot_id)
                                                         : nlohmann::ordered_json(nullptr);
    write_safetensors(dir / kModelFile, hugging_face_tensors(model, type), {{"format", "pt"}});
    write_json(dir / kConfigFile,
               c.is_gpt2() ? hugging_face_config(c, eot, type) : llama_config_json(c, eot, type));
    write_json(dir / kGenerationConfigFile, {{"bos_token_id", eot}, {"eos_token_id", eot}});
    if (!spelled) {
        // A previous export's tokenizer files would be read as this model's tokenizer.
        for (const std::string_view name : kTokenizerFiles)
            fs::remove(dir / name, ec);
        return;
    }
    write_gpt2_tokenizer_files(dir, *spelled);
    if (spelled->pre == PreTokenizer::DigitsThenGpt2) {
        write_tokenizer_json(dir, *spelled);
    } else {
        fs::remove(dir / "tokenizer.json", ec);  // a previous export's would split digits
    }
    const nlohmann::ordered_json eot_text =
        spelled->eot_id
            ? nlohmann::ordered_json(spelled->tokens[static_cast<std::size_t>(*spelled->eot_id)])
            : nlohmann::ordered_json(nullptr);
    write_json(dir / "tokenizer_config.json", {{"add_prefix_space", false},
                                               {"bos_token", eot_text},
                                               {"eos_token", eot_text},
                                               {"unk_token", eot_text},
                                               {"model_max_length", c.max_seq_len},
                                               {"tokenizer_class", "GPT2Tokenizer"}});
}

}  // namespace gpt2
