// The block of the families after GPT-2 against PyTorch: tests/data/llama_reference.bin
// (dev/make_reference.py) holds two models written from their definitions in float64 (Hugging
// Face's Llama: RMSNorm, rotary positions, grouped-query attention, SwiGLU, no biases, an untied
// head; ReLU^2 with RMSNorm without gains and a tied head; modded-nanogpt's block of 2024-11-03:
// QK-norm and the embeddings' norm, ReLU^2, no gains, an untied head), their weights in our layout,
// a batch, the loss and every gradient. Ours on 1, 2 and 3 workers: within the GPT-2 reference
// test's bounds (tests/test_model_reference.cpp: the loss to 1e-5, each gradient element to 1e-3
// relative plus 2e-6), and --recompute layers the same bits as cheap.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "model/forward_backward.hpp"
#include "model/model.hpp"
#include "parallel/worker_group.hpp"
#include "reference_fixture.hpp"
#include "test_support.hpp"

namespace gpt2 {
namespace {

class LlamaReference : public ::testing::TestWithParam<std::string> {
  protected:
    void SetUp() override {
        fixture_ =
            test::ReferenceFixture::load(std::string(GPT2_TEST_DATA_DIR) + "/llama_reference.bin");
        const auto& c = at("config").i32;  // T, V, Vp, L, NH, C, KV heads, hidden, B, T
        Architecture a;
        a.norm = NormKind::RmsNorm;
        a.positions = PositionKind::Rotary;
        a.rope_theta = at("theta").f32[0];
        a.norm_eps = at("theta").f32[1];
        a.biases = false;
        a.mlp_hidden = c[7];
        a.kv_heads = c[6] == c[4] ? 0 : c[6];
        if (GetParam() == "llama") {
            a.mlp = MlpKind::SwiGlu;
            a.tied_head = false;
        } else {
            a.mlp = MlpKind::ReluSquared;
            a.norm_gains = false;
        }
        if (GetParam() == "speedrun") {  // modded-nanogpt's block of 2024-11-03
            a.tied_head = false;
            a.qk_norm = true;
            a.embedding_norm = true;
        }
        config_ = ModelConfig(c[0], c[1], c[2], c[3], c[4], c[5], a);
        B_ = c[8];
        T_ = c[9];
    }
    [[nodiscard]] const test::FixtureTensor& at(const std::string& name) const {
        return fixture_.at(GetParam() + "." + name);
    }
    [[nodiscard]] Model model() const {
        Model m(config_);
        const auto& params = at("params").f32;
        EXPECT_EQ(params.size(), m.layout.total()) << "the table's layout is PyTorch's";
        std::copy(params.begin(), params.end(), m.params.data());
        return m;
    }
    // The loss and the gradient of the fixture's batch on `workers` workers.
    [[nodiscard]] std::pair<double, std::vector<float>> gradient(int workers,
                                                                 Recompute recompute) const {
        const Model m = model();
        WorkerGroup group(config_, workers, B_, T_, false, Precision::Fp32, recompute);
        const StepBatch batch{at("inputs").i32, at("targets").i32, 1, B_};
        const GradientPass pass = accumulate_gradients(m, group, batch);
        double loss = 0.0;
        for (const double l : pass.sequence_losses)
            loss += l;
        const std::span<const float> g = group.gradient();
        return {loss / (B_ * T_), std::vector<float>(g.begin(), g.end())};
    }
    test::ReferenceFixture fixture_;
    ModelConfig config_;
    int B_ = 0, T_ = 0;
};

TEST_P(LlamaReference, LossAndEveryGradientMatchPyTorchOnAnySplit) {
    const std::span<const float> expected = at("grads").f32;
    const ParameterLayout layout(config_);
    for (const int workers : {1, 2, 3}) {
        const auto [loss, cheap] = gradient(workers, Recompute::Cheap);
        EXPECT_NEAR(loss, at("loss").f32[0], 1e-5) << workers << " workers";
        ASSERT_EQ(cheap.size(), expected.size());
        for (const TensorSpec& spec : layout.specs()) {
            EXPECT_TRUE(test::all_close(layout.tensor(std::span<const float>(cheap), spec.id),
                                        layout.tensor(expected, spec.id), 1e-3, 2e-6))
                << "gradient of " << param_tensor_name(spec.id) << ", " << workers << " workers";
        }
        // Every recompute level gives the same bits (the split itself may change the last bits:
        // docs/training.md, "Which figures are the same bits").
        const auto [layers_loss, layers] = gradient(workers, Recompute::Layers);
        EXPECT_EQ(layers_loss, loss) << workers << " workers";
        EXPECT_EQ(std::memcmp(layers.data(), cheap.data(), cheap.size() * sizeof(float)), 0)
            << workers << " workers: --recompute layers changed the gradient";
    }
}

INSTANTIATE_TEST_SUITE_P(Models, LlamaReference, ::testing::Values("llama", "relu2", "speedrun"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gpt2
