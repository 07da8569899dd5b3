// Document masking in attention (train_gpt2 --attention-within-documents): where documents begin
// in a window, that a packed document's results do not depend on the one before it (forward,
// backward, recompute), and that any split of a step over workers trains alike.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "core/random.hpp"
#include "data/windows.hpp"
#include "model/forward_backward.hpp"
#include "model/model.hpp"
#include "ops/attention.hpp"
#include "optim/adamw.hpp"
#include "parallel/allreduce.hpp"
#include "parallel/comm.hpp"
#include "test_support.hpp"
#include "train/step.hpp"

namespace gpt2 {
namespace {

const ModelConfig kConfig{32, 97, 128, 2, 4, 32};
constexpr std::int32_t kEot = 96;  // the token that begins each document in these tests

// A document begins at each start token (its first token) and at each sequence's first token.
TEST(DocumentFirstKeys, ADocumentBeginsAtEachStartTokenAndAtEachSequencesStart) {
    const std::vector<std::int32_t> tokens = {5, kEot, 3, 4, kEot, kEot, 7,   // sequence 0
                                              3, 4,    5, 6, kEot, 1,    2};  // sequence 1
    std::vector<std::int32_t> first(tokens.size(), -1);
    document_first_keys(first, tokens, 2, 7, kEot);
    const std::vector<std::int32_t> expected = {0, 1, 1, 1, 4, 5, 5,  //
                                                0, 0, 0, 0, 4, 4, 4};
    EXPECT_EQ(first, expected);
}

// One window of T tokens (T + 1 with the last target): document 1 in [0, split), then the start
// token, then document 2; `shift` changes every token of document 1 (by adding to it).
std::vector<std::int32_t> packed_window(int T, int split, std::int32_t shift) {
    Rng rng(4242);
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(T) + 1);
    for (auto& t : tokens)
        t = static_cast<std::int32_t>(rng.below(kEot));
    for (int t = 0; t < split; ++t) {
        auto& token = tokens[static_cast<std::size_t>(t)];
        token = (token + shift) % kEot;
    }
    tokens[static_cast<std::size_t>(split)] = kEot;
    return tokens;
}

struct WindowResults {
    std::vector<float> hidden;  // the final LayerNorm's output (the logits are a product of it)
    std::vector<float> losses;  // per token
    std::vector<float> gradient;
};

// Forward (the hidden state and the per-token losses) and the gradient of the loss on the second
// document's targets only (the first's ignored), at a recompute level, with or without masking.
WindowResults run_window(const Model& model, const std::vector<std::int32_t>& tokens, int split,
                         Recompute recompute, bool masked) {
    const int T = static_cast<int>(tokens.size()) - 1;
    const std::span<const std::int32_t> all(tokens);
    std::vector<std::int32_t> targets(all.begin() + 1, all.end());
    ThreadLocalTrainingContext ctx(kConfig, 1, T, Precision::Fp32, recompute);
    TokenBatch batch{all.first(static_cast<std::size_t>(T)), targets, 1, T};
    if (masked) batch.document_start = kEot;
    WindowResults r;
    const double loss = forward_loss(model, ctx, batch);
    EXPECT_GT(loss, 0.0);
    const auto N = static_cast<std::size_t>(T);
    r.hidden.assign(ctx.acts.lnf, ctx.acts.lnf + N * kConfig.channels);
    r.losses.assign(ctx.acts.losses, ctx.acts.losses + N);
    // The targets of positions before the start token are document 1's tokens (and, at split - 1,
    // the start token, whose prediction needs document 1): ignored.
    std::fill(targets.begin(), targets.begin() + split, kIgnoredTarget);
    r.gradient.assign(model.layout.total(), 0.0f);
    (void)forward_backward(model, ctx, batch, 1.0f, r.gradient);
    return r;
}

template <typename T>
std::vector<T> from(const std::vector<T>& v, std::size_t begin) {
    return std::vector<T>(v.begin() + static_cast<long>(begin), v.end());
}

class PackedDocuments : public ::testing::TestWithParam<Recompute> {};

// Every token of the first document changed: with masking the second document's hidden states,
// losses and the gradient of its loss are bitwise the same; without it they change (so the test
// can fail).
TEST_P(PackedDocuments, TheSecondDocumentDoesNotSeeTheFirst) {
    const int T = 32, split = 13;  // the second document starts mid-window
    Model model(kConfig);
    init_parameters(model, 7);
    const std::vector<std::int32_t> a = packed_window(T, split, 0), b = packed_window(T, split, 5);
    const auto second = static_cast<std::size_t>(split);
    const auto C = static_cast<std::size_t>(kConfig.channels);
    {
        const WindowResults ra = run_window(model, a, split, GetParam(), true);
        const WindowResults rb = run_window(model, b, split, GetParam(), true);
        EXPECT_EQ(from(ra.hidden, second * C), from(rb.hidden, second * C));
        EXPECT_EQ(from(ra.losses, second), from(rb.losses, second));
        EXPECT_EQ(ra.gradient, rb.gradient);
        EXPECT_NE(ra.hidden, rb.hidden) << "the first document's tokens changed nothing";
    }
    const WindowResults ua = run_window(model, a, split, GetParam(), false);
    const WindowResults ub = run_window(model, b, split, GetParam(), false);
    EXPECT_NE(from(ua.hidden, second * C), from(ub.hidden, second * C));
    EXPECT_NE(from(ua.losses, second), from(ub.losses, second));
    EXPECT_NE(ua.gradient, ub.gradient);
}

INSTANTIATE_TEST_SUITE_P(Recompute, PackedDocuments,
                         ::testing::Values(Recompute::Cheap, Recompute::Layers),
                         [](const auto& info) {
                             return info.param == Recompute::Cheap ? "cheap" : "layers";
                         });

// Ten steps with document masking on random tokens where about one in eight begins a document,
// with W workers and micro-batches of B sequences: the losses and the final weights.
struct TrainResult {
    std::vector<double> losses;
    std::vector<float> params;
};

TrainResult train_ten_steps(int workers, int B, bool masked) {
    const int T = 32;
    Model model(kConfig);
    init_parameters(model, 7);
    AdamW optimizer(model.layout.total());
    WorkerGroup group(kConfig, workers, B, T, false, Precision::Fp32, Recompute::Layers);
    const Communicator comm = Communicator::single_process();
    AllreduceExchange exchange(comm, model.layout.total(), 0);
    Rng rng(99);
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(B) * T + 1);
    TrainResult result;
    for (int step = 0; step < 10; ++step) {
        for (auto& t : tokens)
            t = rng.below(8) == 0 ? kEot : static_cast<std::int32_t>(rng.below(kEot));
        const std::span<const std::int32_t> all(tokens);
        StepBatch batch{all.first(tokens.size() - 1), all.subspan(1), 1, B};
        if (masked) batch.document_start = kEot;
        const StepRules rules{AdamWHyper{1e-3f, 0.9f, 0.95f, 1e-5f, 0.1f}, 1.0f};
        const StepMetrics m =
            train_step(TrainState{model, optimizer, group, exchange}, batch, rules);
        EXPECT_FALSE(m.skipped);
        result.losses.push_back(m.loss);
    }
    result.params.assign(model.params.data(), model.params.data() + model.params.size());
    return result;
}

TEST(DocumentMaskingWorkers, TwoAndThreeWorkersTrainAsOne) {
    const TrainResult one = train_ten_steps(1, 4, true);
    for (const int workers : {2, 3}) {
        const TrainResult several = train_ten_steps(workers, 4, true);
        ASSERT_EQ(several.losses.size(), one.losses.size());
        for (std::size_t i = 0; i < one.losses.size(); ++i)
            EXPECT_NEAR(several.losses[i], one.losses[i], 1e-5 * one.losses[i])
                << workers << " workers, step " << i;
        EXPECT_TRUE(test::same_training(kConfig, several.params, one.params, 1e-5, 1e-2))
            << workers << " workers";
    }
    // The workers did mask: unmasked training differs from the first step on.
    const TrainResult unmasked = train_ten_steps(2, 4, false);
    EXPECT_GT(std::abs(unmasked.losses[0] - one.losses[0]), 1e-5 * one.losses[0]);
}

}  // namespace
}  // namespace gpt2
