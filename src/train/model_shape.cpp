#include "train/model_shape.hpp"

#include <spdlog/spdlog.h>

#include <array>
#include <string>
#include <tuple>

#include "core/error.hpp"
#include "formats/resume_state.hpp"
#include "parallel/model_broadcast.hpp"

namespace gpt2 {

namespace {

// Shape flags given alongside weights must agree with them: the shape comes from the weights.
void check_shape_flags(const TrainOptions& o, const ModelConfig& loaded,
                       const std::string& source) {
    const auto refuse = [&](const std::string& flag, const std::string& what) {
        throw UsageError(flag + " contradicts " + source + ", whose model is " + what + " (" +
                         describe(loaded) + "); the shape comes from the weights: drop the flag");
    };
    if (o.was_given("model")) {
        // The preset as the flags given with it override it (--model d6 --n-layer 2).
        ModelConfig preset = preset_config(o.model.preset, loaded.vocab_size);
        if (o.was_given("n-layer")) preset.num_layers = o.model.num_layers;
        if (o.was_given("n-head")) preset.num_heads = o.model.num_heads;
        if (o.was_given("n-embd")) preset.channels = o.model.channels;
        preset.arch = with_fields(preset.arch, o.model.arch, "--arch");
        if (preset.num_layers != loaded.num_layers || preset.num_heads != loaded.num_heads ||
            preset.channels != loaded.channels || preset.arch != loaded.arch) {
            refuse("--model " + o.model.preset, "another shape");
        }
    }
    if (o.was_given("arch") && with_fields(loaded.arch, o.model.arch, "--arch") != loaded.arch) {
        refuse("--arch " + o.model.arch, "another architecture");
    }
    const std::array<std::tuple<const char*, int, int>, 4> dims = {{
        {"n-layer", o.model.num_layers, loaded.num_layers},
        {"n-head", o.model.num_heads, loaded.num_heads},
        {"n-embd", o.model.channels, loaded.channels},
        {"block-size", o.model.block_size, loaded.max_seq_len},
    }};
    for (const auto& [flag, value, actual] : dims) {
        if (o.was_given(flag) && value != actual) {
            refuse("--" + std::string(flag) + " " + std::to_string(value),
                   std::string(flag) + " " + std::to_string(actual));
        }
    }
}

}  // namespace

void check_flags_against_start(const TrainOptions& o, const StartPoint& start) {
    if (!start.model) {
        // Fresh after --resume auto found nothing: the flags' shape, as validate_train_options
        // checks it when no weights are named.
        const ModelConfig requested = requested_model(o, 1);
        if (requested.max_seq_len < o.batch.seq_len) {
            throw UsageError("--seq-len " + std::to_string(o.batch.seq_len) +
                             " exceeds the block size " + std::to_string(requested.max_seq_len) +
                             " of --model " + o.model.preset + " (" +
                             block_size_meaning(requested) +
                             "): give a shorter --seq-len, or a "
                             "--block-size of at least " +
                             std::to_string(o.batch.seq_len));
        }
        return;
    }
    const ModelConfig& loaded = start.model->model.config;
    check_shape_flags(o, loaded, start.source);
    if (loaded.max_seq_len < o.batch.seq_len) {
        throw UsageError("--seq-len " + std::to_string(o.batch.seq_len) +
                         " exceeds the block size " + std::to_string(loaded.max_seq_len) + " of " +
                         start.source + " (" + block_size_meaning(loaded) +
                         "): give a --seq-len of at most " + std::to_string(loaded.max_seq_len));
    }
    if (start.state_file.empty()) return;
    // Resuming counts the data position in sequences of the checkpoint's length (run_plan refuses
    // another one too, but only after the corpus is read and the model built).
    const std::optional<std::int32_t> resumed = read_state_seq_len(start.state_file);
    if (resumed && *resumed != o.batch.seq_len) {
        throw UsageError("--seq-len " + std::to_string(o.batch.seq_len) +
                         " differs from the sequence length " + std::to_string(*resumed) + " of " +
                         start.source + " (a resumed run keeps it): give --seq-len " +
                         std::to_string(*resumed));
    }
}

// Rank 0 decides the shape (from the weights, or from the flags) and every rank agrees.
ModelConfig agree_on_model(const TrainOptions& o, const Communicator& comm, const StartPoint& start,
                           const Tokenizer& tokenizer) {
    const int vocab = tokenizer.vocab_size();
    ModelConfig decided{};
    if (comm.is_root()) {
        if (start.model) {
            const ModelConfig& loaded = start.model->model.config;
            if (loaded.vocab_size != vocab) {
                throw UsageError(start.source + ": the model's vocabulary (" +
                                 std::to_string(loaded.vocab_size) + ") is not the " +
                                 std::string(tokenizer_kind_name(tokenizer.kind())) +
                                 " tokenizer's (" + std::to_string(vocab) +
                                 "): these weights cannot be trained with it");
            }
            spdlog::info("{}: model {}, tokenizer {} (vocab {})", start.source, describe(loaded),
                         tokenizer_kind_name(tokenizer.kind()), vocab);
            decided = loaded;
        } else {
            const ModelConfig requested = requested_model(o, vocab);
            if (!o.model.preset.empty()) {
                std::string overrides;
                for (const char* flag : {"n-layer", "n-head", "n-embd", "block-size", "arch"}) {
                    if (o.was_given(flag)) overrides += std::string(" --") + flag;
                }
                if (!overrides.empty()) {
                    spdlog::info("model: preset {} with{} given explicitly", o.model.preset,
                                 overrides);
                }
            }
            decided = requested;
        }
    }
    const ModelConfig config = broadcast_config(comm, decided);
    validate_config(config, "model");
    if (config.max_seq_len <
        o.batch.seq_len) {  // checked before the corpus was read; kept as a guard
        throw UsageError("--seq-len " + std::to_string(o.batch.seq_len) + " exceeds --block-size " +
                         std::to_string(config.max_seq_len));
    }
    return config;
}

}  // namespace gpt2
