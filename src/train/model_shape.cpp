#include "train/model_shape.hpp"

#include <spdlog/spdlog.h>

#include <array>
#include <string>
#include <tuple>

#include "core/error.hpp"
#include "parallel/model_broadcast.hpp"

namespace gpt2 {

namespace {

// The shape the flags ask for: a preset, with any explicitly given dimension overriding it, or
// the dimensions alone.
ModelConfig requested_model(const TrainOptions& o, int vocab_size) {
    if (o.model.empty()) {
        const int maxT = o.block_size > 0 ? o.block_size : o.seq_len;
        return ModelConfig{maxT, vocab_size, pad_vocab(vocab_size), o.n_layer, o.n_head, o.n_embd};
    }
    ModelConfig c = preset_config(o.model, vocab_size);
    if (o.was_given("n-layer")) c.num_layers = o.n_layer;
    if (o.was_given("n-head")) c.num_heads = o.n_head;
    if (o.was_given("n-embd")) c.channels = o.n_embd;
    if (o.block_size > 0) c.max_seq_len = o.block_size;
    return c;
}

// Shape flags given alongside weights must agree with them: the shape comes from the weights.
void check_shape_flags(const TrainOptions& o, const ModelConfig& loaded,
                       const std::string& source) {
    const auto refuse = [&](const std::string& flag, const std::string& what) {
        throw UsageError(flag + " contradicts " + source + ", whose model is " + what + " (" +
                         describe(loaded) + "); the shape comes from the weights: drop the flag");
    };
    if (o.was_given("model")) {
        const ModelConfig preset = preset_config(o.model, loaded.vocab_size);
        if (preset.num_layers != loaded.num_layers || preset.num_heads != loaded.num_heads ||
            preset.channels != loaded.channels) {
            refuse("--model " + o.model, "another shape");
        }
    }
    const std::array<std::tuple<const char*, int, int>, 4> dims = {{
        {"n-layer", o.n_layer, loaded.num_layers},
        {"n-head", o.n_head, loaded.num_heads},
        {"n-embd", o.n_embd, loaded.channels},
        {"block-size", o.block_size, loaded.max_seq_len},
    }};
    for (const auto& [flag, value, actual] : dims) {
        if (o.was_given(flag) && value != actual) {
            refuse("--" + std::string(flag) + " " + std::to_string(value),
                   std::string(flag) + " " + std::to_string(actual));
        }
    }
}

}  // namespace

// Rank 0 decides the shape (from the weights, or from the flags) and every rank agrees.
ModelConfig agree_on_model(const TrainOptions& o, const Communicator& comm, const StartPoint& start,
                           const Tokenizer& tokenizer) {
    const int vocab = tokenizer.vocab_size();
    ModelConfig decided{};
    if (comm.is_root()) {
        if (start.model) {
            const ModelConfig& loaded = start.model->model.config;
            check_shape_flags(o, loaded, start.source);
            if (loaded.vocab_size != vocab) {
                throw UsageError(start.source + ": the model's vocabulary (" +
                                 std::to_string(loaded.vocab_size) + ") is not the " +
                                 std::string(tokenizer_kind_name(tokenizer.kind())) +
                                 " tokenizer's (" + std::to_string(vocab) +
                                 "): these weights cannot be trained with it");
            }
            if (loaded.max_seq_len < o.seq_len) {
                throw InputError("--seq-len " + std::to_string(o.seq_len) +
                                 " exceeds the block size " + std::to_string(loaded.max_seq_len) +
                                 " of " + start.source);
            }
            spdlog::info("{}: model {}, tokenizer {} (vocab {})", start.source, describe(loaded),
                         tokenizer_kind_name(tokenizer.kind()), vocab);
            decided = loaded;
        } else {
            const ModelConfig requested = requested_model(o, vocab);
            if (!o.model.empty()) {
                std::string overrides;
                for (const char* flag : {"n-layer", "n-head", "n-embd", "block-size"}) {
                    if (o.was_given(flag)) overrides += std::string(" --") + flag;
                }
                if (!overrides.empty()) {
                    spdlog::info("model: preset {} with{} given explicitly", o.model, overrides);
                }
            }
            decided = requested;
        }
    }
    const ModelConfig config = broadcast_config(comm, decided);
    validate_config(config, "model");
    if (config.max_seq_len < o.seq_len) {
        throw InputError("--seq-len " + std::to_string(o.seq_len) + " exceeds --block-size " +
                         std::to_string(config.max_seq_len));
    }
    return config;
}

}  // namespace gpt2
