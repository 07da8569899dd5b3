#include "formats/hugging_face.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "formats/hugging_face_names.hpp"
#include "formats/safetensors.hpp"

namespace gpt2 {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::string_view kPrefix = kHuggingFacePrefix;
constexpr std::string_view kModelFile = kHuggingFaceModelFile;
constexpr std::string_view kIndexFile = kHuggingFaceIndexFile;

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
    if (const json type = setting("model_type", "gpt2"); type == "llama") {
        return read_llama_config(config, file);
    } else if (type != "gpt2") {
        throw fail("model_type", type.dump() +
                                     " is not gpt2 or llama (GPT2LMHeadModel and "
                                     "LlamaForCausalLM are read)");
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

// Every tensor in the files must have been read (or knowingly skipped).
void refuse_unread(const TensorsByName& by_name, const TensorReader& reader, const ModelConfig& c) {
    for (const auto& [name, entry] : by_name) {
        if (!reader.used(name)) {
            throw InputError(entry.second + ": unexpected tensor " + entry.first->name +
                             " (not part of " +
                             (c.is_gpt2() ? "GPT2LMHeadModel" : "LlamaForCausalLM") + " with " +
                             describe(c) + ")");
        }
    }
}

// The weights of LlamaForCausalLM into `model`, piece by piece (Q, K and V into qkvw's rows,
// gate and up into fcw's); a tied model's lm_head may only repeat embed_tokens.
void read_llama_weights(Model& model, const TensorsByName& by_name, TensorReader& reader) {
    const ModelConfig& c = model.config;
    std::span<float> params = model.params.span();
    for (const HuggingFacePiece& p : llama_pieces(c)) {
        const std::span<float> whole = p.layer < 0 ? model.layout.tensor(params, p.ours)
                                                   : model.layout.layer(params, p.ours, p.layer);
        const std::span<float> rows = whole.subspan(static_cast<std::size_t>(p.first_row * p.cols),
                                                    static_cast<std::size_t>(p.rows * p.cols));
        reader.take(p.name,
                    p.vector ? std::vector<std::int64_t>{p.cols}
                             : std::vector<std::int64_t>{p.rows, p.cols},
                    rows, false);
    }
    for (int l = 0; l < c.num_layers; ++l)  // older exports' rotary buffer: not a weight
        reader.ignore("model.layers." + std::to_string(l) + ".self_attn.rotary_emb.inv_freq");
    if (const auto it = by_name.find("lm_head.weight"); c.arch.tied_head && it != by_name.end()) {
        const std::int64_t V = c.vocab_size, C = c.channels;
        std::vector<float> head(static_cast<std::size_t>(V * C));
        reader.take("lm_head.weight", {V, C}, head, false);
        const std::span<const float> wte =
            model.layout.tensor(params, ParamTensor::wte).first(static_cast<std::size_t>(V * C));
        if (!std::equal(head.begin(), head.end(), wte.begin())) {
            throw InputError(it->second.second +
                             ": lm_head.weight differs from model.embed_tokens.weight, but "
                             "config.json says tie_word_embeddings");
        }
    }
    refuse_unread(by_name, reader, c);
}

// The weights of GPT2LMHeadModel into `model`; an lm_head may only repeat wte, and nothing else
// may be in the files.
void read_weights(Model& model, const TensorsByName& by_name, TensorReader& reader) {
    const ModelConfig& c = model.config;
    if (!c.is_gpt2()) {
        read_llama_weights(model, by_name, reader);
        return;
    }
    std::span<float> params = model.params.span();
    const ParameterLayout& layout = model.layout;
    const std::int64_t C = c.channels, V = c.vocab_size;
    reader.take("wte.weight", {V, C}, layout.tensor(params, ParamTensor::wte).first(V * C), false);
    reader.take("wpe.weight", {c.max_seq_len, C}, layout.tensor(params, ParamTensor::wpe), false);
    reader.take("ln_f.weight", {C}, layout.tensor(params, ParamTensor::lnfw), false);
    reader.take("ln_f.bias", {C}, layout.tensor(params, ParamTensor::lnfb), false);
    for (int l = 0; l < c.num_layers; ++l) {
        const std::string prefix = "h." + std::to_string(l) + ".";
        for (const Gpt2NamedTensor& t : kGpt2LayerTensors) {
            std::vector<std::int64_t> shape = gpt2_layer_shape(t.ours, c);
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
    refuse_unread(by_name, reader, c);
}

// How tokenizer.json (where the directory has one beside vocab.json and merges.txt) says text is
// split before merging: GPT-2's byte-level pattern (ByteLevel alone), or every digit on its own
// first (SmolLM2's Sequence[Digits(individual_digits), ByteLevel]); any other pre-tokenizer or a
// normalizer is refused naming the key, as the programs would tokenize otherwise than
// transformers. `note`: what the log says.
struct TokenizerJson {
    PreTokenizer pre = PreTokenizer::Gpt2;
    std::optional<std::string> note;
};
TokenizerJson read_tokenizer_json(const fs::path& dir, bool read_vocab) {
    const fs::path path = dir / "tokenizer.json";
    std::error_code ec;
    if (!fs::exists(path, ec)) return {};
    if (!read_vocab) {
        return {PreTokenizer::Gpt2,
                path.string() +
                    ": not read (this build reads a byte-level BPE from vocab.json and "
                    "merges.txt); give the tokenizer with --tokenizer"};
    }
    json tokenizer;
    try {
        tokenizer = json::parse(read_text_file(path));
    } catch (const json::exception& e) {
        throw InputError(path.string() + ": not JSON (" + std::string(e.what()) + ")");
    }
    if (!tokenizer.is_object()) throw InputError(path.string() + ": not a JSON object");
    const auto refuse = [&](const std::string& key, const json& value) {
        throw InputError(path.string() + ": key '" + key + "' is " + value.dump() +
                         ", which the programs do not compute (they split text with GPT-2's "
                         "byte-level pattern, optionally after every digit on its own)");
    };
    if (tokenizer.contains("normalizer") && !tokenizer["normalizer"].is_null()) {
        refuse("normalizer", tokenizer["normalizer"]);
    }
    const json pre = tokenizer.value("pre_tokenizer", json());
    // GPT-2's ByteLevel: its regex, no space added in front of the text.
    const auto byte_level = [](const json& p) {
        return p.is_object() && p.value("type", "") == "ByteLevel" &&
               !p.value("add_prefix_space", false) && p.value("use_regex", true);
    };
    if (pre.is_null() || byte_level(pre)) return {};
    const json* steps = pre.is_object() && pre.value("type", "") == "Sequence" &&
                                pre.contains("pretokenizers") && pre["pretokenizers"].is_array()
                            ? &pre["pretokenizers"]
                            : nullptr;
    if (steps != nullptr && steps->size() == 2 && (*steps)[0].is_object() &&
        (*steps)[0].value("type", "") == "Digits" &&
        (*steps)[0].value("individual_digits", false) && byte_level((*steps)[1])) {
        return {PreTokenizer::DigitsThenGpt2,
                path.string() +
                    ": its pre-tokenizer splits every digit on its own before GPT-2's "
                    "byte-level pattern, as this build does for it"};
    }
    refuse("pre_tokenizer", pre);
    return {};
}
}  // namespace

LoadedModel load_hugging_face_model(const fs::path& path, HuggingFaceNotes* notes) {
    const Sources sources = find_sources(path);
    const fs::path config_path = sources.dir / "config.json";
    std::error_code ec;
    if (!fs::exists(config_path, ec)) {
        throw InputError(config_path.string() +
                         ": missing; a Hugging Face model needs its "
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
    const bool vocab =
        fs::exists(sources.dir / "vocab.json", ec) && fs::exists(sources.dir / "merges.txt", ec);
    TokenizerJson tokenizer_json = read_tokenizer_json(sources.dir, vocab);
    if (vocab) {
        const std::unique_ptr<Tokenizer> tokenizer =
            load_spelled_tokenizer(sources.dir, tokenizer_json.pre);
        if (tokenizer->vocab_size() > c.vocab_size) {
            throw InputError((sources.dir / "vocab.json").string() + ": " +
                             std::to_string(tokenizer->vocab_size()) + " tokens, but " +
                             config_path.string() + " has vocab_size " +
                             std::to_string(c.vocab_size));
        }
        loaded.extras = CheckpointExtras{tokenizer->serialize(), ""};
    }
    if (notes != nullptr && tokenizer_json.note)
        notes->lines.push_back(std::move(*tokenizer_json.note));
    set_precision(loaded.model, Precision::Fp32);
    return loaded;
}

}  // namespace gpt2
