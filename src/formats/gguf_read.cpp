// Reading GGUF: llama.cpp's gpt2 and llama architectures (F32, F16, BF16, Q8_0) and the embedded
// tokenizer, as every program that reads a model reads it (load_model_file).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "formats/element_type.hpp"
#include "formats/gguf.hpp"
#include "formats/gguf_format.hpp"

namespace gpt2 {

namespace {

using gguf_format::kAlignment;
using gguf_format::kGgufLayerTensors;
using gguf_format::layer_tensor_name;
using gguf_format::LayerTensor;
using gguf_format::ValueType;
using StoredType = gguf_format::TensorType;  // the ggml types widened to fp32

// A metadata value, as far as the reader needs it: a number, a string, or an array of either.
struct Metadata {
    ValueType type = ValueType::U8;
    double number = 0.0;
    std::string text;
    ValueType element = ValueType::U8;  // an array's
    std::vector<std::string> texts;     // an array of strings
    std::vector<double> numbers;        // an array of numbers
};

// Reads the file front to back; every read is checked against its end.
class GgufReader {
  public:
    GgufReader(std::span<const std::uint8_t> bytes, std::string name)
        : bytes_(bytes), name_(std::move(name)) {}

    template <typename T>
    T get(std::string_view what) {
        T value;
        std::memcpy(&value, take(sizeof(T), what).data(), sizeof(T));
        return value;
    }
    std::string string(std::string_view what) {
        const auto length = get<std::uint64_t>(what);
        if (length > remaining()) fail(std::string(what) + " longer than the file");
        const auto bytes = take(static_cast<std::size_t>(length), what);
        return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
    }
    std::span<const std::uint8_t> take(std::size_t count, std::string_view what) {
        if (count > remaining()) fail("truncated in " + std::string(what));
        const auto piece = bytes_.subspan(offset_, count);
        offset_ += count;
        return piece;
    }
    [[nodiscard]] std::size_t remaining() const { return bytes_.size() - offset_; }
    [[nodiscard]] std::size_t offset() const { return offset_; }
    [[noreturn]] void fail(const std::string& what) const {
        throw InputError(name_ + ": damaged GGUF file: " + what);
    }

  private:
    std::span<const std::uint8_t> bytes_;
    std::string name_;
    std::size_t offset_ = 0;
};

double read_number(GgufReader& in, ValueType type, std::string_view what) {
    switch (type) {
        case ValueType::U8:
            return in.get<std::uint8_t>(what);
        case ValueType::I8:
            return in.get<std::int8_t>(what);
        case ValueType::U16:
            return in.get<std::uint16_t>(what);
        case ValueType::I16:
            return in.get<std::int16_t>(what);
        case ValueType::U32:
            return in.get<std::uint32_t>(what);
        case ValueType::I32:
            return in.get<std::int32_t>(what);
        case ValueType::F32:
            return in.get<float>(what);
        case ValueType::Bool:
            return in.get<std::uint8_t>(what);
        case ValueType::U64:
            return static_cast<double>(in.get<std::uint64_t>(what));
        case ValueType::I64:
            return static_cast<double>(in.get<std::int64_t>(what));
        case ValueType::F64:
            return in.get<double>(what);
        default:
            in.fail(std::string(what) + ": value type " +
                    std::to_string(static_cast<std::uint32_t>(type)) + " is no number");
    }
}

Metadata read_value(GgufReader& in, const std::string& key) {
    Metadata value;
    value.type = static_cast<ValueType>(in.get<std::uint32_t>(key));
    if (value.type == ValueType::String) {
        value.text = in.string(key);
    } else if (value.type == ValueType::Array) {
        value.element = static_cast<ValueType>(in.get<std::uint32_t>(key));
        const auto count = in.get<std::uint64_t>(key);
        // Every element takes a byte at least: a count beyond the file is damage, not a size.
        if (count > in.remaining()) in.fail(key + ": an array longer than the file");
        if (value.element == ValueType::String) {
            // Each string takes its 8-byte length at least: no more room than that is reserved.
            value.texts.reserve(
                static_cast<std::size_t>(std::min<std::uint64_t>(count, in.remaining() / 8)));
            for (std::uint64_t i = 0; i < count; ++i)
                value.texts.push_back(in.string(key));
        } else if (value.element == ValueType::Array) {
            in.fail(key + ": an array of arrays");
        } else {
            const std::uint64_t size =
                value.element == ValueType::U8 || value.element == ValueType::I8 ||
                        value.element == ValueType::Bool
                    ? 1
                : value.element == ValueType::U16 || value.element == ValueType::I16 ? 2
                : value.element == ValueType::U64 || value.element == ValueType::I64 ||
                        value.element == ValueType::F64
                    ? 8
                    : 4;
            value.numbers.reserve(
                static_cast<std::size_t>(std::min<std::uint64_t>(count, in.remaining() / size)));
            for (std::uint64_t i = 0; i < count; ++i)
                value.numbers.push_back(read_number(in, value.element, key));
        }
    } else {
        value.number = read_number(in, value.type, key);
    }
    return value;
}

std::string_view ggml_type_name(std::uint32_t type) {
    static constexpr std::array<std::string_view, 41> kNames = {
        "F32",   "F16",        "Q4_0",       "Q4_1",       "Q4_2",     "Q4_3",     "Q5_0",
        "Q5_1",  "Q8_0",       "Q8_1",       "Q2_K",       "Q3_K",     "Q4_K",     "Q5_K",
        "Q6_K",  "Q8_K",       "IQ2_XXS",    "IQ2_XS",     "IQ3_XXS",  "IQ1_S",    "IQ4_NL",
        "IQ3_S", "IQ2_S",      "IQ4_XS",     "I8",         "I16",      "I32",      "I64",
        "F64",   "IQ1_M",      "BF16",       "Q4_0_4_4",   "Q4_0_4_8", "Q4_0_8_8", "TQ1_0",
        "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4",    "?"};
    return type < kNames.size() - 1 ? kNames[type] : kNames.back();
}

struct TensorInfo {
    std::vector<std::uint64_t> ne;
    std::uint32_t type = 0;
    std::uint64_t offset = 0;
};

// The count of values in a tensor of shape `ne`, or nothing when it overflows.
std::optional<std::uint64_t> element_count(const std::vector<std::uint64_t>& ne) {
    std::uint64_t n = 1;
    for (const std::uint64_t d : ne) {
        if (d != 0 && n > std::numeric_limits<std::uint64_t>::max() / d) return std::nullopt;
        n *= d;
    }
    return n;
}

// The bytes a tensor of `count` values takes in its stored type.
std::optional<std::uint64_t> stored_bytes(std::uint32_t type, std::uint64_t count) {
    switch (static_cast<StoredType>(type)) {
        case StoredType::F32:
            return count * 4;
        case StoredType::F16:
        case StoredType::Bf16:
            return count * 2;
        case StoredType::Q8_0:
            if (count % kQ8Block != 0) return std::nullopt;
            return count / kQ8Block * (2 + kQ8Block);
    }
    return std::nullopt;
}

// `out` (count values) from a tensor's stored bytes.
void widen(std::span<float> out, std::span<const std::uint8_t> bytes, std::uint32_t type) {
    switch (static_cast<StoredType>(type)) {
        case StoredType::F32:
            read_elements(out, bytes, ElementType::F32);
            return;
        case StoredType::F16:
            read_elements(out, bytes, ElementType::F16);
            return;
        case StoredType::Bf16:
            read_elements(out, bytes, ElementType::Bf16);
            return;
        case StoredType::Q8_0:
            for (std::size_t block = 0; block * kQ8Block < out.size(); ++block) {
                const std::uint8_t* at = bytes.data() + block * (2 + kQ8Block);
                std::uint16_t scale = 0;
                std::memcpy(&scale, at, 2);
                const float d = half_to_float(scale);
                for (int i = 0; i < kQ8Block; ++i) {
                    out[block * kQ8Block + static_cast<std::size_t>(i)] =
                        d * static_cast<float>(static_cast<std::int8_t>(at[2 + i]));
                }
            }
            return;
    }
    throw std::logic_error("widen: a tensor type the reader does not take");
}

// A tensor the shape calls for and where it goes in the flat parameters.
struct Wanted {
    std::string name;
    std::vector<std::uint64_t> ne;
    std::size_t offset = 0;
    std::size_t count = 0;
    int rotary_heads = 0;  // Q or K: rows of this many heads in llama.cpp's rotary order
};

// llama.cpp's gpt2 architecture's tensors.
std::vector<Wanted> gpt2_tensors(const ModelConfig& c, const ParameterLayout& layout) {
    const auto uC = static_cast<std::uint64_t>(c.channels);
    const auto uV = static_cast<std::uint64_t>(c.vocab_size);
    std::vector<Wanted> wanted = {
        {"token_embd.weight", {uC, uV}, layout.offset(ParamTensor::wte), uV * uC},
        {"position_embd.weight",
         {uC, static_cast<std::uint64_t>(c.max_seq_len)},
         layout.offset(ParamTensor::wpe),
         layout.size(ParamTensor::wpe)},
        {"output_norm.weight", {uC}, layout.offset(ParamTensor::lnfw), uC},
        {"output_norm.bias", {uC}, layout.offset(ParamTensor::lnfb), uC}};
    for (int l = 0; l < c.num_layers; ++l) {
        for (const LayerTensor& t : kGgufLayerTensors) {
            const std::size_t per_layer =
                layout.size(t.tensor) / static_cast<std::size_t>(c.num_layers);
            std::vector<std::uint64_t> ne = {uC * t.in, uC * t.out};
            if (t.in == 0) ne = {per_layer};
            wanted.push_back({layer_tensor_name(l, t.suffix), std::move(ne),
                              layout.offset(t.tensor) + per_layer * static_cast<std::size_t>(l),
                              per_layer});
        }
    }
    return wanted;
}

// llama.cpp's llama architecture's tensors (write_gguf's gguf_llama_tensors read back): Q, K and
// V into the rows of our qkvw, gate and up into those of fcw, the head where untied.
std::vector<Wanted> llama_tensors(const ModelConfig& c, const ParameterLayout& layout) {
    const auto C = static_cast<std::uint64_t>(c.channels);
    const auto V = static_cast<std::uint64_t>(c.vocab_size);
    const auto KV = static_cast<std::uint64_t>(c.kv_heads() * c.head_size());
    const auto H = static_cast<std::uint64_t>(c.mlp_hidden());
    const auto W = static_cast<std::uint64_t>(c.qkv_width());
    std::vector<Wanted> wanted = {
        {"token_embd.weight", {C, V}, layout.offset(ParamTensor::wte), V * C},
        {"output_norm.weight", {C}, layout.offset(ParamTensor::lnfw), C}};
    if (!c.arch.tied_head) {
        wanted.push_back({"output.weight", {C, V}, layout.offset(ParamTensor::lmheadw), V * C});
    }
    const auto at = [&](ParamTensor t, int l, std::uint64_t per_layer, std::uint64_t within = 0) {
        return layout.offset(t) +
               static_cast<std::size_t>(per_layer * static_cast<std::uint64_t>(l) + within);
    };
    for (int l = 0; l < c.num_layers; ++l) {
        const auto blk = [&](const char* suffix) { return layer_tensor_name(l, suffix); };
        wanted.push_back({blk("attn_norm.weight"), {C}, at(ParamTensor::ln1w, l, C), C});
        wanted.push_back(
            {blk("attn_q.weight"), {C, C}, at(ParamTensor::qkvw, l, W * C), C * C, c.num_heads});
        wanted.push_back({blk("attn_k.weight"),
                          {C, KV},
                          at(ParamTensor::qkvw, l, W * C, C * C),
                          KV * C,
                          c.kv_heads()});
        wanted.push_back(
            {blk("attn_v.weight"), {C, KV}, at(ParamTensor::qkvw, l, W * C, (C + KV) * C), KV * C});
        wanted.push_back(
            {blk("attn_output.weight"), {C, C}, at(ParamTensor::attprojw, l, C * C), C * C});
        wanted.push_back({blk("ffn_norm.weight"), {C}, at(ParamTensor::ln2w, l, C), C});
        wanted.push_back(
            {blk("ffn_gate.weight"), {C, H}, at(ParamTensor::fcw, l, 2 * H * C), H * C});
        wanted.push_back(
            {blk("ffn_up.weight"), {C, H}, at(ParamTensor::fcw, l, 2 * H * C, H * C), H * C});
        wanted.push_back(
            {blk("ffn_down.weight"), {H, C}, at(ParamTensor::fcprojw, l, H * C), H * C});
    }
    return wanted;
}

// The Llama family's block from llama.*'s keys, every setting it cannot compute refused by key.
Architecture llama_architecture(const std::map<std::string, Metadata>& metadata,
                                const std::string& name, int C, int NH, bool tied) {
    const auto number = [&](const std::string& key, std::optional<double> absent) -> double {
        const auto it = metadata.find(key);
        if (it == metadata.end() || it->second.type == ValueType::String ||
            it->second.type == ValueType::Array) {
            if (absent) return *absent;
            throw InputError(name + ": a GGUF llama model without the number " + key);
        }
        return it->second.number;
    };
    const auto whole = [&](const std::string& key, std::optional<double> absent) {
        const double value = number(key, absent);
        if (!(value >= 1.0 && value <= 1e9) || value != std::floor(value)) {
            throw InputError(name + ": " + key + " is " + std::to_string(value) +
                             ", not a positive whole number");
        }
        return static_cast<int>(value);
    };
    Architecture a;
    a.norm = NormKind::RmsNorm;
    a.positions = PositionKind::Rotary;
    a.mlp = MlpKind::SwiGlu;
    a.biases = false;
    a.tied_head = tied;
    a.mlp_hidden = whole("llama.feed_forward_length", std::nullopt);
    const int kv = whole("llama.attention.head_count_kv", NH);
    a.kv_heads = kv == NH ? 0 : kv;
    a.norm_eps = static_cast<float>(number("llama.attention.layer_norm_rms_epsilon", std::nullopt));
    a.rope_theta = static_cast<float>(number("llama.rope.freq_base", 10000.0));
    if (!(a.norm_eps > 0.0f) || !(a.rope_theta > 0.0f) || !std::isfinite(a.rope_theta)) {
        throw InputError(name +
                         ": llama.attention.layer_norm_rms_epsilon and llama.rope.freq_base "
                         "must be positive");
    }
    const int head_size = NH > 0 && C % NH == 0 ? C / NH : 0;
    for (const char* key : {"llama.rope.dimension_count", "llama.attention.key_length",
                            "llama.attention.value_length"}) {
        if (metadata.count(key) != 0 && whole(key, std::nullopt) != head_size) {
            throw InputError(name + ": " + key + " is " + std::to_string(whole(key, std::nullopt)) +
                             ", not the head size " + std::to_string(head_size) +
                             " (the programs' rotary turns every channel of a head)");
        }
    }
    if (number("llama.expert_count", 0.0) > 0.0) {
        throw InputError(name +
                         ": llama.expert_count: a mixture of experts, which the programs "
                         "do not compute");
    }
    if (const auto it = metadata.find("llama.rope.scaling.type");
        it != metadata.end() &&
        !(it->second.type == ValueType::String && it->second.text == "none")) {
        throw InputError(name +
                         ": llama.rope.scaling.type: scaled rotary positions are not "
                         "computed by the programs");
    }
    return a;
}

}  // namespace

LoadedModel load_gguf_model(const std::filesystem::path& path) {
    const MappedFile file(path);
    const std::span<const std::uint8_t> bytes = file.bytes();
    const std::string name = path.string();
    GgufReader in(bytes, name);
    if (bytes.size() < 4 || std::memcmp(bytes.data(), "GGUF", 4) != 0) {
        throw InputError(name + ": not a GGUF file (it does not start with GGUF)");
    }
    in.take(4, "magic");
    const auto version = in.get<std::uint32_t>("version");
    if (version != 2 && version != 3) {
        throw InputError(name + ": GGUF version " + std::to_string(version) +
                         " (the programs read versions 2 and 3)");
    }
    const auto tensor_count = in.get<std::uint64_t>("tensor count");
    const auto key_count = in.get<std::uint64_t>("key count");
    if (tensor_count > in.remaining() || key_count > in.remaining()) {
        in.fail("more keys or tensors than the file has bytes");
    }
    std::map<std::string, Metadata> metadata;
    for (std::uint64_t i = 0; i < key_count; ++i) {
        std::string key = in.string("key");
        Metadata value = read_value(in, key);
        metadata.insert_or_assign(std::move(key), std::move(value));
    }
    const auto text = [&](const std::string& key) -> std::optional<std::string> {
        const auto it = metadata.find(key);
        if (it == metadata.end() || it->second.type != ValueType::String) return std::nullopt;
        return it->second.text;
    };
    const auto number = [&](const std::string& key) -> double {
        const auto it = metadata.find(key);
        if (it == metadata.end() || it->second.type == ValueType::String ||
            it->second.type == ValueType::Array) {
            throw InputError(name + ": a GGUF model without the number " + key);
        }
        return it->second.number;
    };

    // What the file is, before anything of its shape is read.
    const std::string architecture = text("general.architecture").value_or("");
    if (text("general.type") == "adapter") {
        throw InputError(name + " is a GGUF " + text("adapter.type").value_or("") +
                         " adapter for llama.cpp's '" + architecture +
                         "' architecture, not a model: llama.cpp applies it to its base model "
                         "(--lora); the programs read a PEFT adapter directory (--lora-from)");
    }
    if (architecture != "gpt2" && architecture != "llama") {
        throw InputError(name + " is a GGUF model of llama.cpp's '" + architecture +
                         "' architecture: the programs read its 'gpt2' and 'llama' architectures "
                         "(GPT-2 and the Llama family, as convert_model writes them)");
    }
    const bool llama = architecture == "llama";
    const std::string key = architecture + ".";  // the architecture's own keys
    const auto whole = [&](const std::string& key) {
        const double value = number(key);
        if (!(value >= 1.0 && value <= 1e9) || value != std::floor(value)) {
            throw InputError(name + ": " + key + " is " + std::to_string(value) +
                             ", not a positive whole number");
        }
        return static_cast<int>(value);
    };
    const int C = whole(key + "embedding_length");
    const int L = whole(key + "block_count");
    const int NH = whole(key + "attention.head_count");
    const int maxT = whole(key + "context_length");
    if (!llama && metadata.count("gpt2.feed_forward_length") != 0 &&
        whole("gpt2.feed_forward_length") != 4 * std::int64_t{C}) {
        throw InputError(name + ": gpt2.feed_forward_length " +
                         std::to_string(whole("gpt2.feed_forward_length")) +
                         " is not 4 x gpt2.embedding_length (" +
                         std::to_string(4 * std::int64_t{C}) + "), GPT-2's MLP");
    }
    if (!llama && metadata.count("gpt2.attention.layer_norm_epsilon") != 0 &&
        std::abs(number("gpt2.attention.layer_norm_epsilon") - 1e-5) > 1e-9) {
        throw InputError(name + ": gpt2.attention.layer_norm_epsilon " +
                         std::to_string(number("gpt2.attention.layer_norm_epsilon")) +
                         " is not GPT-2's 1e-5, which the programs' LayerNorm uses");
    }

    // The embedded tokenizer, as the model's own.
    if (text("tokenizer.ggml.model") != "gpt2") {
        throw InputError(name + ": its tokenizer is '" +
                         text("tokenizer.ggml.model").value_or("none") +
                         "', not the byte-level BPE ('gpt2') the programs read");
    }
    SpelledBpe spelled;
    if (const auto it = metadata.find("tokenizer.ggml.tokens");
        it != metadata.end() && it->second.element == ValueType::String) {
        spelled.tokens = it->second.texts;
    }
    if (spelled.tokens.empty()) throw InputError(name + ": no tokenizer.ggml.tokens");
    if (const auto it = metadata.find("tokenizer.ggml.merges");
        it != metadata.end() && it->second.element == ValueType::String) {
        spelled.merges = it->second.texts;
    }
    // How llama.cpp splits text before merging: GPT-2's pattern, or every digit first ("smollm").
    const std::string pre = text("tokenizer.ggml.pre").value_or("gpt-2");
    if (pre == "smollm") {
        spelled.pre = PreTokenizer::DigitsThenGpt2;
    } else if (pre != "gpt-2" && pre != "default") {
        throw InputError(name + ": tokenizer.ggml.pre '" + pre +
                         "' is a pre-tokenizer the programs do not compute ('gpt-2' and "
                         "'smollm')");
    }
    const std::unique_ptr<Tokenizer> tokenizer =
        tokenizer_from_spelling(spelled, name + " (tokenizer.ggml)");

    const int V = static_cast<int>(spelled.tokens.size());

    // The tensors' descriptions, then their data (aligned).
    std::map<std::string, TensorInfo> tensors;
    for (std::uint64_t i = 0; i < tensor_count; ++i) {
        std::string tensor_name = in.string("tensor name");
        TensorInfo info;
        const auto dims = in.get<std::uint32_t>("tensor dimensions");
        if (dims == 0 || dims > 4) in.fail(tensor_name + ": " + std::to_string(dims) + " dims");
        for (std::uint32_t d = 0; d < dims; ++d)
            info.ne.push_back(in.get<std::uint64_t>("tensor shape"));
        info.type = in.get<std::uint32_t>("tensor type");
        info.offset = in.get<std::uint64_t>("tensor offset");
        tensors.insert_or_assign(std::move(tensor_name), std::move(info));
    }
    // The Llama family's block from llama.*; its head is untied where the file has output.weight.
    const ModelConfig config =
        llama ? ModelConfig(
                    maxT, V, pad_vocab(V), L, NH, C,
                    llama_architecture(metadata, name, C, NH, tensors.count("output.weight") == 0))
              : ModelConfig{maxT, V, pad_vocab(V), L, NH, C};
    validate_config(config, name);
    double alignment_value = kAlignment;
    if (metadata.count("general.alignment") != 0) alignment_value = number("general.alignment");
    if (!(alignment_value >= 1 && alignment_value <= 65536)) in.fail("general.alignment");
    const auto alignment = static_cast<std::size_t>(alignment_value);
    const std::size_t data_start = (in.offset() + alignment - 1) / alignment * alignment;

    std::set<std::string> used;
    // Tensor `tensor_name`'s stored bytes and type, checked: present, of shape `ne`, of a type the
    // reader takes (Q8_0 in whole blocks per row: ggml's blocks do not cross rows), in the file.
    const auto stored_tensor = [&](const std::string& tensor_name,
                                   const std::vector<std::uint64_t>& ne) {
        const auto it = tensors.find(tensor_name);
        if (it == tensors.end()) {
            throw InputError(name + ": no tensor " + tensor_name + " (llama.cpp's " + architecture +
                             " model of " + describe(config) + " has one)");
        }
        const TensorInfo& info = it->second;
        if (info.ne != ne) {
            std::string shape, expected;
            for (const std::uint64_t d : info.ne)
                shape += (shape.empty() ? "" : " x ") + std::to_string(d);
            for (const std::uint64_t d : ne)
                expected += (expected.empty() ? "" : " x ") + std::to_string(d);
            throw InputError(name + ": tensor " + tensor_name + " is " + shape + ", expected " +
                             expected + " for the shape " + key + "* gives");
        }
        const std::optional<std::uint64_t> count = element_count(info.ne);
        std::optional<std::uint64_t> size = count ? stored_bytes(info.type, *count) : std::nullopt;
        if (static_cast<StoredType>(info.type) == StoredType::Q8_0 && info.ne[0] % kQ8Block != 0) {
            size.reset();
        }
        if (!size) {
            throw InputError(name + ": tensor " + tensor_name + " is " +
                             std::string(ggml_type_name(info.type)) + " (type " +
                             std::to_string(info.type) +
                             "): the programs read F32, F16, BF16 and Q8_0 (requantize with "
                             "llama.cpp's llama-quantize to q8_0, or convert again)");
        }
        if (info.offset > bytes.size() || data_start > bytes.size() - info.offset ||
            *size > bytes.size() - data_start - info.offset) {
            throw InputError(name + ": tensor " + tensor_name +
                             "'s data lies beyond the end of the file (truncated)");
        }
        used.insert(tensor_name);
        return std::pair{bytes.subspan(data_start + static_cast<std::size_t>(info.offset),
                                       static_cast<std::size_t>(*size)),
                         info.type};
    };
    // Every tensor the shape calls for, and where it goes: all checked before the model is
    // allocated, so that a small file cannot make the program allocate a model it does not hold.
    const ParameterLayout layout(config);
    const auto uC = static_cast<std::uint64_t>(C);
    const auto uV = static_cast<std::uint64_t>(V);
    std::vector<Wanted> wanted =
        llama ? llama_tensors(config, layout) : gpt2_tensors(config, layout);
    std::vector<std::pair<std::span<const std::uint8_t>, std::uint32_t>> stored;
    for (const Wanted& w : wanted)
        stored.push_back(stored_tensor(w.name, w.ne));
    // llama.cpp's converter writes GPT-2's tied head again as output.weight: it must be that copy
    // (within the rounding of its own type, where it was stored otherwise).
    const bool has_head = !llama && tensors.count("output.weight") != 0;
    std::pair<std::span<const std::uint8_t>, std::uint32_t> head_stored;
    if (has_head) head_stored = stored_tensor("output.weight", {uC, uV});
    for (const auto& [tensor_name, info] : tensors) {
        if (used.count(tensor_name) == 0) {
            throw InputError(name + ": tensor " + tensor_name + " is not one of llama.cpp's " +
                             architecture + " architecture's");
        }
    }

    LoadedModel loaded{Model(config), std::nullopt};
    const std::span<float> params = loaded.model.params.span();
    std::fill(params.begin(), params.end(), 0.0f);
    for (std::size_t i = 0; i < wanted.size(); ++i) {
        const std::span<float> into = params.subspan(wanted[i].offset, wanted[i].count);
        widen(into, stored[i].first, stored[i].second);
        file.release(stored[i].first);
        if (wanted[i].rotary_heads > 0) {
            gguf_format::halves_from_interleaved(into, wanted[i].rotary_heads, config.head_size(),
                                                 uC);
        }
    }
    if (has_head) {
        std::vector<float> head(uV * uC);
        widen(head, head_stored.first, head_stored.second);
        const std::span<const float> wte = layout.tensor(params, ParamTensor::wte).first(uV * uC);
        double diff = 0.0, norm = 0.0;
        for (std::size_t i = 0; i < head.size(); ++i) {
            diff += (static_cast<double>(head[i]) - wte[i]) * (head[i] - wte[i]);
            norm += static_cast<double>(wte[i]) * wte[i];
        }
        // Two roundings to 8 significant bits at most (BF16, Q8_0) stay within 2^-7 of the norm.
        if (diff > norm * std::pow(2.0, -14)) {
            throw InputError(name +
                             ": its output.weight is not token_embd.weight: an untied LM "
                             "head, which GPT-2 (and the programs) do not have");
        }
    }
    nlohmann::json config_json = {
        {"source", "gguf"}, {"file", name}, {"general.name", text("general.name").value_or("")}};
    // general.name is any bytes the file holds: invalid UTF-8 is replaced, not thrown on.
    loaded.extras = CheckpointExtras{
        tokenizer->serialize(),
        config_json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
    return loaded;
}

}  // namespace gpt2
