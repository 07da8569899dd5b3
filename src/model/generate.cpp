#include "model/generate.hpp"

#include <algorithm>

#include "model/forward_backward.hpp"
#include "model/lora.hpp"
#include "ops/gemm.hpp"

namespace gpt2 {

void generate_recompute(const Model& model, std::vector<std::int32_t>& tokens, int count,
                        const SamplingParams& params, Rng& rng,
                        const std::function<void(std::int32_t)>& on_token) {
    const ModelConfig& c = model.config;
    const int maxT = c.max_seq_len;
    // The run's precision; forward only, so one layer's activations suffice.
    ThreadLocalTrainingContext ctx(c, 1, maxT, model.precision, Recompute::Layers);
    if (model.lora != nullptr)
        ctx.reserve_adapter(model.lora->config.rank);  // a LoRA run's samples
    std::vector<float> logits(static_cast<std::size_t>(c.padded_vocab_size));
    std::vector<std::pair<float, int>> scratch;
    const float* wte = model.layout.tensor(model.weights(), ParamTensor::wte).data();
    for (int n = 0; n < count; ++n) {
        const int T = std::min<int>(maxT, static_cast<int>(tokens.size()));
        const std::span<const std::int32_t> window(tokens.data() + tokens.size() - T,
                                                   static_cast<std::size_t>(T));
        forward_hidden(model, ctx, TokenBatch{window, window, 1, T});
        gemm_nt(1, c.padded_vocab_size, c.channels, 1.0f,
                ctx.acts.lnf + static_cast<long>(T - 1) * c.channels, c.channels, wte, c.channels,
                0.0f, logits.data(), c.padded_vocab_size);
        const int next = sample_token(
            std::span<const float>(logits.data(), static_cast<std::size_t>(c.vocab_size)), params,
            rng, scratch);
        tokens.push_back(next);
        if (on_token) on_token(next);
    }
}

}  // namespace gpt2
