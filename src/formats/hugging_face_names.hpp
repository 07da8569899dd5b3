// How Hugging Face names our models: GPT2LMHeadModel's and LlamaForCausalLM's (SmolLM2, Llama)
// tensors and config.json over our configuration and layout, shared by formats/hugging_face.cpp's
// reader and formats/hugging_face_write.cpp's writer.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "formats/element_type.hpp"
#include "model/model.hpp"

namespace gpt2 {

inline constexpr std::string_view kHuggingFacePrefix = "transformer.";  // GPT-2's tensors
inline constexpr std::string_view kHuggingFaceModelFile = "model.safetensors";
inline constexpr std::string_view kHuggingFaceIndexFile = "model.safetensors.index.json";

// One of GPT-2's per-layer tensors as Hugging Face names it (after "transformer." and "h.N.").
// Conv1D weights are stored (in, out), the transpose of ours (out, in).
struct Gpt2NamedTensor {
    ParamTensor ours;
    std::string_view name;
    bool conv1d;
};
inline constexpr Gpt2NamedTensor kGpt2LayerTensors[] = {
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
// The (rows, cols) of one layer's slice of a GPT-2 per-layer tensor, or (n) for vectors.
[[nodiscard]] std::vector<std::int64_t> gpt2_layer_shape(ParamTensor t, const ModelConfig& c);

// config.json's torch_dtype for the weights' type: "float32", "float16" or "bfloat16".
[[nodiscard]] const char* torch_dtype_name(ElementType type);

// One Hugging Face tensor as rows of ours: rows [first_row, first_row + rows) of `ours` (layer
// `layer`'s slice, or the whole tensor where layer < 0), each of `cols` values; a vector where
// `vector` (shape [cols]). Q, K and V are pieces of our qkvw, gate and up of our fcw.
struct HuggingFacePiece {
    std::string name;
    ParamTensor ours;
    int layer;
    std::int64_t first_row, rows, cols;
    bool vector;
};

// LlamaForCausalLM's tensors for `c` in the order save_pretrained writes them: embed_tokens (the
// vocabulary's rows only), per layer the norms and projections, the final norm, and lm_head where
// the head is untied.
[[nodiscard]] std::vector<HuggingFacePiece> llama_pieces(const ModelConfig& c);

// The configuration a config.json of model_type "llama" gives, every setting our block cannot
// compute refused by key (InputError naming `file`).
[[nodiscard]] ModelConfig read_llama_config(const nlohmann::json& config, const std::string& file);

// Why `c` is not a LlamaForCausalLM (RMSNorm with gains, rotary, SwiGLU, no biases, no QK-norm,
// no norm on the embeddings), or nullopt when it is.
[[nodiscard]] std::optional<std::string> not_a_llama(const ModelConfig& c);

// config.json of LlamaForCausalLM for `c`; `eot` the end-of-text id or null.
[[nodiscard]] nlohmann::ordered_json llama_config_json(const ModelConfig& c,
                                                       const nlohmann::ordered_json& eot,
                                                       ElementType type);

}  // namespace gpt2
