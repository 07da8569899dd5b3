// The model: its shape and architecture, the table of its named tensors (GPT-2's 16 in llm.c's
// order, fewer or more as the architecture says) and the flat parameter buffer laid out from it,
// and its initialisation.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "model/architecture.hpp"
#include "ops/bf16.hpp"

namespace gpt2 {

struct LoraAdapter;  // model/lora.hpp

struct ModelConfig {
    int max_seq_len = 0;        // maxT: rows of the position embedding, the longest context
    int vocab_size = 0;         // V: real tokens
    int padded_vocab_size = 0;  // Vp: rows of wte, a multiple of 128; rows >= V are never predicted
    int num_layers = 0;         // L
    int num_heads = 0;          // NH
    int channels = 0;           // C
    Architecture arch;          // GPT-2's unless said

    ModelConfig() = default;
    ModelConfig(int maxT, int V, int Vp, int L, int NH, int C, const Architecture& a = {})
        : max_seq_len(maxT),
          vocab_size(V),
          padded_vocab_size(Vp),
          num_layers(L),
          num_heads(NH),
          channels(C),
          arch(a) {}

    [[nodiscard]] int head_size() const { return channels / num_heads; }
    [[nodiscard]] int kv_heads() const { return arch.kv_heads > 0 ? arch.kv_heads : num_heads; }
    [[nodiscard]] int mlp_hidden() const {
        return arch.mlp_hidden > 0 ? arch.mlp_hidden : 4 * channels;
    }
    // A qkv row: the queries (C), then kv_heads heads of keys and of values (GPT-2: 3C).
    [[nodiscard]] int qkv_width() const { return channels + 2 * kv_heads() * head_size(); }
    // The MLP's first product: SwiGLU's gate and up (2H), else H.
    [[nodiscard]] int fc_width() const {
        return arch.mlp == MlpKind::SwiGlu ? 2 * mlp_hidden() : mlp_hidden();
    }
    // Every architecture field GPT-2's: files and bits as before architectures were data.
    [[nodiscard]] bool is_gpt2() const { return arch == Architecture{}; }
    friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

// The six dimensions in one fixed order (maxT, V, Vp, L, NH, C), as GPT-2's resume states store
// them.
using ShapeInts = std::array<std::int32_t, 6>;
[[nodiscard]] ShapeInts to_shape_ints(const ModelConfig& config);

// The whole configuration, dimensions and architecture, as a versioned record of 32-bit integers
// (floats by their bits): what ranks exchange and what files of a non-GPT-2 model store. Element 0
// is the record's version (kConfigRecordVersion); a reader refuses other versions by name.
// Version 1 (19 integers) lacked the last field, the embeddings' norm; it still reads.
inline constexpr std::int32_t kConfigRecordVersion = 2;
using ConfigRecord = std::array<std::int32_t, 20>;
inline constexpr std::size_t kConfigRecordV1Ints = 19;
[[nodiscard]] ConfigRecord to_config_record(const ModelConfig& config);
// InputError naming `source` for another version or a field out of range (then validate_config).
[[nodiscard]] ModelConfig from_config_record(const ConfigRecord& record, std::string_view source);
// A record as a file stores it: `bytes` of either version (its length says which, the version
// field must agree); InputError naming `source` otherwise.
[[nodiscard]] ConfigRecord config_record_of_bytes(std::span<const std::uint8_t> bytes,
                                                  std::string_view source);

[[nodiscard]] int pad_vocab(int vocab_size, int multiple = 128);
// Throws InputError naming `source` when the shape is impossible (non-positive, C % NH != 0, ...).
void validate_config(const ModelConfig& config, std::string_view source);
[[nodiscard]] std::string describe(const ModelConfig& config);

// The parameter tensors in llm.c's order, named as llm.c and GPT-2's checkpoints name them (the one
// enum whose values are not PascalCase: these names are what users look up).
enum class ParamTensor : int {
    wte,
    wpe,
    ln1w,
    ln1b,
    qkvw,
    qkvb,
    attprojw,
    attprojb,
    ln2w,
    ln2b,
    fcw,
    fcb,
    fcprojw,
    fcprojb,
    lnfw,
    lnfb,
    lmheadw,  // an untied LM head (absent where the head is wte)
};
// Every tensor any architecture has; a configuration's own are tensor_table's (GPT-2: the first
// 16). An absent tensor has size 0 in the layout.
inline constexpr int kNumParamTensors = 17;
[[nodiscard]] std::string_view param_tensor_name(ParamTensor t);

// How a tensor starts (init_parameters): GPT-2's normal(0, 0.02), the same scaled by
// 1/sqrt(2L) for the projections onto the residual stream, ones (norm gains) or zeros (biases).
enum class TensorInit { Normal, ResidualNormal, Ones, Zeros };

// One parameter tensor as the configuration generates it: what the layout, the optimizers and the
// initialisation read instead of naming tensors. The shape is one layer's for per-layer tensors
// (stacked [L][rows][cols] in the flat buffer); a vector has rows 1.
struct TensorSpec {
    ParamTensor id;
    std::size_t rows = 1, cols = 0;
    bool per_layer = false;
    bool decayed = false;  // AdamW's decoupled weight decay applies (the 2-D matrices)
    TensorInit init = TensorInit::Zeros;
    // Muon's: empty where AdamW updates the tensor (embeddings, head, gains, biases); for a hidden
    // matrix, the rows of each block orthogonalised apart (the fused Q, K and V: three blocks;
    // SwiGLU's fused gate and up: two), summing to rows.
    std::vector<std::size_t> muon_blocks;
    [[nodiscard]] std::size_t per_layer_size() const { return rows * cols; }
};
// The model's tensors in the flat buffer's order, generated from the configuration: the one place
// that says which tensors a configuration has, their shapes and how each is treated.
[[nodiscard]] std::vector<TensorSpec> tensor_table(const ModelConfig& config);

// Where each tensor lives in the flat buffer (the same layout serves parameters, gradients and
// optimizer moments), laid out from tensor_table in its order. Per-layer tensors are stacked
// [L][...].
class ParameterLayout {
  public:
    explicit ParameterLayout(const ModelConfig& config);

    [[nodiscard]] std::size_t total() const { return total_; }
    [[nodiscard]] std::size_t size(ParamTensor t) const { return sizes_[index(t)]; }
    [[nodiscard]] std::size_t offset(ParamTensor t) const { return offsets_[index(t)]; }
    // The tensors in layout order, as tensor_table made them.
    [[nodiscard]] std::span<const TensorSpec> specs() const { return specs_; }
    // Whether the configuration has tensor t (an absent one has size 0).
    [[nodiscard]] bool has(ParamTensor t) const { return positions_[index(t)] < specs_.size(); }
    // t's spec; t must be present (has(t)).
    [[nodiscard]] const TensorSpec& spec(ParamTensor t) const {
        return specs_.at(positions_[index(t)]);
    }
    // Whether AdamW's decoupled weight decay applies (the 2-D matrices only).
    [[nodiscard]] bool decays(ParamTensor t) const { return has(t) && spec(t).decayed; }

    template <typename T>
    [[nodiscard]] std::span<T> tensor(std::span<T> flat, ParamTensor t) const {
        return flat.subspan(offset(t), size(t));
    }
    // Layer l's slice of a per-layer tensor.
    template <typename T>
    [[nodiscard]] std::span<T> layer(std::span<T> flat, ParamTensor t, int l) const {
        const std::size_t per_layer = size(t) / static_cast<std::size_t>(num_layers_);
        return flat.subspan(offset(t) + per_layer * static_cast<std::size_t>(l), per_layer);
    }

  private:
    static constexpr std::size_t index(ParamTensor t) { return static_cast<std::size_t>(t); }
    std::vector<TensorSpec> specs_;
    std::array<std::size_t, kNumParamTensors> positions_{};  // of each tensor in specs_
    std::array<std::size_t, kNumParamTensors> sizes_{};
    std::array<std::size_t, kNumParamTensors> offsets_{};
    std::size_t total_ = 0;
    int num_layers_ = 0;
};

// How the matrix products of training and validation run: fp32 throughout, or bf16 operands with
// fp32 accumulation (everything else, and the master weights, gradients and moments, stay fp32).
enum class Precision { Fp32, Bf16 };
[[nodiscard]] std::string_view precision_name(Precision p);

// How much backward recomputes instead of reading stored activations (--recompute). Every level
// gives bitwise the same losses and gradients.
//   cheap   LayerNorm outputs and GELU's output are recomputed (one scratch each, not one per
//           layer); attention keeps one log-sum-exp per row instead of its probabilities.
//   layers  only each layer's input is stored: backward runs the layer's forward again into one
//           layer's worth of buffers before its backward.
enum class Recompute { Cheap, Layers };
[[nodiscard]] std::string_view recompute_name(Recompute r);

// A model replica: shape plus parameters. Workers only ever see `weights()` (const). In bf16
// precision `params_bf16` is the rounded copy of `params` (same layout) the products read; whoever
// changes `params` refreshes it (AdamW does so in its own pass, anything else with
// set_precision).
struct Model {
    ModelConfig config;
    ParameterLayout layout;
    AlignedBuffer<float> params;
    Precision precision = Precision::Fp32;
    AlignedBuffer<Bf16> params_bf16;  // empty in fp32
    // LoRA fine-tuning: the adapter the products add (model/lora.hpp); the base weights are then
    // frozen and only the adapter trains. Null: no adapter.
    std::shared_ptr<LoraAdapter> lora;
    // A frozen bf16 base (set_bf16_frozen_base): the layer matrices exist only in
    // params_bf16; their range of params is released (reads as zero) and must not be read.
    bool layer_matrices_bf16_only = false;
    std::size_t released_fp32_bytes = 0;  // what that released of params

    explicit Model(const ModelConfig& c) : config(c), layout(c), params(layout.total()) {}
    [[nodiscard]] std::span<const float> weights() const { return params.span(); }
    // The bf16 twin of a pointer into params (bf16 precision only).
    [[nodiscard]] const Bf16* bf16_twin(const float* weight) const {
        return params_bf16.data() + (weight - params.data());
    }
};

// Sets the precision; for bf16 (re)fills params_bf16 from params. Call it again whenever params
// change outside AdamW (a load, a broadcast).
void set_precision(Model& model, Precision precision);

// The per-layer matrices (qkvw, attprojw, fcw, fcprojw): about 95% of GPT-2's larger models.
inline constexpr std::array<ParamTensor, 4> kLayerMatrices = {
    ParamTensor::qkvw, ParamTensor::attprojw, ParamTensor::fcw, ParamTensor::fcprojw};
[[nodiscard]] constexpr bool is_layer_matrix(ParamTensor t) {
    return t == ParamTensor::qkvw || t == ParamTensor::attprojw || t == ParamTensor::fcw ||
           t == ParamTensor::fcprojw;
}

// How set_bf16_frozen_base treats the fp32 layer matrices: hand their pages back to the kernel,
// or (tests) overwrite them with NaN so that any reader left on them shows.
enum class Fp32Release { Discard, PoisonForTests };

// set_precision(model, Bf16) for a base that never changes again (LoRA with --lora-base bf16):
// from now on the layer matrices are read from params_bf16 only. Each layer's matrix is rounded
// into the twin and the whole memory pages of its fp32 copy inside params are handed back at once,
// so the two copies of the matrices are never resident together (the embeddings, LayerNorms and
// biases keep both). set_precision refuses such a model afterwards. Returns the bytes released.
std::size_t set_bf16_frozen_base(Model& model, Fp32Release how = Fp32Release::Discard);
// What set_bf16_frozen_base hands back from a page-aligned parameter buffer of `layout`
// (the memory plan's figure).
[[nodiscard]] std::size_t releasable_fp32_bytes(const ParameterLayout& layout);

class ThreadPool;

// A layer's twelve tensors, ln1w .. fcprojb in layout (and LayerView) order: the i-th of them.
inline constexpr int kLayerTensors = 12;
[[nodiscard]] constexpr ParamTensor layer_tensor(int i) {
    return static_cast<ParamTensor>(static_cast<int>(ParamTensor::ln1w) + i);
}

// Pointers to layer l's twelve tensors inside a flat buffer laid out as `layout`: F = const float
// for weights, float for gradients. Forward/backward and the KV-cache generator share it.
template <typename F>
struct LayerView {
    F *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw,
        *fcprojb;
};

// A tensor the configuration does not have (a bias, a norm's gain) is null.
template <typename F>
[[nodiscard]] LayerView<F> layer_view(const ParameterLayout& layout, std::span<F> flat, int l) {
    const auto at = [&](ParamTensor t) -> F* {
        return layout.has(t) ? layout.layer(flat, t, l).data() : nullptr;
    };
    return LayerView<F>{at(ParamTensor::ln1w), at(ParamTensor::ln1b),     at(ParamTensor::qkvw),
                        at(ParamTensor::qkvb), at(ParamTensor::attprojw), at(ParamTensor::attprojb),
                        at(ParamTensor::ln2w), at(ParamTensor::ln2b),     at(ParamTensor::fcw),
                        at(ParamTensor::fcb),  at(ParamTensor::fcprojw),  at(ParamTensor::fcprojb)};
}

// What bounds a model's context, for messages: its position embeddings' rows, or with rotary
// positions the context it was made for.
[[nodiscard]] inline const char* block_size_meaning(const ModelConfig& c) {
    return c.arch.positions == PositionKind::Learned ? "its position embeddings"
                                                     : "the context it was made for";
}

// The tensor the LM head multiplies by: its own where untied, else wte.
[[nodiscard]] inline ParamTensor head_tensor(const ParameterLayout& layout) {
    return layout.has(ParamTensor::lmheadw) ? ParamTensor::lmheadw : ParamTensor::wte;
}
// Tensor t of `flat` (weights or gradients), or null where the configuration has none.
template <typename F>
[[nodiscard]] F* tensor_or_null(const ParameterLayout& layout, std::span<F> flat, ParamTensor t) {
    return layout.has(t) ? layout.tensor(flat, t).data() : nullptr;
}

// GPT-2's initialisation: N(0, 0.02) for embeddings and matrices, residual output projections
// scaled by 1/sqrt(2L), biases 0, LayerNorm weights 1. Padded wte rows are zero. Deterministic in
// `seed` and independent of the thread count; spread over `pool`'s workers when given.
void init_parameters(Model& model, std::uint64_t seed, ThreadPool* pool = nullptr);

// Named model shapes (gpt2-124M, ...). Throws InputError for an unknown name.
[[nodiscard]] ModelConfig preset_config(std::string_view name, int vocab_size);
// The presets' names, in the order --help lists them.
[[nodiscard]] std::vector<std::string> preset_names();
// Whether `name` is one of GPT-2's own presets (gpt2-124M ... gpt2-1558M), whose vocabulary is
// GPT-2's tokenizer's; the others (d6, char-small) are shapes for any tokenizer.
[[nodiscard]] bool is_gpt2_preset(std::string_view name);

// FLOPs of one forward+backward over one token with a context of T (for MFU): 6 per
// multiply-accumulate'd parameter plus attention's score and value products.
[[nodiscard]] double training_flops_per_token(const ModelConfig& config, int seq_len);

}  // namespace gpt2
