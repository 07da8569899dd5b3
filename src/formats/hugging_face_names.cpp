#include "formats/hugging_face_names.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>

#include "core/error.hpp"

namespace gpt2 {

using nlohmann::json;

std::vector<std::int64_t> gpt2_layer_shape(ParamTensor t, const ModelConfig& c) {
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

const char* torch_dtype_name(ElementType type) {
    return type == ElementType::F32 ? "float32" : type == ElementType::F16 ? "float16" : "bfloat16";
}

namespace {
// A float as config.json shows it: its shortest decimal (1e-05, not 9.999999747378752e-06).
double shortest_decimal(float value) {
    char text[32];
    char* end = std::to_chars(text, text + sizeof(text) - 1, value).ptr;
    *end = '\0';
    return std::strtod(text, nullptr);
}
}  // namespace

std::vector<HuggingFacePiece> llama_pieces(const ModelConfig& c) {
    const std::int64_t C = c.channels, KV = static_cast<std::int64_t>(c.kv_heads()) * c.head_size();
    const std::int64_t H = c.mlp_hidden();
    using enum ParamTensor;
    std::vector<HuggingFacePiece> pieces;
    pieces.push_back({"model.embed_tokens.weight", wte, -1, 0, c.vocab_size, C, false});
    for (int l = 0; l < c.num_layers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        pieces.push_back({p + "input_layernorm.weight", ln1w, l, 0, 1, C, true});
        pieces.push_back({p + "self_attn.q_proj.weight", qkvw, l, 0, C, C, false});
        pieces.push_back({p + "self_attn.k_proj.weight", qkvw, l, C, KV, C, false});
        pieces.push_back({p + "self_attn.v_proj.weight", qkvw, l, C + KV, KV, C, false});
        pieces.push_back({p + "self_attn.o_proj.weight", attprojw, l, 0, C, C, false});
        pieces.push_back({p + "post_attention_layernorm.weight", ln2w, l, 0, 1, C, true});
        pieces.push_back({p + "mlp.gate_proj.weight", fcw, l, 0, H, C, false});
        pieces.push_back({p + "mlp.up_proj.weight", fcw, l, H, H, C, false});
        pieces.push_back({p + "mlp.down_proj.weight", fcprojw, l, 0, C, H, false});
    }
    pieces.push_back({"model.norm.weight", lnfw, -1, 0, 1, C, true});
    if (!c.arch.tied_head) {
        pieces.push_back({"lm_head.weight", lmheadw, -1, 0, c.vocab_size, C, false});
    }
    return pieces;
}

ModelConfig read_llama_config(const json& config, const std::string& file) {
    const auto fail = [&](const std::string& key, const std::string& what) {
        return InputError(file + ": " + key + " " + what);
    };
    const auto positive = [&](const std::string& key) -> int {
        if (!config.contains(key)) throw fail(key, "is missing (a Llama config.json has it)");
        const json& v = config[key];
        if (!v.is_number_integer() || v.get<std::int64_t>() <= 0 ||
            v.get<std::int64_t>() > (1 << 30)) {
            throw fail(key, "must be a positive integer, not " + v.dump());
        }
        return v.get<int>();
    };
    const auto setting = [&](const std::string& key, const json& fallback) {
        return config.contains(key) && !config[key].is_null() ? config[key] : fallback;
    };
    const auto number = [&](const std::string& key, double fallback) {
        const json v = setting(key, fallback);
        if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0) {
            throw fail(key, "must be a positive number, not " + v.dump());
        }
        return v.get<double>();
    };
    if (const json act = setting("hidden_act", "silu"); act != "silu") {
        throw fail("hidden_act", act.dump() + ": the Llama block here is SwiGLU (silu)");
    }
    for (const char* key : {"attention_bias", "mlp_bias", "rope_interleaved"}) {
        if (const json v = setting(key, false); v != false) {
            throw fail(key, v.dump() + ": the Llama block here has no biases and rotates halves");
        }
    }
    if (config.contains("rope_scaling") && !config["rope_scaling"].is_null()) {
        throw fail("rope_scaling",
                   config["rope_scaling"].dump() + ": scaled rotary positions are not computed");
    }
    Architecture a;
    a.norm = NormKind::RmsNorm;
    a.norm_eps = static_cast<float>(number("rms_norm_eps", 1e-6));
    a.positions = PositionKind::Rotary;
    a.rope_theta = static_cast<float>(number("rope_theta", 10000.0));
    a.mlp = MlpKind::SwiGlu;
    a.mlp_hidden = positive("intermediate_size");
    a.biases = false;
    const json tied = setting("tie_word_embeddings", false);
    if (!tied.is_boolean()) throw fail("tie_word_embeddings", "must be true or false");
    a.tied_head = tied.get<bool>();
    const int heads = positive("num_attention_heads");
    const int kv_heads =
        config.contains("num_key_value_heads") ? positive("num_key_value_heads") : heads;
    a.kv_heads = kv_heads == heads ? 0 : kv_heads;
    const int C = positive("hidden_size");
    if (const json head_dim = setting("head_dim", C / heads);
        !head_dim.is_number_integer() || head_dim.get<std::int64_t>() * heads != C) {
        throw fail("head_dim", head_dim.dump() + ": heads here are hidden_size / " +
                                   "num_attention_heads = " + std::to_string(C / heads) + " wide");
    }
    const int V = positive("vocab_size");
    ModelConfig c(positive("max_position_embeddings"), V, pad_vocab(V),
                  positive("num_hidden_layers"), heads, C, a);
    validate_config(c, file);
    return c;
}

std::optional<std::string> not_a_llama(const ModelConfig& c) {
    const Architecture& a = c.arch;
    if (a.norm != NormKind::RmsNorm || !a.norm_gains || a.positions != PositionKind::Rotary ||
        a.mlp != MlpKind::SwiGlu || a.biases || a.qk_norm || a.embedding_norm) {
        return "a model of " + describe(a) +
               " is not a LlamaForCausalLM (RMSNorm with gains, rotary positions, SwiGLU, no "
               "biases); Hugging Face's format takes GPT-2 and the Llama family only";
    }
    return std::nullopt;
}

nlohmann::ordered_json llama_config_json(const ModelConfig& c, const nlohmann::ordered_json& eot,
                                         ElementType type) {
    return {
        {"architectures", {"LlamaForCausalLM"}},
        {"attention_bias", false},
        {"attention_dropout", 0.0},
        {"bos_token_id", eot},
        {"eos_token_id", eot},
        {"head_dim", c.head_size()},
        {"hidden_act", "silu"},
        {"hidden_size", c.channels},
        {"initializer_range", 0.02},
        {"intermediate_size", c.mlp_hidden()},
        {"max_position_embeddings", c.max_seq_len},
        {"mlp_bias", false},
        {"model_type", "llama"},
        {"num_attention_heads", c.num_heads},
        {"num_hidden_layers", c.num_layers},
        {"num_key_value_heads", c.kv_heads()},
        {"pretraining_tp", 1},
        {"rms_norm_eps", shortest_decimal(c.arch.norm_eps)},
        {"rope_scaling", nullptr},
        {"rope_theta", shortest_decimal(c.arch.rope_theta)},
        {"tie_word_embeddings", c.arch.tied_head},
        {"torch_dtype", torch_dtype_name(type)},
        {"use_cache", true},
        {"vocab_size", c.vocab_size},
    };
}

}  // namespace gpt2
