// GPT-2's tensor table and initialisation: the layout the table generates is llm.c's (order and
// sizes written out here from GPT-2's shapes), the right distribution per tensor, zero padded
// vocabulary rows, and the same values for the same seed whatever the number of threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "model/model.hpp"
#include "threads/thread_pool.hpp"

namespace gpt2 {
namespace {

const ModelConfig kConfig{64, 1000, 1024, 3, 4, 128};

struct Moments {
    double mean = 0.0, std = 0.0;
};
Moments moments(std::span<const float> x) {
    double sum = 0.0, sq = 0.0;
    for (float v : x) {
        sum += v;
        sq += static_cast<double>(v) * v;
    }
    const double n = static_cast<double>(x.size());
    return {sum / n, std::sqrt(sq / n - (sum / n) * (sum / n))};
}

TEST(ModelLayout, TheTableLaysOutLlmcsOrderAndDecaysTheMatrices) {
    const ParameterLayout layout(kConfig);
    const std::size_t L = 3, C = 128, Vp = 1024, maxT = 64;
    // llm.c's fill_in_parameter_sizes, in its order.
    constexpr int kGpt2Tensors = 16;
    const std::size_t sizes[kGpt2Tensors] = {
        Vp * C, maxT * C, L * C,         L * C,     L * 3 * C * C, L * 3 * C, L * C * C, L * C,
        L * C,  L * C,    L * 4 * C * C, L * 4 * C, L * 4 * C * C, L * C,     C,         C};
    std::size_t offset = 0;
    ASSERT_EQ(layout.specs().size(), static_cast<std::size_t>(kGpt2Tensors));
    for (int i = 0; i < kGpt2Tensors; ++i) {
        const auto t = static_cast<ParamTensor>(i);
        EXPECT_EQ(layout.specs()[static_cast<std::size_t>(i)].id, t);
        EXPECT_TRUE(layout.has(t));
        EXPECT_EQ(layout.offset(t), offset) << param_tensor_name(t);
        EXPECT_EQ(layout.size(t), sizes[i]) << param_tensor_name(t);
        offset += sizes[i];
        const bool matrix = t == ParamTensor::wte || t == ParamTensor::wpe ||
                            t == ParamTensor::qkvw || t == ParamTensor::attprojw ||
                            t == ParamTensor::fcw || t == ParamTensor::fcprojw;
        EXPECT_EQ(layout.decays(t), matrix) << param_tensor_name(t);
    }
    EXPECT_EQ(layout.total(), offset);
    // GPT-2's head is wte: no tensor of its own.
    EXPECT_FALSE(layout.has(ParamTensor::lmheadw));
    EXPECT_EQ(layout.size(ParamTensor::lmheadw), 0u);
}

TEST(ModelInit, DistributionsMatchGpt2) {
    Model model(kConfig);
    init_parameters(model, 42);
    const std::span<const float> p = model.params.span();
    const double residual = 0.02 / std::sqrt(2.0 * kConfig.num_layers);
    for (const TensorSpec& spec : model.layout.specs()) {
        const ParamTensor t = spec.id;
        std::span<const float> x = model.layout.tensor(p, t);
        if (t == ParamTensor::wte)
            x = x.first(static_cast<std::size_t>(kConfig.vocab_size) * kConfig.channels);
        const Moments m = moments(x);
        if (model.layout.decays(t)) {
            const double expected =
                (t == ParamTensor::attprojw || t == ParamTensor::fcprojw) ? residual : 0.02;
            EXPECT_NEAR(m.std, expected, 0.03 * expected) << param_tensor_name(t);
            EXPECT_NEAR(m.mean, 0.0, 0.05 * expected) << param_tensor_name(t);
        } else if (t == ParamTensor::ln1w || t == ParamTensor::ln2w || t == ParamTensor::lnfw) {
            EXPECT_EQ(m.mean, 1.0) << param_tensor_name(t);
            EXPECT_EQ(m.std, 0.0) << param_tensor_name(t);
        } else {
            EXPECT_EQ(m.mean, 0.0) << param_tensor_name(t);
            EXPECT_EQ(m.std, 0.0) << param_tensor_name(t);
        }
    }
    // Neighbouring values are independent (each Box-Muller pair feeds two elements).
    const std::span<const float> w = model.layout.tensor(p, ParamTensor::fcw);
    double corr = 0.0;
    for (std::size_t k = 0; k + 1 < w.size(); k += 2)
        corr += static_cast<double>(w[k]) * w[k + 1];
    EXPECT_NEAR(corr / (w.size() / 2) / (0.02 * 0.02), 0.0, 0.02);
    const std::span<const float> wte = model.layout.tensor(p, ParamTensor::wte);
    for (std::size_t k = static_cast<std::size_t>(kConfig.vocab_size) * kConfig.channels;
         k < wte.size(); ++k) {
        ASSERT_EQ(wte[k], 0.0f) << "padded row element " << k;
    }
}

TEST(ModelInit, SameSeedSameValuesWhateverTheThreadCount) {
    Model serial(kConfig), threaded(kConfig), other_seed(kConfig);
    init_parameters(serial, 7);
    ThreadPool pool(3);
    init_parameters(threaded, 7, &pool);
    init_parameters(other_seed, 8, &pool);
    const std::size_t bytes = serial.params.size() * sizeof(float);
    EXPECT_EQ(std::memcmp(serial.params.data(), threaded.params.data(), bytes), 0);
    EXPECT_NE(std::memcmp(serial.params.data(), other_seed.params.data(), bytes), 0);
}

}  // namespace
}  // namespace gpt2
