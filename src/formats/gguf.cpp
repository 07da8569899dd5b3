#include "formats/gguf.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "formats/element_type.hpp"
#include "formats/gguf_format.hpp"

namespace gpt2 {

namespace {

using gguf_format::kAlignment;
using gguf_format::kGgufLayerTensors;
using gguf_format::layer_tensor_name;
using gguf_format::LayerTensor;
using gguf_format::TensorType;
using Value = gguf_format::ValueType;
// general.file_type: what most tensors are (llama_ftype).
std::uint32_t file_type(GgufWeights w) {
    switch (w) {
        case GgufWeights::F32:
            return 0;
        case GgufWeights::F16:
            return 1;
        case GgufWeights::Q8_0:
            return 7;
        case GgufWeights::Bf16:
            return 32;
    }
    return 0;
}

class Writer {
  public:
    template <typename T>
    void put(T value) {
        const std::size_t at = bytes.size();
        bytes.resize(at + sizeof(T));
        std::memcpy(bytes.data() + at, &value, sizeof(T));
    }
    void string(std::string_view s) {
        put<std::uint64_t>(s.size());
        bytes.insert(bytes.end(), s.begin(), s.end());
    }
    std::vector<std::uint8_t> bytes;
};

// A tensor to write: its values are converted to `weights` only when the writer reaches it, so
// that a model is written without a second copy of it in memory.
struct Tensor {
    std::string name;
    std::vector<std::uint64_t> ne;  // ggml order: ne[0] is the row length
    TensorType type;
    std::span<const float> values;
    GgufWeights weights;
    // Values made for the file (llama.cpp's row order of Q and K) that `values` points into.
    std::shared_ptr<const std::vector<float>> owned;
    [[nodiscard]] std::uint64_t data_bytes() const;
    [[nodiscard]] std::vector<std::uint8_t> data() const;
};

}  // namespace

void append_q8_0(std::vector<std::uint8_t>& out, std::span<const float> values) {
    for (std::size_t b = 0; b < values.size(); b += kQ8Block) {
        float amax = 0.0f;
        for (int i = 0; i < kQ8Block; ++i)
            amax = std::max(amax, std::abs(values[b + i]));
        const float d = amax / 127.0f;
        const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
        const std::uint16_t scale = float_to_half(d);
        const std::size_t at = out.size();
        out.resize(at + 2 + kQ8Block);
        std::memcpy(out.data() + at, &scale, 2);
        for (int i = 0; i < kQ8Block; ++i) {
            const auto q = static_cast<std::int8_t>(std::lround(values[b + i] * inverse));
            out[at + 2 + i] = static_cast<std::uint8_t>(q);
        }
    }
}

namespace {

// The tokenizer spelled as llama.cpp's gpt2 tokenizer wants it (a char tokenizer as a BPE without
// merges), with one token per row of the model's vocabulary; Q8_0 needs rows of whole blocks.
SpelledBpe checked_tokenizer(const std::filesystem::path& path, const Model& model,
                             const Tokenizer& tokenizer, GgufWeights weights) {
    SpelledBpe spelled;
    try {
        spelled = spell_byte_level_bpe(tokenizer);
    } catch (const InputError& e) {
        throw InputError(
            path.string() +
            ": llama.cpp's gpt2 architecture needs a byte-level BPE tokenizer: " + e.what());
    }
    const ModelConfig& c = model.config;
    if (static_cast<int>(spelled.tokens.size()) != c.vocab_size) {
        throw InputError(path.string() + ": the tokenizer has " +
                         std::to_string(spelled.tokens.size()) + " tokens but the model " +
                         std::to_string(c.vocab_size) + ": llama.cpp needs them equal");
    }
    if (weights == GgufWeights::Q8_0 && c.channels % kQ8Block != 0) {
        throw InputError(path.string() +
                         ": Q8_0 needs rows of a multiple of 32 values; this "
                         "model has " +
                         std::to_string(c.channels) + " channels (use f16, bf16 or f32)");
    }

    return spelled;
}

// `values` as a tensor of type `weights`.
Tensor make_tensor(std::string name, std::vector<std::uint64_t> ne, std::span<const float> values,
                   GgufWeights weights) {
    const TensorType type = weights == GgufWeights::F16    ? TensorType::F16
                            : weights == GgufWeights::Bf16 ? TensorType::Bf16
                            : weights == GgufWeights::Q8_0 ? TensorType::Q8_0
                                                           : TensorType::F32;
    return Tensor{std::move(name), std::move(ne), type, values, weights, nullptr};
}

std::uint64_t Tensor::data_bytes() const {
    switch (weights) {
        case GgufWeights::F32:
            return values.size() * 4;
        case GgufWeights::F16:
        case GgufWeights::Bf16:
            return values.size() * 2;
        case GgufWeights::Q8_0:
            return values.size() / kQ8Block * (2 + kQ8Block);
    }
    return 0;
}

std::vector<std::uint8_t> Tensor::data() const {
    std::vector<std::uint8_t> bytes;
    switch (weights) {
        case GgufWeights::F32:
            append_elements(bytes, values, ElementType::F32);
            break;
        case GgufWeights::F16:
            append_elements(bytes, values, ElementType::F16);
            break;
        case GgufWeights::Bf16:
            append_elements(bytes, values, ElementType::Bf16);
            break;
        case GgufWeights::Q8_0:
            append_q8_0(bytes, values);
            break;
    }
    if (bytes.size() != data_bytes()) {
        throw std::logic_error("GGUF tensor " + name + ": " + std::to_string(bytes.size()) +
                               " bytes made, " + std::to_string(data_bytes()) + " announced");
    }
    return bytes;
}

// Tensors to write: 2-D weights in `weights`' type, 1-D ones in F32; `owned` keeps values made for
// the file alive.
struct TensorList {
    GgufWeights weights;
    std::vector<Tensor> tensors;
    void add(std::string name, std::vector<std::uint64_t> ne, std::span<const float> values,
             std::shared_ptr<const std::vector<float>> owned = nullptr) {
        const GgufWeights w = ne.size() == 2 ? weights : GgufWeights::F32;
        tensors.push_back(make_tensor(std::move(name), std::move(ne), values, w));
        tensors.back().owned = std::move(owned);
    }
};

// The model's tensors in llama.cpp's names; 2-D weights in `weights`' type, 1-D ones in F32.
std::vector<Tensor> gguf_tensors(const Model& model, GgufWeights weights) {
    const ModelConfig& c = model.config;
    TensorList list{weights, {}};
    const std::span<const float> params = model.weights();
    const ParameterLayout& layout = model.layout;
    const auto C = static_cast<std::uint64_t>(c.channels);
    const auto V = static_cast<std::uint64_t>(c.vocab_size);
    list.add("token_embd.weight", {C, V}, layout.tensor(params, ParamTensor::wte).first(V * C));
    list.add("position_embd.weight", {C, static_cast<std::uint64_t>(c.max_seq_len)},
             layout.tensor(params, ParamTensor::wpe));
    list.add("output_norm.weight", {C}, layout.tensor(params, ParamTensor::lnfw));
    list.add("output_norm.bias", {C}, layout.tensor(params, ParamTensor::lnfb));
    for (int l = 0; l < c.num_layers; ++l) {
        for (const LayerTensor& t : kGgufLayerTensors) {
            const std::span<const float> values = layout.layer(params, t.tensor, l);
            std::vector<std::uint64_t> ne = {C * t.in, C * t.out};
            if (t.in == 0) ne = {values.size()};
            list.add(layer_tensor_name(l, t.suffix), std::move(ne), values);
        }
    }
    return std::move(list.tensors);
}

// Whether the model is one llama.cpp's llama architecture computes: RMSNorm with gains, rotary
// positions, SwiGLU, no biases, no QK-norm, no norm on the embeddings (tied head or not, any
// key/value heads).
bool is_llama_block(const ModelConfig& c) {
    const Architecture& a = c.arch;
    return a.norm == NormKind::RmsNorm && a.norm_gains && a.positions == PositionKind::Rotary &&
           a.mlp == MlpKind::SwiGlu && !a.biases && !a.qk_norm && !a.embedding_norm;
}

// Rows of `heads` heads of head_size (each row `cols` values) in llama.cpp's order: its rotary
// positions rotate adjacent pairs, Hugging Face's (and ours) the two halves of a head, so each
// head's rows go from (first half, second half) to interleaved, as convert_hf_to_gguf.py permutes
// Q and K; the attention scores are the same.
std::shared_ptr<const std::vector<float>> interleaved_heads(std::span<const float> rows, int heads,
                                                            int head_size, std::size_t cols) {
    auto out = std::make_shared<std::vector<float>>(rows.size());
    const int half = head_size / 2;
    for (int h = 0; h < heads; ++h) {
        for (int i = 0; i < half; ++i) {
            for (int j = 0; j < 2; ++j) {
                const std::size_t from = static_cast<std::size_t>(h * head_size + j * half + i);
                const std::size_t to = static_cast<std::size_t>(h * head_size + 2 * i + j);
                std::copy_n(rows.begin() + static_cast<long>(from * cols), cols,
                            out->begin() + static_cast<long>(to * cols));
            }
        }
    }
    return out;
}

// The Llama family's tensors in llama.cpp's names.
std::vector<Tensor> gguf_llama_tensors(const Model& model, GgufWeights weights) {
    const ModelConfig& c = model.config;
    TensorList list{weights, {}};
    const std::span<const float> params = model.weights();
    const ParameterLayout& layout = model.layout;
    const auto C = static_cast<std::uint64_t>(c.channels);
    const auto V = static_cast<std::uint64_t>(c.vocab_size);
    const auto KV = static_cast<std::uint64_t>(c.kv_heads() * c.head_size());
    const auto H = static_cast<std::uint64_t>(c.mlp_hidden());
    list.add("token_embd.weight", {C, V}, layout.tensor(params, ParamTensor::wte).first(V * C));
    list.add("output_norm.weight", {C}, layout.tensor(params, ParamTensor::lnfw));
    if (layout.has(ParamTensor::lmheadw)) {
        list.add("output.weight", {C, V}, layout.tensor(params, ParamTensor::lmheadw).first(V * C));
    }
    for (int l = 0; l < c.num_layers; ++l) {
        const std::string blk = "blk." + std::to_string(l) + ".";
        const std::span<const float> qkv = layout.layer(params, ParamTensor::qkvw, l);
        const std::span<const float> fc = layout.layer(params, ParamTensor::fcw, l);
        const auto q = interleaved_heads(qkv.first(C * C), c.num_heads, c.head_size(), C);
        const auto k =
            interleaved_heads(qkv.subspan(C * C, KV * C), c.kv_heads(), c.head_size(), C);
        list.add(blk + "attn_norm.weight", {C}, layout.layer(params, ParamTensor::ln1w, l));
        list.add(blk + "attn_q.weight", {C, C}, *q, q);
        list.add(blk + "attn_k.weight", {C, KV}, *k, k);
        list.add(blk + "attn_v.weight", {C, KV}, qkv.subspan((C + KV) * C, KV * C));
        list.add(blk + "attn_output.weight", {C, C},
                 layout.layer(params, ParamTensor::attprojw, l));
        list.add(blk + "ffn_norm.weight", {C}, layout.layer(params, ParamTensor::ln2w, l));
        list.add(blk + "ffn_gate.weight", {C, H}, fc.first(H * C));
        list.add(blk + "ffn_up.weight", {C, H}, fc.subspan(H * C, H * C));
        list.add(blk + "ffn_down.weight", {H, C}, layout.layer(params, ParamTensor::fcprojw, l));
    }
    return std::move(list.tensors);
}

// The id llama.cpp gets as bos and eos: the end-of-text token; for a char tokenizer, which has
// none, the newline (id 0 without one), the token our generator starts from without a prompt.
// llama.cpp's gpt2 tokenizer always has an eos (without the key, id 11), at which its front ends
// stop generating: naming the newline makes that the end of a line rather than some character.
std::uint32_t boundary_token(const SpelledBpe& spelled) {
    if (spelled.eot_id) return static_cast<std::uint32_t>(*spelled.eot_id);
    const std::string newline = "\xC4\x8A";  // byte 0x0A in GPT-2's spelling
    const auto it = std::find(spelled.tokens.begin(), spelled.tokens.end(), newline);
    return it == spelled.tokens.end() ? 0u
                                      : static_cast<std::uint32_t>(it - spelled.tokens.begin());
}

// A GGUF file's key-value section as it is written, and how many keys it holds.
class KeyValues {
  public:
    // The key and its type; the caller writes an array's element type, length and elements.
    Writer& key(std::string_view k, Value type) {
        kv.string(k);
        kv.put(static_cast<std::uint32_t>(type));
        ++count;
        return kv;
    }
    void string(std::string_view k, std::string_view v) { key(k, Value::String).string(v); }
    void u32(std::string_view k, std::uint32_t v) { key(k, Value::U32).put(v); }
    void f32(std::string_view k, float v) { key(k, Value::F32).put(v); }
    void boolean(std::string_view k, bool v) { key(k, Value::Bool).put<std::uint8_t>(v ? 1 : 0); }
    Writer kv;
    std::uint64_t count = 0;
};

// The metadata llama.cpp's gpt2 architecture reads, with the tokenizer embedded.
KeyValues gguf_metadata(const ModelConfig& c, const SpelledBpe& spelled, GgufWeights weights,
                        const std::string& name) {
    const auto C = static_cast<std::uint64_t>(c.channels);
    const bool llama = !c.is_gpt2();  // write_gguf took only llama's block otherwise
    const std::string arch = llama ? "llama" : "gpt2";
    KeyValues out;
    Writer& kv = out.kv;
    out.string("general.architecture", arch);
    out.string("general.name", name);
    out.u32("general.file_type", file_type(weights));
    out.u32("general.quantization_version", 2);
    out.u32("general.alignment", kAlignment);
    out.u32(arch + ".context_length", static_cast<std::uint32_t>(c.max_seq_len));
    out.u32(arch + ".embedding_length", static_cast<std::uint32_t>(C));
    out.u32(arch + ".feed_forward_length", static_cast<std::uint32_t>(c.mlp_hidden()));
    out.u32(arch + ".block_count", static_cast<std::uint32_t>(c.num_layers));
    out.u32(arch + ".attention.head_count", static_cast<std::uint32_t>(c.num_heads));
    if (llama) {
        out.u32("llama.attention.head_count_kv", static_cast<std::uint32_t>(c.kv_heads()));
        out.f32("llama.attention.layer_norm_rms_epsilon", c.arch.norm_eps);
        out.f32("llama.rope.freq_base", c.arch.rope_theta);
        out.u32("llama.rope.dimension_count", static_cast<std::uint32_t>(c.head_size()));
    } else {
        out.f32("gpt2.attention.layer_norm_epsilon", 1e-5f);
    }
    out.string("tokenizer.ggml.model", "gpt2");
    // llama.cpp's name of how text is split: "smollm" is every digit first, then GPT-2's pattern.
    out.string("tokenizer.ggml.pre",
               spelled.pre == PreTokenizer::DigitsThenGpt2 ? "smollm" : "gpt-2");
    out.key("tokenizer.ggml.tokens", Value::Array);
    kv.put(static_cast<std::uint32_t>(Value::String));
    kv.put<std::uint64_t>(spelled.tokens.size());
    for (const std::string& token : spelled.tokens)
        kv.string(token);
    // 1 normal, 3 control (the end-of-text token).
    out.key("tokenizer.ggml.token_type", Value::Array);
    kv.put(static_cast<std::uint32_t>(Value::I32));
    kv.put<std::uint64_t>(spelled.tokens.size());
    for (std::size_t id = 0; id < spelled.tokens.size(); ++id)
        kv.put<std::int32_t>(spelled.eot_id && static_cast<int>(id) == *spelled.eot_id ? 3 : 1);
    // llama.cpp wants the key even when there are no merges (a char tokenizer's export).
    out.key("tokenizer.ggml.merges", Value::Array);
    kv.put(static_cast<std::uint32_t>(Value::String));
    kv.put<std::uint64_t>(spelled.merges.size());
    for (const std::string& merge : spelled.merges)
        kv.string(merge);
    const std::uint32_t boundary = boundary_token(spelled);
    out.u32("tokenizer.ggml.bos_token_id", boundary);
    out.u32("tokenizer.ggml.eos_token_id", boundary);
    // Our tokenizers never add a token of their own to a text.
    out.boolean("tokenizer.ggml.add_bos_token", false);
    out.boolean("tokenizer.ggml.add_eos_token", false);

    return out;
}

// The file: header, key-values, tensor descriptions, the data aligned; written atomically, one
// tensor's data in memory at a time.
void write_gguf_file(const std::filesystem::path& path, const KeyValues& metadata,
                     const std::vector<Tensor>& tensors) {
    Writer head;
    head.bytes = {'G', 'G', 'U', 'F'};
    head.put<std::uint32_t>(3);
    head.put<std::uint64_t>(tensors.size());
    head.put<std::uint64_t>(metadata.count);
    head.bytes.insert(head.bytes.end(), metadata.kv.bytes.begin(), metadata.kv.bytes.end());
    const auto padding = [](std::uint64_t n) { return (kAlignment - n % kAlignment) % kAlignment; };
    std::uint64_t offset = 0;
    for (const Tensor& t : tensors) {
        head.string(t.name);
        head.put(static_cast<std::uint32_t>(t.ne.size()));
        for (const std::uint64_t n : t.ne)
            head.put(n);
        head.put(static_cast<std::uint32_t>(t.type));
        head.put(offset);
        offset += t.data_bytes() + padding(t.data_bytes());
    }
    head.bytes.resize(head.bytes.size() + padding(head.bytes.size()), 0);
    const std::vector<std::uint8_t> zeros(kAlignment, 0);
    AtomicFileWriter file(path);
    file.write(head.bytes);
    for (const Tensor& t : tensors) {
        file.write(t.data());
        file.write(std::span(zeros).first(padding(t.data_bytes())));
    }
    file.commit();
}

}  // namespace

void write_gguf(const std::filesystem::path& path, const Model& model, const Tokenizer& tokenizer,
                GgufWeights weights, const std::string& name) {
    const bool llama = !model.config.is_gpt2();
    if (llama && !is_llama_block(model.config)) {
        throw InputError(path.string() +
                         ": GGUF takes GPT-2 (llama.cpp's gpt2) and the Llama "
                         "family's block (its llama: RMSNorm with gains, rotary, SwiGLU, no "
                         "biases), not " +
                         describe(model.config.arch));
    }
    const SpelledBpe spelled = checked_tokenizer(path, model, tokenizer, weights);
    write_gguf_file(path, gguf_metadata(model.config, spelled, weights, name),
                    llama ? gguf_llama_tensors(model, weights) : gguf_tensors(model, weights));
}

namespace {
// The base tensor llama.cpp adds target t's update to, as write_gguf names it: GPT-2's fused
// products, or the Llama family's per projection.
std::string gguf_lora_base_name(int l, LoraTarget t) {
    switch (t) {
        case LoraTarget::QProj:
            return layer_tensor_name(l, "attn_q.weight");
        case LoraTarget::KProj:
            return layer_tensor_name(l, "attn_k.weight");
        case LoraTarget::VProj:
            return layer_tensor_name(l, "attn_v.weight");
        case LoraTarget::OProj:
            return layer_tensor_name(l, "attn_output.weight");
        case LoraTarget::GateProj:
            return layer_tensor_name(l, "ffn_gate.weight");
        case LoraTarget::UpProj:
            return layer_tensor_name(l, "ffn_up.weight");
        case LoraTarget::DownProj:
            return layer_tensor_name(l, "ffn_down.weight");
        default:
            break;
    }
    const ParamTensor weight = lora_target_weight(t);
    return layer_tensor_name(
        l,
        std::find_if(kGgufLayerTensors.begin(), kGgufLayerTensors.end(), [&](const LayerTensor& x) {
            return x.tensor == weight;
        })->suffix);
}
}  // namespace

void write_gguf_lora(const std::filesystem::path& path, const LoraAdapter& adapter,
                     GgufWeights weights, const std::string& name) {
    if (weights == GgufWeights::Q8_0) {
        throw InputError(path.string() +
                         ": a LoRA adapter's rows are as long as its rank: f32, f16 or bf16");
    }
    const ModelConfig& c = adapter.layout.model();
    const bool llama = !c.is_gpt2();
    if (llama && !is_llama_block(c)) {
        throw InputError(path.string() +
                         ": GGUF takes adapters of GPT-2 and the Llama family's "
                         "block (llama.cpp's llama), not of " +
                         describe(c.arch));
    }
    KeyValues metadata;
    metadata.string("general.architecture", llama ? "llama" : "gpt2");
    metadata.string("general.type", "adapter");
    metadata.string("general.name", name);
    metadata.u32("general.file_type", file_type(weights));
    metadata.u32("general.alignment", kAlignment);
    metadata.string("adapter.type", "lora");
    metadata.f32("adapter.lora.alpha", adapter.config.alpha);
    TensorList tensors{weights, {}};
    const auto r = static_cast<std::uint64_t>(adapter.config.rank);
    const std::span<const float> params = adapter.params.span();
    for (int l = 0; l < adapter.layout.num_layers(); ++l) {
        for (int i = 0; i < kLoraTargets; ++i) {
            const auto target = static_cast<LoraTarget>(i);
            if (!adapter.config.adapts(target)) continue;
            const ProductShape shape = lora_product_shape(c, target);
            const std::string name_in_base = gguf_lora_base_name(l, target);
            // llama.cpp's adapted product is B (A x): A (r, in) row-major is ne {in, r}, B (out, r)
            // is ne {r, out}, PEFT's lora_A and lora_B as they are (the base's ne {in, out}).
            tensors.add(name_in_base + ".lora_a", {static_cast<std::uint64_t>(shape.in), r},
                        params.subspan(adapter.layout.a_offset(l, target),
                                       adapter.layout.a_floats(target)));
            const std::span<const float> b =
                params.subspan(adapter.layout.b_offset(l, target), adapter.layout.b_floats(target));
            const std::vector<std::uint64_t> ne = {r, static_cast<std::uint64_t>(shape.out)};
            if (target == LoraTarget::QProj || target == LoraTarget::KProj) {
                // B's rows are the update's output rows: in llama.cpp's order of Q's and K's rows.
                const auto rows =
                    interleaved_heads(b, target == LoraTarget::QProj ? c.num_heads : c.kv_heads(),
                                      c.head_size(), adapter.config.rank);
                tensors.add(name_in_base + ".lora_b", ne, *rows, rows);
            } else {
                tensors.add(name_in_base + ".lora_b", ne, b);
            }
        }
    }
    write_gguf_file(path, metadata, tensors.tensors);
}

}  // namespace gpt2
