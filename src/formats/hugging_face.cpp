#include "formats/hugging_face.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "formats/safetensors.hpp"

namespace gpt2 {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::string_view kPrefix = "transformer.";
constexpr std::string_view kModelFile = "model.safetensors";
constexpr std::string_view kIndexFile = "model.safetensors.index.json";

// One of our tensors as Hugging Face names it (after "transformer." and, per layer, "h.N.").
// Conv1D weights are stored (in, out), the transpose of ours (out, in).
struct NamedTensor {
    ParamTensor ours;
    std::string_view name;
    bool conv1d;
};
constexpr NamedTensor kLayerTensors[] = {
    {ParamTensor::ln1w, "ln_1.weight", false},
    {ParamTensor::ln1b, "ln_1.bias", false},
    {ParamTensor::qkvw, "attn.c_attn.weight", true},
    {ParamTensor::qkvb, "attn.c_attn.bias", false},
    {ParamTensor::attprojw, "attn.c_proj.weight", true},
    {ParamTensor::attprojb, "attn.c_proj.bias", false},
    {ParamTensor::ln2w, "ln_2.weight", false},
    {ParamTensor::ln2b, "ln_2.bias", false},
    {ParamTensor::fcw, "mlp.c_fc.weight", true},
    {ParamTensor::fcb, "mlp.c_fc.bias", false},
    {ParamTensor::fcprojw, "mlp.c_proj.weight", true},
    {ParamTensor::fcprojb, "mlp.c_proj.bias", false},
};

// The (rows, cols) of one layer's slice of a per-layer tensor in our layout, or (n) for vectors.
std::vector<std::int64_t> our_layer_shape(ParamTensor t, const ModelConfig& c) {
    const std::int64_t C = c.channels;
    switch (t) {
        case ParamTensor::qkvw:
            return {3 * C, C};
        case ParamTensor::qkvb:
            return {3 * C};
        case ParamTensor::attprojw:
            return {C, C};
        case ParamTensor::fcw:
            return {4 * C, C};
        case ParamTensor::fcb:
            return {4 * C};
        case ParamTensor::fcprojw:
            return {C, 4 * C};
        default:
            return {C};
    }
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
    std::string text = "[";
    for (std::size_t i = 0; i < shape.size(); ++i)
        text += (i ? ", " : "") + std::to_string(shape[i]);
    return text + "]";
}

json read_json(const fs::path& path) {
    try {
        return json::parse(read_text_file(path));
    } catch (const json::exception& e) {
        throw InputError(path.string() + ": invalid JSON: " + e.what());
    }
}

// GPT-2's shape from config.json, with every setting our model cannot honour refused by name.
ModelConfig read_config(const fs::path& path, HuggingFaceNotes* notes) {
    const json config = read_json(path);
    const std::string file = path.string();
    if (!config.is_object()) throw InputError(file + ": expected a JSON object");
    const auto fail = [&](const std::string& key, const std::string& what) {
        return InputError(file + ": " + key + " " + what);
    };
    const auto positive = [&](const std::string& key) -> int {
        if (!config.contains(key)) throw fail(key, "is missing (a GPT-2 config.json has it)");
        const json& v = config[key];
        if (!v.is_number_integer() || v.get<std::int64_t>() <= 0 ||
            v.get<std::int64_t>() > (1 << 30)) {
            throw fail(key, "must be a positive integer, not " + v.dump());
        }
        return v.get<int>();
    };
    const auto setting = [&](const std::string& key, const json& fallback) {
        return config.contains(key) ? config[key] : fallback;
    };
    if (const json type = setting("model_type", "gpt2"); type != "gpt2") {
        throw fail("model_type", type.dump() + " is not gpt2 (only GPT-2 models are read)");
    }
    const json activation = setting("activation_function", "gelu_new");
    if (activation != "gelu_new" && activation != "gelu_pytorch_tanh") {
        throw fail("activation_function",
                   activation.dump() + ": GPT-2 here uses the tanh GELU (gelu_new)");
    }
    const json epsilon = setting("layer_norm_epsilon", 1e-5);
    if (!epsilon.is_number() || epsilon.get<double>() != 1e-5) {
        throw fail("layer_norm_epsilon", epsilon.dump() + ": GPT-2 here uses 1e-05");
    }
    const struct {
        const char* key;
        bool expected;
    } switches[] = {{"scale_attn_weights", true},
                    {"scale_attn_by_inverse_layer_idx", false},
                    {"add_cross_attention", false}};
    for (const auto& s : switches) {
        const json value = setting(s.key, s.expected);
        if (!value.is_boolean() || value.get<bool>() != s.expected) {
            throw fail(s.key, value.dump() + ": GPT-2 here needs " +
                                  (s.expected ? std::string("true") : std::string("false")));
        }
    }
    ModelConfig c;
    c.channels = positive("n_embd");
    c.num_layers = positive("n_layer");
    c.num_heads = positive("n_head");
    c.vocab_size = positive("vocab_size");
    c.padded_vocab_size = pad_vocab(c.vocab_size);
    c.max_seq_len = config.contains("n_positions") ? positive("n_positions") : positive("n_ctx");
    if (const json inner = setting("n_inner", nullptr);
        !inner.is_null() && inner != json(4 * c.channels)) {
        throw fail("n_inner", inner.dump() + ": GPT-2 here has an MLP of 4 x n_embd = " +
                                  std::to_string(4 * c.channels));
    }
    validate_config(c, file);
    if (notes != nullptr) {
        std::string dropout;
        for (const char* key : {"embd_pdrop", "attn_pdrop", "resid_pdrop"}) {
            if (config.contains(key) && config[key].is_number() && config[key].get<double>() != 0) {
                dropout +=
                    (dropout.empty() ? "" : ", ") + std::string(key) + " " + config[key].dump();
            }
        }
        if (!dropout.empty()) {
            notes->lines.push_back(file + ": " + dropout +
                                   " (not applied from the file: train_gpt2 --dropout P sets it)");
        }
    }
    return c;
}

// The safetensors files of a model and where config.json and the tokenizer files are.
struct Sources {
    fs::path dir;
    std::vector<fs::path> files;
    std::optional<fs::path> index;
};

Sources find_sources(const fs::path& path) {
    Sources s;
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
        s.dir = path;
        if (fs::exists(path / kModelFile, ec)) {
            s.files.push_back(path / kModelFile);
        } else if (fs::exists(path / kIndexFile, ec)) {
            s.index = path / kIndexFile;
        } else {
            throw InputError(path.string() + ": a directory without " + std::string(kModelFile) +
                             " or " + std::string(kIndexFile) +
                             " (a Hugging Face model directory has one)");
        }
    } else {
        s.dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
        if (path.string().ends_with(".json")) {
            s.index = path;
        } else {
            s.files.push_back(path);
        }
    }
    if (s.index) {
        const json index = read_json(*s.index);
        if (!index.is_object() || !index.contains("weight_map") ||
            !index["weight_map"].is_object()) {
            throw InputError(s.index->string() + ": weight_map is missing or not an object");
        }
        std::set<std::string> names;
        for (const auto& [tensor, file] : index["weight_map"].items()) {
            if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos) {
                throw InputError(s.index->string() + ": weight_map." + tensor +
                                 " must name a file in the same directory");
            }
            if (names.insert(file.get<std::string>()).second) {
                s.files.push_back(s.dir / file.get<std::string>());
            }
        }
    }
    return s;
}

}  // namespace

bool is_hugging_face_model(const fs::path& path) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
        return fs::exists(path / "config.json", ec) || fs::exists(path / kModelFile, ec) ||
               fs::exists(path / kIndexFile, ec);
    }
    const std::string name = path.filename().string();
    return name.ends_with(".safetensors") || name.ends_with(".safetensors.index.json");
}

namespace {

// Every tensor of a Hugging Face directory by its name without "transformer.", with the file it
// came from; each file's tensors checked against the index's weight_map.
using TensorsByName = std::map<std::string, std::pair<const SafetensorsTensor*, std::string>>;
TensorsByName index_tensors(const Sources& sources, std::vector<SafetensorsFile>& files) {
    files.reserve(sources.files.size());
    TensorsByName by_name;
    std::map<std::string, std::string> wanted_file;
    if (sources.index) {
        const json index = read_json(*sources.index);  // checked by find_sources
        for (const auto& [tensor, file] : index["weight_map"].items())
            wanted_file[tensor] = file.get<std::string>();
    }
    for (const fs::path& file : sources.files) {
        files.push_back(SafetensorsFile::read(file));
        for (const SafetensorsTensor& t : files.back().tensors()) {
            if (sources.index) {
                const auto it = wanted_file.find(t.name);
                if (it == wanted_file.end() || it->second != file.filename().string()) {
                    throw InputError(file.string() + ": tensor " + t.name + " is not in " +
                                     sources.index->filename().string() +
                                     "'s weight_map for this file");
                }
                wanted_file.erase(it);
            }
            std::string name = t.name;
            if (name.starts_with(kPrefix)) name.erase(0, kPrefix.size());
            if (!by_name.emplace(name, std::make_pair(&t, file.string())).second) {
                throw InputError(file.string() + ": tensor " + t.name + " appears twice (" + name +
                                 " with and without \"transformer.\", or in two files)");
            }
        }
    }
    if (!wanted_file.empty()) {
        throw InputError(sources.index->string() + ": weight_map names " +
                         wanted_file.begin()->first + " in " + wanted_file.begin()->second +
                         ", which does not hold it");
    }

    return by_name;
}

// Reads the tensors into our layout, remembering which were used.
class TensorReader {
  public:
    TensorReader(const TensorsByName& by_name, const Sources& sources, const fs::path& config_path,
                 const ModelConfig& config)
        : by_name_(by_name), sources_(sources), config_path_(config_path), config_(config) {}

    // Tensor `name` of `shape` (Hugging Face's) into dst; Conv1D weights are transposed.
    void take(const std::string& name, const std::vector<std::int64_t>& shape, std::span<float> dst,
              bool conv1d) {
        const auto it = by_name_.find(name);
        if (it == by_name_.end()) {
            throw InputError(sources_.dir.string() + ": tensor " + name + " is missing (" +
                             (sources_.index ? sources_.index->filename().string()
                                             : sources_.files.front().filename().string()) +
                             ")");
        }
        const auto& [tensor, file] = it->second;
        const std::string where = file + ": tensor " + tensor->name;
        if (tensor->shape != shape) {
            throw InputError(where + " has shape " + shape_text(tensor->shape) + ", but " +
                             config_path_.filename().string() + " (" + describe(config_) +
                             ") gives " + shape_text(shape));
        }
        if (!tensor->type) {
            throw InputError(where + " has dtype " + tensor->dtype +
                             "; weights are read as F32, F16 or BF16");
        }
        used_.insert(name);
        if (!conv1d) {
            read_elements(dst, tensor->bytes, *tensor->type);
            tensor->release_bytes();
            return;
        }
        std::vector<float> stored(dst.size());
        read_elements(stored, tensor->bytes, *tensor->type);
        tensor->release_bytes();
        const auto in = static_cast<std::size_t>(shape[0]),
                   out = static_cast<std::size_t>(shape[1]);
        for (std::size_t i = 0; i < in; ++i)
            for (std::size_t o = 0; o < out; ++o)
                dst[o * in + i] = stored[i * out + o];
    }
    void ignore(const std::string& name) { used_.insert(name); }
    [[nodiscard]] bool used(const std::string& name) const { return used_.contains(name); }

  private:
    const TensorsByName& by_name_;
    const Sources& sources_;
    const fs::path& config_path_;
    const ModelConfig& config_;
    std::set<std::string> used_;
};

// The weights of GPT2LMHeadModel into `model`; an lm_head may only repeat wte, and nothing else
// may be in the files.
void read_weights(Model& model, const TensorsByName& by_name, TensorReader& reader) {
    const ModelConfig& c = model.config;
    std::span<float> params = model.params.span();
    const ParameterLayout& layout = model.layout;
    const std::int64_t C = c.channels, V = c.vocab_size;
    reader.take("wte.weight", {V, C}, layout.tensor(params, ParamTensor::wte).first(V * C), false);
    reader.take("wpe.weight", {c.max_seq_len, C}, layout.tensor(params, ParamTensor::wpe), false);
    reader.take("ln_f.weight", {C}, layout.tensor(params, ParamTensor::lnfw), false);
    reader.take("ln_f.bias", {C}, layout.tensor(params, ParamTensor::lnfb), false);
    for (int l = 0; l < c.num_layers; ++l) {
        const std::string prefix = "h." + std::to_string(l) + ".";
        for (const NamedTensor& t : kLayerTensors) {
            std::vector<std::int64_t> shape = our_layer_shape(t.ours, c);
            if (t.conv1d) std::swap(shape[0], shape[1]);
            reader.take(prefix + std::string(t.name), shape, layout.layer(params, t.ours, l),
                        t.conv1d);
        }
        // The causal-mask buffers older exports carry: not weights.
        reader.ignore(prefix + "attn.bias");
        reader.ignore(prefix + "attn.masked_bias");
    }
    // Our model ties the output layer to wte: an lm_head may only repeat it.
    if (const auto it = by_name.find("lm_head.weight"); it != by_name.end()) {
        std::vector<float> head(static_cast<std::size_t>(V * C));
        reader.take("lm_head.weight", {V, C}, head, false);
        const std::span<const float> wte = layout.tensor(params, ParamTensor::wte).first(V * C);
        if (!std::equal(head.begin(), head.end(), wte.begin())) {
            throw InputError(it->second.second +
                             ": lm_head.weight differs from wte.weight; GPT-2 here ties its output "
                             "layer to the token embedding, so an untied head cannot be read");
        }
    }
    for (const auto& [name, entry] : by_name) {
        if (!reader.used(name)) {
            throw InputError(entry.second + ": unexpected tensor " + entry.first->name +
                             " (not part of GPT2LMHeadModel with " + describe(c) + ")");
        }
    }
}

}  // namespace

LoadedModel load_hugging_face_model(const fs::path& path, HuggingFaceNotes* notes) {
    const Sources sources = find_sources(path);
    const fs::path config_path = sources.dir / "config.json";
    std::error_code ec;
    if (!fs::exists(config_path, ec)) {
        throw InputError(config_path.string() +
                         ": missing; a Hugging Face GPT-2 model needs its "
                         "config.json (the number of heads is only there)");
    }
    const ModelConfig c = read_config(config_path, notes);

    std::vector<SafetensorsFile> files;
    const TensorsByName by_name = index_tensors(sources, files);
    LoadedModel loaded{Model(c), std::nullopt};
    std::span<float> params = loaded.model.params.span();
    std::fill(params.begin(), params.end(), 0.0f);
    TensorReader reader(by_name, sources, config_path, c);
    read_weights(loaded.model, by_name, reader);
    if (fs::exists(sources.dir / "vocab.json", ec) && fs::exists(sources.dir / "merges.txt", ec)) {
        const std::unique_ptr<Tokenizer> tokenizer = load_spelled_tokenizer(sources.dir);
        if (tokenizer->vocab_size() > c.vocab_size) {
            throw InputError((sources.dir / "vocab.json").string() + ": " +
                             std::to_string(tokenizer->vocab_size()) + " tokens, but " +
                             config_path.string() + " has vocab_size " +
                             std::to_string(c.vocab_size));
        }
        loaded.extras = CheckpointExtras{tokenizer->serialize(), ""};
    }
    set_precision(loaded.model, Precision::Fp32);
    return loaded;
}

namespace {

// The files an export writes: a directory holding only these is a previous export.
constexpr std::string_view kConfigFile = "config.json";
constexpr std::string_view kGenerationConfigFile = "generation_config.json";
constexpr std::array<std::string_view, 3> kTokenizerFiles = {"vocab.json", "merges.txt",
                                                             "tokenizer_config.json"};

bool is_export_file(std::string_view name) {
    return name == kModelFile || name == kConfigFile || name == kGenerationConfigFile ||
           std::find(kTokenizerFiles.begin(), kTokenizerFiles.end(), name) != kTokenizerFiles.end();
}

// config.json of GPT2LMHeadModel for `c`, with no dropout (none was trained with); `eot` null for
// a tokenizer without end-of-text.
nlohmann::ordered_json hugging_face_config(const ModelConfig& c, const nlohmann::ordered_json& eot,
                                           ElementType type) {
    const char* torch_dtype = type == ElementType::F32   ? "float32"
                              : type == ElementType::F16 ? "float16"
                                                         : "bfloat16";
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
        {"torch_dtype", torch_dtype},
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
        SafetensorsOutput out{std::string(kPrefix) + name, type, shape, {}, {}};
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
    add("wte.weight", {V, C}, layout.tensor(params, ParamTensor::wte).first(V * C), false);
    add("wpe.weight", {c.max_seq_len, C}, layout.tensor(params, ParamTensor::wpe), false);
    for (int l = 0; l < c.num_layers; ++l) {
        for (const NamedTensor& t : kLayerTensors) {
            std::vector<std::int64_t> shape = our_layer_shape(t.ours, c);
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
    require_gpt2_block(c, dir.string());
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
    write_json(dir / kConfigFile, hugging_face_config(c, eot, type));
    write_json(dir / kGenerationConfigFile, {{"bos_token_id", eot}, {"eos_token_id", eot}});
    if (!spelled) {
        // A previous export's tokenizer files would be read as this model's tokenizer.
        for (const std::string_view name : kTokenizerFiles)
            fs::remove(dir / name, ec);
        return;
    }
    write_gpt2_tokenizer_files(dir, *spelled);
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
