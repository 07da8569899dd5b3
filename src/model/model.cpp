#include "model/model.hpp"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "core/error.hpp"
#include "core/random.hpp"
#include "threads/thread_pool.hpp"

namespace gpt2 {

int pad_vocab(int vocab_size, int multiple) {
    return (vocab_size + multiple - 1) / multiple * multiple;
}

void validate_config(const ModelConfig& c, std::string_view source) {
    const auto fail = [&](const std::string& what) {
        throw InputError(std::string(source) + ": " + what + " (model " + describe(c) + ")");
    };
    if (c.max_seq_len <= 0 || c.vocab_size <= 0 || c.num_layers <= 0 || c.num_heads <= 0 ||
        c.channels <= 0)
        fail("every model dimension must be positive");
    if (c.padded_vocab_size < c.vocab_size)
        fail("padded vocabulary is smaller than the vocabulary");
    if (c.channels % c.num_heads != 0) fail("channels must be divisible by the number of heads");
    // Bound each dimension first so the parameter count below cannot overflow.
    if (c.max_seq_len > (1 << 20) || c.padded_vocab_size > (1 << 24) || c.num_layers > 4096 ||
        c.channels > (1 << 16)) {
        fail("a model dimension is implausibly large");
    }
    const Architecture& a = c.arch;
    if (a.kv_heads < 0 || a.kv_heads > c.num_heads || c.num_heads % c.kv_heads() != 0) {
        fail("key/value heads must divide the number of heads");
    }
    if (a.mlp_hidden < 0 || a.mlp_hidden > (1 << 20))
        fail("the MLP's hidden width is out of range");
    if (!(a.norm_eps > 0.0f && a.norm_eps < 1.0f)) fail("the norm's epsilon must be in (0, 1)");
    if (a.positions == PositionKind::Rotary &&
        (c.head_size() % 2 != 0 || !(a.rope_theta > 1.0f) || !std::isfinite(a.rope_theta))) {
        fail("rotary positions need an even head size and a finite theta above 1");
    }
    if (a.norm == NormKind::LayerNorm && (!a.norm_gains || !a.biases || a.norm_eps != 1e-5f)) {
        fail("LayerNorm is GPT-2's: with a gain and a bias, epsilon 1e-5");
    }
    const double C = c.channels, L = c.num_layers, H = c.mlp_hidden();
    const double KV = static_cast<double>(c.kv_heads()) * c.head_size();
    const double heads = a.tied_head ? 1.0 : 2.0;
    const double params =
        (heads * static_cast<double>(c.padded_vocab_size) + c.max_seq_len) * C +
        L * (C * (C + 2 * KV) + C * C + (a.mlp == MlpKind::SwiGlu ? 3.0 : 2.0) * H * C + 13.0 * C) +
        2.0 * C;
    if (params > 4.0e10) fail("model too large");
}

ShapeInts to_shape_ints(const ModelConfig& c) {
    return {c.max_seq_len, c.vocab_size, c.padded_vocab_size,
            c.num_layers,  c.num_heads,  c.channels};
}

ConfigRecord to_config_record(const ModelConfig& c) {
    const Architecture& a = c.arch;
    const auto bits = [](float f) { return std::bit_cast<std::int32_t>(f); };
    return {kConfigRecordVersion,
            c.max_seq_len,
            c.vocab_size,
            c.padded_vocab_size,
            c.num_layers,
            c.num_heads,
            c.channels,
            static_cast<std::int32_t>(a.norm),
            a.norm_gains ? 1 : 0,
            bits(a.norm_eps),
            static_cast<std::int32_t>(a.positions),
            bits(a.rope_theta),
            static_cast<std::int32_t>(a.mlp),
            a.mlp_hidden,
            a.biases ? 1 : 0,
            a.tied_head ? 1 : 0,
            a.kv_heads,
            a.qk_norm ? 1 : 0,
            a.zero_init_projections ? 1 : 0,
            a.embedding_norm ? 1 : 0};
}

ConfigRecord config_record_of_bytes(std::span<const std::uint8_t> bytes, std::string_view source) {
    const std::size_t ints = bytes.size() / sizeof(std::int32_t);
    if (bytes.size() % sizeof(std::int32_t) != 0 ||
        (ints != kConfigRecordV1Ints && ints != std::tuple_size_v<ConfigRecord>)) {
        throw InputError(std::string(source) + ": configuration record of " +
                         std::to_string(bytes.size()) + " bytes (corrupt)");
    }
    ConfigRecord record{};  // a version-1 record's missing field: no norm on the embeddings
    std::memcpy(record.data(), bytes.data(), bytes.size());
    const std::int32_t version = ints == kConfigRecordV1Ints ? 1 : kConfigRecordVersion;
    if (record[0] != version) {
        throw InputError(std::string(source) + ": configuration record of " + std::to_string(ints) +
                         " integers says version " + std::to_string(record[0]) +
                         " (corrupt, or written by a newer build)");
    }
    record[0] = kConfigRecordVersion;  // read as the current version from here on
    return record;
}

ModelConfig from_config_record(const ConfigRecord& r, std::string_view source) {
    const auto fail = [&](const std::string& what) {
        throw InputError(std::string(source) + ": model configuration record: " + what);
    };
    if (r[0] != kConfigRecordVersion) {
        fail("version " + std::to_string(r[0]) + ", this build reads version " +
             std::to_string(kConfigRecordVersion) + " (written by a newer build?)");
    }
    const auto kind = [&](std::size_t i, int count, const char* what) {
        if (r[i] < 0 || r[i] >= count) fail(std::string(what) + " " + std::to_string(r[i]));
        return r[i];
    };
    const auto flag = [&](std::size_t i, const char* what) {
        if (r[i] != 0 && r[i] != 1) fail(std::string(what) + " " + std::to_string(r[i]));
        return r[i] == 1;
    };
    Architecture a;
    a.norm = static_cast<NormKind>(kind(7, 2, "norm"));
    a.norm_gains = flag(8, "norm gains");
    a.norm_eps = std::bit_cast<float>(r[9]);
    a.positions = static_cast<PositionKind>(kind(10, 2, "positions"));
    a.rope_theta = std::bit_cast<float>(r[11]);
    a.mlp = static_cast<MlpKind>(kind(12, 3, "MLP"));
    a.mlp_hidden = r[13];
    a.biases = flag(14, "biases");
    a.tied_head = flag(15, "tied head");
    a.kv_heads = r[16];
    a.qk_norm = flag(17, "QK-norm");
    a.zero_init_projections = flag(18, "zero-initialized projections");
    a.embedding_norm = flag(19, "normed embeddings");
    const ModelConfig config(r[1], r[2], r[3], r[4], r[5], r[6], a);
    validate_config(config, source);
    return config;
}

std::string describe(const ModelConfig& c) {
    std::ostringstream out;
    out << "L=" << c.num_layers << " H=" << c.num_heads << " C=" << c.channels
        << " V=" << c.vocab_size << " Vp=" << c.padded_vocab_size << " maxT=" << c.max_seq_len;
    if (!c.is_gpt2()) out << " (" << describe(c.arch) << ")";
    return out.str();
}

std::string_view param_tensor_name(ParamTensor t) {
    static constexpr std::array<std::string_view, kNumParamTensors> kNames = {
        "wte",  "wpe", "ln1w", "ln1b",    "qkvw",    "qkvb", "attprojw", "attprojb", "ln2w",
        "ln2b", "fcw", "fcb",  "fcprojw", "fcprojb", "lnfw", "lnfb",     "lmheadw"};
    return kNames[static_cast<std::size_t>(t)];
}

std::vector<TensorSpec> tensor_table(const ModelConfig& c) {
    const Architecture& a = c.arch;
    const auto C = static_cast<std::size_t>(c.channels);
    const auto Vp = static_cast<std::size_t>(c.padded_vocab_size);
    const auto maxT = static_cast<std::size_t>(c.max_seq_len);
    const auto KV = static_cast<std::size_t>(c.kv_heads() * c.head_size());  // K's (and V's) rows
    const auto H = static_cast<std::size_t>(c.mlp_hidden());
    const bool gated = a.mlp == MlpKind::SwiGlu;  // fcw holds the gate's rows, then up's
    const bool layer_norm = a.norm == NormKind::LayerNorm;
    const TensorInit projection =
        a.zero_init_projections ? TensorInit::Zeros : TensorInit::ResidualNormal;
    using enum ParamTensor;
    using enum TensorInit;
    std::vector<TensorSpec> table;
    // id, rows, cols, per layer, decayed, init, Muon's blocks; a norm's gain and bias exist as
    // the architecture says (LayerNorm: both; RMSNorm: a gain at most), as do the biases.
    const auto norm = [&](ParamTensor gain, ParamTensor bias, bool per_layer) {
        if (a.norm_gains) table.push_back({gain, 1, C, per_layer, false, Ones, {}});
        if (layer_norm && a.biases) table.push_back({bias, 1, C, per_layer, false, Zeros, {}});
    };
    const auto bias = [&](ParamTensor id, std::size_t n) {
        if (a.biases) table.push_back({id, 1, n, true, false, Zeros, {}});
    };
    table.push_back({wte, Vp, C, false, true, Normal, {}});  // token embedding (tied: the head)
    if (a.positions == PositionKind::Learned) {
        table.push_back({wpe, maxT, C, false, true, Normal, {}});  // learned positions
    }
    norm(ln1w, ln1b, true);
    table.push_back({qkvw, C + 2 * KV, C, true, true, Normal, {C, KV, KV}});  // Q, K, V fused
    bias(qkvb, C + 2 * KV);
    table.push_back({attprojw, C, C, true, true, projection, {C}});  // attention's projection
    bias(attprojb, C);
    norm(ln2w, ln2b, true);
    table.push_back({fcw, gated ? 2 * H : H, C, true, true, Normal,
                     gated ? std::vector<std::size_t>{H, H} : std::vector<std::size_t>{H}});
    bias(fcb, gated ? 2 * H : H);
    table.push_back({fcprojw, C, H, true, true, projection, {C}});  // MLP down-projection
    bias(fcprojb, C);
    norm(lnfw, lnfb, false);  // the final norm
    // An untied head starts at zero with the projections (modded-nanogpt's record of 2024-11-03).
    if (!a.tied_head) table.push_back({lmheadw, Vp, C, false, true, projection, {}});
    return table;
}

ParameterLayout::ParameterLayout(const ModelConfig& c)
    : specs_(tensor_table(c)), num_layers_(c.num_layers) {
    const auto L = static_cast<std::size_t>(c.num_layers);
    positions_.fill(specs_.size());  // absent until the table says otherwise
    std::size_t offset = 0;
    for (std::size_t i = 0; i < specs_.size(); ++i) {
        const TensorSpec& spec = specs_[i];
        const std::size_t t = index(spec.id);
        positions_[t] = i;
        sizes_[t] = spec.per_layer_size() * (spec.per_layer ? L : 1);
        offsets_[t] = offset;
        offset += sizes_[t];
    }
    total_ = offset;
    for (std::size_t t = 0; t < positions_.size(); ++t) {
        if (positions_[t] == specs_.size()) offsets_[t] = total_;  // absent: empty, at the end
    }
}

void init_parameters(Model& model, std::uint64_t seed, ThreadPool* pool) {
    const ModelConfig& c = model.config;
    const ParameterLayout& layout = model.layout;
    const std::span<float> flat = model.params.span();
    const float residual_std = 0.02f / std::sqrt(2.0f * static_cast<float>(c.num_layers));
    // Work in blocks, each drawn from its own derived stream: the values do not depend on how
    // the blocks are shared between threads.
    constexpr std::size_t kBlock = 1 << 16;
    struct Block {
        ParamTensor tensor;
        std::size_t begin, end;
    };
    std::vector<Block> blocks;
    for (int i = 0; i < kNumParamTensors; ++i) {
        const auto t = static_cast<ParamTensor>(i);
        for (std::size_t b = 0; b < layout.size(t); b += kBlock) {
            blocks.push_back(Block{t, b, std::min(layout.size(t), b + kBlock)});
        }
    }
    const auto fill = [&](const Block& block) {
        const std::span<float> tensor = layout.tensor(flat, block.tensor);
        float* out = tensor.data();
        const TensorInit init = layout.spec(block.tensor).init;
        if (init == TensorInit::Ones || init == TensorInit::Zeros) {
            std::fill(out + block.begin, out + block.end, init == TensorInit::Ones ? 1.0f : 0.0f);
            return;
        }
        const bool residual = init == TensorInit::ResidualNormal;
        const float std = residual ? residual_std : 0.02f;
        Rng rng =
            Rng::derived(seed, static_cast<std::uint64_t>(block.tensor), block.begin / kBlock);
        // Box-Muller, both outputs of each pair used.
        for (std::size_t k = block.begin; k < block.end; k += 2) {
            const float u1 = (static_cast<float>(rng.next_u64() >> 40) + 0.5f) * 0x1.0p-24f;
            const float u2 = static_cast<float>(rng.next_u64() >> 40) * 0x1.0p-24f;
            const float radius = std * std::sqrt(-2.0f * std::log(u1));
            const float angle = 6.2831853f * u2;
            out[k] = radius * std::cos(angle);
            if (k + 1 < block.end) out[k + 1] = radius * std::sin(angle);
        }
    };
    if (pool == nullptr) {
        for (const Block& block : blocks)
            fill(block);
    } else {
        pool->run([&](int w) {
            const Range mine = split_range(blocks.size(), w, pool->size());
            for (std::size_t i = mine.begin; i < mine.end; ++i)
                fill(blocks[i]);
        });
    }
    // Padded vocabulary rows stay zero so they never contribute to logits or gradients.
    const std::span<float> wte = layout.tensor(flat, ParamTensor::wte);
    const auto C = static_cast<std::size_t>(c.channels);
    std::fill(wte.begin() + static_cast<std::ptrdiff_t>(C * static_cast<std::size_t>(c.vocab_size)),
              wte.end(), 0.0f);
    const std::span<float> head = layout.tensor(flat, ParamTensor::lmheadw);  // untied only
    if (!head.empty()) {
        std::fill(
            head.begin() + static_cast<std::ptrdiff_t>(C * static_cast<std::size_t>(c.vocab_size)),
            head.end(), 0.0f);
    }
}

namespace {
struct Preset {
    std::string_view name;
    int L, NH, C, maxT;
    Architecture arch;
};
// The Llama family's block (Hugging Face's LlamaForCausalLM: RMSNorm, rotary positions, SwiGLU,
// no biases, grouped-query attention, the head tied as SmolLM2 ties it).
constexpr Architecture llama_block(int kv_heads, int hidden, float theta) {
    Architecture a;
    a.norm = NormKind::RmsNorm;
    a.positions = PositionKind::Rotary;
    a.rope_theta = theta;
    a.mlp = MlpKind::SwiGlu;
    a.mlp_hidden = hidden;
    a.biases = false;
    a.kv_heads = kv_heads;
    return a;
}
// modded-nanogpt's block at its record of 2024-11-03 ("untied embed and head", 10.8 minutes):
// RMSNorm without gains (torch's default eps, float32's epsilon) on the embeddings, before
// attention and the MLP, on each head of q and k, and before the head; rotary positions; ReLU^2;
// no biases; an untied head; the projections and the head initialized to zero.
constexpr Architecture speedrun_block() {
    Architecture a;
    a.norm = NormKind::RmsNorm;
    a.norm_gains = false;
    a.norm_eps = 1.1920929e-07f;
    a.positions = PositionKind::Rotary;
    a.mlp = MlpKind::ReluSquared;
    a.biases = false;
    a.tied_head = false;
    a.qk_norm = true;
    a.embedding_norm = true;
    a.zero_init_projections = true;
    return a;
}
constexpr std::array<Preset, 9> kPresets = {{
    {"gpt2-124M", 12, 12, 768, 1024, {}},
    {"gpt2-350M", 24, 16, 1024, 1024, {}},
    {"gpt2-774M", 36, 20, 1280, 1024, {}},
    {"gpt2-1558M", 48, 25, 1600, 1024, {}},
    {"d6", 6, 6, 384, 256, {}},
    {"char-small", 4, 4, 256, 256, {}},
    // SmolLM2-135M's shape (its config.json; 2048 positions of its 8192 are this preset's context).
    {"llama-135M", 30, 9, 576, 2048, llama_block(3, 1536, 100000.0f)},
    // A small one of the same block, for CPUs and tests.
    {"llama-tiny", 4, 4, 128, 256, llama_block(2, 352, 10000.0f)},
    // The record's 124M shape: 12 layers, 6 heads of 128, 768 channels, 1024 positions.
    {"speedrun", 12, 6, 768, 1024, speedrun_block()},
}};
}  // namespace

std::vector<std::string> preset_names() {
    std::vector<std::string> names;
    for (const Preset& p : kPresets)
        names.emplace_back(p.name);
    return names;
}

bool is_gpt2_preset(std::string_view name) {
    return name.starts_with("gpt2-") &&
           std::any_of(kPresets.begin(), kPresets.end(),
                       [name](const Preset& p) { return p.name == name; });
}

ModelConfig preset_config(std::string_view name, int vocab_size) {
    for (const Preset& p : kPresets) {
        if (p.name == name) {
            return ModelConfig{p.maxT, vocab_size, pad_vocab(vocab_size), p.L, p.NH, p.C, p.arch};
        }
    }
    std::string known;
    for (const Preset& p : kPresets)
        known += (known.empty() ? "" : ", ") + std::string(p.name);
    throw InputError("--model: unknown preset '" + std::string(name) + "' (known: " + known + ")");
}

double training_flops_per_token(const ModelConfig& c, int seq_len) {
    const double C = c.channels, L = c.num_layers, T = seq_len;
    double matmul_params = static_cast<double>(c.padded_vocab_size) * C;  // the head
    for (const TensorSpec& spec : tensor_table(c)) {
        if (spec.per_layer && spec.rows > 1) {
            matmul_params += L * static_cast<double>(spec.rows) * static_cast<double>(spec.cols);
        }
    }
    // Causal attention: QK^T and PV each 2*T*C flops per token forward (full, as computed).
    const double attention = L * 2.0 * 2.0 * T * C;
    return 3.0 * (2.0 * matmul_params + attention);
}

}  // namespace gpt2

namespace gpt2 {

std::string_view precision_name(Precision p) {
    return p == Precision::Bf16 ? "bf16" : "fp32";
}

std::string_view recompute_name(Recompute r) {
    return r == Recompute::Layers ? "layers" : "cheap";
}

void set_precision(Model& model, Precision precision) {
    if (model.layer_matrices_bf16_only) {
        // Its fp32 matrices are gone: a refill would round zeros into the weights the products
        // read.
        throw std::logic_error("set_precision: the model's fp32 layer matrices were released");
    }
    model.precision = precision;
    if (precision == Precision::Fp32) {
        model.params_bf16 = AlignedBuffer<Bf16>();
        return;
    }
    if (model.params_bf16.size() != model.params.size()) {
        model.params_bf16 = AlignedBuffer<Bf16>(model.params.size());
    }
    convert_to_bf16(model.params_bf16.data(), model.params.data(), model.params.size());
}

std::size_t set_bf16_frozen_base(Model& model, Fp32Release how) {
    const std::size_t P = model.params.size();
    model.precision = Precision::Bf16;
    if (model.params_bf16.size() != P) model.params_bf16 = AlignedBuffer<Bf16>(P);
    const ParameterLayout& layout = model.layout;
    for (int k = 0; k < kNumParamTensors; ++k) {
        const auto t = static_cast<ParamTensor>(k);
        if (is_layer_matrix(t)) continue;
        convert_to_bf16(model.params_bf16.data() + layout.offset(t),
                        model.params.data() + layout.offset(t), layout.size(t));
    }
    std::size_t released = 0;
    for (const ParamTensor t : kLayerMatrices) {
        const std::size_t per_layer =
            layout.size(t) / static_cast<std::size_t>(model.config.num_layers);
        for (int l = 0; l < model.config.num_layers; ++l) {
            const std::size_t begin = layout.offset(t) + per_layer * static_cast<std::size_t>(l);
            convert_to_bf16(model.params_bf16.data() + begin, model.params.data() + begin,
                            per_layer);
            if (how == Fp32Release::PoisonForTests) {
                std::fill_n(model.params.data() + begin, per_layer,
                            std::numeric_limits<float>::quiet_NaN());
            } else {
                // The tensor's layers so far: a page the previous layer shares with this one
                // goes too (pages already handed back cost nothing again).
                (void)model.params.discard(layout.offset(t),
                                           per_layer * static_cast<std::size_t>(l + 1));
            }
        }
        if (how == Fp32Release::Discard)
            released += model.params.discard(layout.offset(t), layout.size(t));
    }
    model.layer_matrices_bf16_only = true;
    model.released_fp32_bytes = released;
    return released;
}

std::size_t releasable_fp32_bytes(const ParameterLayout& layout) {
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    std::size_t bytes = 0;
    for (const ParamTensor t : kLayerMatrices) {
        const std::size_t begin = (layout.offset(t) * sizeof(float) + page - 1) / page * page;
        const std::size_t end = (layout.offset(t) + layout.size(t)) * sizeof(float) / page * page;
        if (end > begin) bytes += end - begin;
    }
    return bytes;
}

}  // namespace gpt2
