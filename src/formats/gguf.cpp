#include "formats/gguf.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "formats/element_type.hpp"

namespace gpt2 {

namespace {

// GGUF's value types and ggml's tensor types (gguf.h, ggml.h).
enum class Value : std::uint32_t { U32 = 4, I32 = 5, F32 = 6, Bool = 7, String = 8, Array = 9 };
enum class TensorType : std::uint32_t { F32 = 0, F16 = 1, Q8_0 = 8, Bf16 = 30 };
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
constexpr std::uint32_t kAlignment = 32;

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

struct Tensor {
    std::string name;
    std::vector<std::uint64_t> ne;  // ggml order: ne[0] is the row length
    TensorType type;
    std::vector<std::uint8_t> data;
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

// The model's tensors in llama.cpp's names; 2-D weights in `weights`' type, 1-D ones in F32.
std::vector<Tensor> gguf_tensors(const Model& model, GgufWeights weights) {
    const ModelConfig& c = model.config;
    // Tensors, in llama.cpp's names; 2-D weights in (out, in) order, as ours already are.
    std::vector<Tensor> tensors;
    const std::span<const float> params = model.weights();
    const ParameterLayout& layout = model.layout;
    const auto add = [&](std::string tensor_name, std::vector<std::uint64_t> ne,
                         std::span<const float> values) {
        Tensor t{std::move(tensor_name), std::move(ne), TensorType::F32, {}};
        const bool matrix = t.ne.size() == 2;
        const GgufWeights w = matrix ? weights : GgufWeights::F32;
        switch (w) {
            case GgufWeights::F32:
                append_elements(t.data, values, ElementType::F32);
                break;
            case GgufWeights::F16:
                t.type = TensorType::F16;
                append_elements(t.data, values, ElementType::F16);
                break;
            case GgufWeights::Bf16:
                t.type = TensorType::Bf16;
                append_elements(t.data, values, ElementType::Bf16);
                break;
            case GgufWeights::Q8_0:
                t.type = TensorType::Q8_0;
                append_q8_0(t.data, values);
                break;
        }
        tensors.push_back(std::move(t));
    };
    const auto C = static_cast<std::uint64_t>(c.channels);
    const auto V = static_cast<std::uint64_t>(c.vocab_size);
    add("token_embd.weight", {C, V}, layout.tensor(params, ParamTensor::wte).first(V * C));
    add("position_embd.weight", {C, static_cast<std::uint64_t>(c.max_seq_len)},
        layout.tensor(params, ParamTensor::wpe));
    add("output_norm.weight", {C}, layout.tensor(params, ParamTensor::lnfw));
    add("output_norm.bias", {C}, layout.tensor(params, ParamTensor::lnfb));
    for (int l = 0; l < c.num_layers; ++l) {
        const std::string blk = "blk." + std::to_string(l) + ".";
        const auto at = [&](ParamTensor t) { return layout.layer(params, t, l); };
        add(blk + "attn_norm.weight", {C}, at(ParamTensor::ln1w));
        add(blk + "attn_norm.bias", {C}, at(ParamTensor::ln1b));
        add(blk + "attn_qkv.weight", {C, 3 * C}, at(ParamTensor::qkvw));
        add(blk + "attn_qkv.bias", {3 * C}, at(ParamTensor::qkvb));
        add(blk + "attn_output.weight", {C, C}, at(ParamTensor::attprojw));
        add(blk + "attn_output.bias", {C}, at(ParamTensor::attprojb));
        add(blk + "ffn_norm.weight", {C}, at(ParamTensor::ln2w));
        add(blk + "ffn_norm.bias", {C}, at(ParamTensor::ln2b));
        add(blk + "ffn_up.weight", {C, 4 * C}, at(ParamTensor::fcw));
        add(blk + "ffn_up.bias", {4 * C}, at(ParamTensor::fcb));
        add(blk + "ffn_down.weight", {4 * C, C}, at(ParamTensor::fcprojw));
        add(blk + "ffn_down.bias", {C}, at(ParamTensor::fcprojb));
    }

    return tensors;
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

// The metadata llama.cpp's gpt2 architecture reads, with the tokenizer embedded.
struct KeyValues {
    Writer kv;
    std::uint64_t count = 0;
};
KeyValues gguf_metadata(const ModelConfig& c, const SpelledBpe& spelled, GgufWeights weights,
                        const std::string& name) {
    const auto C = static_cast<std::uint64_t>(c.channels);
    KeyValues out;
    Writer& kv = out.kv;
    std::uint64_t& kv_count = out.count;
    const auto key = [&](std::string_view k, Value type) {
        kv.string(k);
        kv.put(static_cast<std::uint32_t>(type));
        ++kv_count;
    };
    const auto put_string = [&](std::string_view k, std::string_view v) {
        key(k, Value::String);
        kv.string(v);
    };
    const auto put_u32 = [&](std::string_view k, std::uint32_t v) {
        key(k, Value::U32);
        kv.put(v);
    };
    put_string("general.architecture", "gpt2");
    put_string("general.name", name);
    put_u32("general.file_type", file_type(weights));
    put_u32("general.quantization_version", 2);
    put_u32("general.alignment", kAlignment);
    put_u32("gpt2.context_length", static_cast<std::uint32_t>(c.max_seq_len));
    put_u32("gpt2.embedding_length", static_cast<std::uint32_t>(C));
    put_u32("gpt2.feed_forward_length", static_cast<std::uint32_t>(4 * C));
    put_u32("gpt2.block_count", static_cast<std::uint32_t>(c.num_layers));
    put_u32("gpt2.attention.head_count", static_cast<std::uint32_t>(c.num_heads));
    key("gpt2.attention.layer_norm_epsilon", Value::F32);
    kv.put(1e-5f);
    put_string("tokenizer.ggml.model", "gpt2");
    put_string("tokenizer.ggml.pre", "gpt-2");
    key("tokenizer.ggml.tokens", Value::Array);
    kv.put(static_cast<std::uint32_t>(Value::String));
    kv.put<std::uint64_t>(spelled.tokens.size());
    for (const std::string& token : spelled.tokens)
        kv.string(token);
    // 1 normal, 3 control (the end-of-text token).
    key("tokenizer.ggml.token_type", Value::Array);
    kv.put(static_cast<std::uint32_t>(Value::I32));
    kv.put<std::uint64_t>(spelled.tokens.size());
    for (std::size_t id = 0; id < spelled.tokens.size(); ++id)
        kv.put<std::int32_t>(spelled.eot_id && static_cast<int>(id) == *spelled.eot_id ? 3 : 1);
    // llama.cpp wants the key even when there are no merges (a char tokenizer's export).
    key("tokenizer.ggml.merges", Value::Array);
    kv.put(static_cast<std::uint32_t>(Value::String));
    kv.put<std::uint64_t>(spelled.merges.size());
    for (const std::string& merge : spelled.merges)
        kv.string(merge);
    const std::uint32_t boundary = boundary_token(spelled);
    put_u32("tokenizer.ggml.bos_token_id", boundary);
    put_u32("tokenizer.ggml.eos_token_id", boundary);
    // Our tokenizers never add a token of their own to a text.
    key("tokenizer.ggml.add_bos_token", Value::Bool);
    kv.put<std::uint8_t>(0);
    key("tokenizer.ggml.add_eos_token", Value::Bool);
    kv.put<std::uint8_t>(0);

    return out;
}

}  // namespace

void write_gguf(const std::filesystem::path& path, const Model& model, const Tokenizer& tokenizer,
                GgufWeights weights, const std::string& name) {
    const SpelledBpe spelled = checked_tokenizer(path, model, tokenizer, weights);
    const std::vector<Tensor> tensors = gguf_tensors(model, weights);
    const KeyValues metadata = gguf_metadata(model.config, spelled, weights, name);
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
        offset += t.data.size() + padding(t.data.size());
    }
    head.bytes.resize(head.bytes.size() + padding(head.bytes.size()), 0);
    const std::vector<std::uint8_t> zeros(kAlignment, 0);
    std::vector<std::span<const std::uint8_t>> pieces{head.bytes};
    for (const Tensor& t : tensors) {
        pieces.emplace_back(t.data);
        pieces.emplace_back(std::span(zeros).first(padding(t.data.size())));
    }
    write_file_atomically(path, pieces);
}

}  // namespace gpt2
