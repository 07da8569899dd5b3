// The KV-cache generator against the training forward pass and the recompute oracle: step and
// prefill logits at every position with 1-3 workers, long prompts in chunks, the sliding window,
// reproducible sampling, and bad tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/utf8.hpp"
#include "formats/checkpoint.hpp"
#include "formats/resume_state.hpp"
#include "model/forward_backward.hpp"
#include "model/generate.hpp"
#include "model/kv_cache.hpp"
#include "ops/gemm.hpp"
#include "optim/adamw.hpp"
#include "process_support.hpp"
#include "test_support.hpp"
#include "tokenizer/tokenizer.hpp"

#include "random_model.hpp"

namespace gpt2 {
namespace {

using test::random_model;
using test::small_config;
using test::training_logits;

std::vector<std::int32_t> random_tokens(int count, int vocab, std::uint64_t seed) {
    Rng rng(seed);
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(count));
    for (auto& t : tokens)
        t = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(vocab)));
    return tokens;
}

std::span<const float> row(const std::vector<float>& logits, const ModelConfig& c, int t) {
    return std::span<const float>(logits).subspan(static_cast<std::size_t>(t) * c.padded_vocab_size,
                                                  static_cast<std::size_t>(c.vocab_size));
}

// Logits within 1e-4 of the reference, relative to the row's largest magnitude.
::testing::AssertionResult logits_close(std::span<const float> actual,
                                        std::span<const float> expected) {
    float peak = 0.0f;
    for (const float e : expected)
        peak = std::max(peak, std::abs(e));
    return test::all_close(actual, expected, 1e-4, 1e-4 * peak);
}

class KvCacheThreads : public ::testing::TestWithParam<int> {};

TEST_P(KvCacheThreads, StepLogitsMatchTrainingForwardAtEveryPosition) {
    const ModelConfig c = small_config();
    const auto model = random_model(c, 11);
    const auto tokens = random_tokens(c.max_seq_len, c.vocab_size, 5);
    const std::vector<float> expected = training_logits(*model, tokens);
    ThreadPool pool(GetParam());
    KvCacheSession session(*model, pool);

    std::span<const float> logits = session.prefill(std::span(tokens).first(1));
    ASSERT_EQ(logits.size(), static_cast<std::size_t>(c.vocab_size));
    EXPECT_TRUE(logits_close(logits, row(expected, c, 0))) << "position 0";
    for (int t = 1; t < c.max_seq_len; ++t) {
        logits = session.step(tokens[static_cast<std::size_t>(t)]);
        EXPECT_TRUE(logits_close(logits, row(expected, c, t))) << "position " << t;
    }
    EXPECT_EQ(session.length(), c.max_seq_len);
    EXPECT_EQ(session.slides(), 0);
}

TEST_P(KvCacheThreads, PrefillLogitsMatchTrainingForward) {
    const ModelConfig c = small_config();
    const auto model = random_model(c, 12);
    const auto tokens = random_tokens(c.max_seq_len, c.vocab_size, 6);
    const std::vector<float> expected = training_logits(*model, tokens);
    ThreadPool pool(GetParam());
    KvCacheSession session(*model, pool);
    for (const int n : {1, 2, 7, 31, 32}) {
        const auto logits = session.prefill(std::span(tokens).first(static_cast<std::size_t>(n)));
        EXPECT_TRUE(logits_close(logits, row(expected, c, n - 1))) << "prefill of " << n;
        EXPECT_EQ(session.length(), n);
    }
    // A prefill followed by steps continues the same sequence.
    (void)session.prefill(std::span(tokens).first(20));
    for (int t = 20; t < 25; ++t) {
        const auto logits = session.step(tokens[static_cast<std::size_t>(t)]);
        EXPECT_TRUE(logits_close(logits, row(expected, c, t))) << "step at " << t;
    }
}

// The Llama family's block (RMSNorm, rotary positions, grouped-query attention, SwiGLU, no
// biases, an untied head), a ReLU^2 variant without gains and the speedrun's (QK-norm and the
// embeddings' norm too): decoding, prompts included, follows the training forward at every
// position, as GPT-2's does.
TEST_P(KvCacheThreads, TheLlamaFamilysDecodingMatchesTrainingForward) {
    for (const std::string variant : {"swiglu", "relu2", "speedrun"}) {
        ModelConfig c = small_config();
        c.arch.norm = NormKind::RmsNorm;
        c.arch.positions = PositionKind::Rotary;
        c.arch.biases = false;
        if (variant == "swiglu") {
            c.arch.mlp = MlpKind::SwiGlu;
            c.arch.mlp_hidden = 96;
            c.arch.kv_heads = 2;
            c.arch.tied_head = false;
        } else {
            c.arch.mlp = MlpKind::ReluSquared;
            c.arch.norm_gains = false;
            c.arch.rope_theta = 500.0f;
        }
        if (variant == "speedrun") {
            c.arch.qk_norm = true;
            c.arch.embedding_norm = true;
            c.arch.tied_head = false;
            c.arch.kv_heads = 2;
        }
        const auto model = random_model(c, 13);
        const auto tokens = random_tokens(c.max_seq_len, c.vocab_size, 7);
        const std::vector<float> expected = training_logits(*model, tokens);
        ThreadPool pool(GetParam());
        KvCacheSession session(*model, pool);
        std::span<const float> logits = session.prefill(std::span(tokens).first(5));
        EXPECT_TRUE(logits_close(logits, row(expected, c, 4))) << "prefill of 5, " << variant;
        for (int t = 5; t < c.max_seq_len; ++t) {
            logits = session.step(tokens[static_cast<std::size_t>(t)]);
            EXPECT_TRUE(logits_close(logits, row(expected, c, t)))
                << "position " << t << ", " << variant;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Workers, KvCacheThreads, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                             return "workers" + std::to_string(info.param);
                         });

TEST(KvCache, LongPromptIsEncodedInChunks) {
    // maxT above the session's 256-row chunk, so a prompt takes two forwards (the second of one
    // row a token's forward).
    ModelConfig c = small_config(300);
    c.num_layers = 1;
    c.channels = 32;
    c.num_heads = 2;
    const auto model = random_model(c, 13);
    const auto tokens = random_tokens(300, c.vocab_size, 7);
    const std::vector<float> expected = training_logits(*model, tokens);
    ThreadPool pool(2);
    KvCacheSession session(*model, pool);
    for (const int n : {256, 257, 258, 300}) {
        const auto logits = session.prefill(std::span(tokens).first(static_cast<std::size_t>(n)));
        EXPECT_TRUE(logits_close(logits, row(expected, c, n - 1))) << "prefill of " << n;
    }
    (void)session.prefill(std::span(tokens).first(260));
    const auto logits = session.step(tokens[260]);
    EXPECT_TRUE(logits_close(logits, row(expected, c, 260)));
}

// A model whose context holds a 1000-token prompt and small enough that the training forward over
// it takes milliseconds.
ModelConfig long_context_config() {
    ModelConfig c = small_config(1024);
    c.channels = 32;
    c.num_heads = 2;
    return c;
}

// Prompts around the edges of the prompt forward's blocks (attention's 64 query rows, the 16-row
// padding of compact products) and over several chunks (1000 tokens: the later chunks' rotary
// positions start past 0), then steps after one; GPT-2 and the Llama family's block (SwiGLU,
// grouped-query heads, QK-norm, an untied head), whose prompts run as the same products.
TEST_P(KvCacheThreads, PrefillOfLongPromptsMatchesTrainingForward) {
    for (const bool llama : {false, true}) {
        ModelConfig c = long_context_config();
        if (llama) {
            c.arch.norm = NormKind::RmsNorm;
            c.arch.positions = PositionKind::Rotary;
            c.arch.biases = false;
            c.arch.mlp = MlpKind::SwiGlu;
            c.arch.mlp_hidden = 48;
            c.arch.kv_heads = 1;
            c.arch.qk_norm = true;
            c.arch.tied_head = false;
        }
        const auto model = random_model(c, 14);
        const auto tokens = random_tokens(1002, c.vocab_size, 9);
        const std::vector<float> expected = training_logits(*model, tokens);
        ThreadPool pool(GetParam());
        KvCacheSession session(*model, pool);
        const std::string which = llama ? "llama, " : "gpt2, ";
        for (const int n : {1, 63, 64, 65, 1000}) {
            const auto logits =
                session.prefill(std::span(tokens).first(static_cast<std::size_t>(n)));
            EXPECT_TRUE(logits_close(logits, row(expected, c, n - 1)))
                << which << "prefill of " << n;
            EXPECT_EQ(session.length(), n);
        }
        for (int t = 1000; t < 1002; ++t) {
            const auto logits = session.step(tokens[static_cast<std::size_t>(t)]);
            EXPECT_TRUE(logits_close(logits, row(expected, c, t))) << which << "step at " << t;
        }
    }
}

// Greedy decoding with the recompute oracle under the session's window policy: the context before
// each prediction is what the session holds (grows to maxT, then drops to the last `keep`).
std::vector<std::int32_t> oracle_greedy(const Model& model, std::vector<std::int32_t> tokens,
                                        int count, int keep) {
    const auto maxT = static_cast<std::size_t>(model.config.max_seq_len);
    std::size_t start = tokens.size() > maxT ? tokens.size() - maxT : 0;
    Rng rng(0);
    const SamplingParams greedy{0.0f, 0, 1.0f};
    for (int n = 0; n < count; ++n) {
        if (tokens.size() - start > maxT) start = tokens.size() - static_cast<std::size_t>(keep);
        std::vector<std::int32_t> window(tokens.begin() + static_cast<std::ptrdiff_t>(start),
                                         tokens.end());
        generate_recompute(model, window, 1, greedy, rng);
        tokens.push_back(window.back());
    }
    return tokens;
}

TEST_P(KvCacheThreads, GreedyEqualsRecomputeThroughTheSlidingWindow) {
    const ModelConfig c = small_config();
    const auto model = random_model(c, 21);
    ThreadPool pool(GetParam());
    const SamplingParams greedy{0.0f, 0, 1.0f};
    for (const int prompt_length : {3, 40}) {
        const auto prompt = random_tokens(prompt_length, c.vocab_size, 8);
        // Default policy (keep maxT/2): the oracle applies the same window.
        KvCacheSession session(*model, pool);
        std::vector<std::int32_t> ours = prompt;
        Rng rng(1);
        const GenerationStats stats = generate_kv(session, ours, 60, greedy, rng);
        EXPECT_EQ(stats.generated_tokens, 60);
        EXPECT_GE(stats.slides, 2) << "the test must exercise the sliding window";
        EXPECT_EQ(ours, oracle_greedy(*model, prompt, 60, session.slide_keep()))
            << "prompt of " << prompt_length;

        // keep = maxT: every prediction sees the last maxT tokens, exactly generate_recompute.
        KvCacheSession full(*model, pool, c.max_seq_len);
        std::vector<std::int32_t> ours_full = prompt;
        (void)generate_kv(full, ours_full, 60, greedy, rng);
        std::vector<std::int32_t> reference = prompt;
        generate_recompute(*model, reference, 60, greedy, rng);
        EXPECT_EQ(ours_full, reference) << "prompt of " << prompt_length;
        // Not a degenerate sequence that any implementation would reproduce.
        std::vector<std::int32_t> distinct(reference.begin() + prompt_length, reference.end());
        std::sort(distinct.begin(), distinct.end());
        EXPECT_GT(std::unique(distinct.begin(), distinct.end()) - distinct.begin(), 5);
    }
}

TEST(KvCache, SamplingIsReproducibleAndSeedDependent) {
    const ModelConfig c = small_config();
    const auto model = random_model(c, 31, 2.0f);
    ThreadPool pool(2);
    KvCacheSession session(*model, pool);
    const auto sample = [&](std::uint64_t seed, SamplingParams params) {
        std::vector<std::int32_t> tokens = {1, 2, 3};
        Rng rng = Rng::derived(seed, 0);
        std::vector<std::int32_t> seen;
        (void)generate_kv(session, tokens, 50, params, rng, [&](std::int32_t t) {
            seen.push_back(t);
            return TokenVerdict::Continue;
        });
        EXPECT_EQ(seen, std::vector<std::int32_t>(tokens.begin() + 3, tokens.end()));
        return tokens;
    };
    const SamplingParams plain{1.0f, 0, 1.0f};
    EXPECT_EQ(sample(7, plain), sample(7, plain));
    EXPECT_NE(sample(7, plain), sample(8, plain));
    const SamplingParams nucleus{0.8f, 20, 0.9f};
    EXPECT_EQ(sample(3, nucleus), sample(3, nucleus));
    EXPECT_NE(sample(3, nucleus), sample(4, nucleus));
    // top-k = 1 is greedy whatever the temperature and seed.
    EXPECT_EQ(sample(5, SamplingParams{1.0f, 1, 1.0f}), sample(9, SamplingParams{0.0f, 0, 1.0f}));
}

TEST(KvCache, VocabLimitAndBadTokens) {
    const ModelConfig c = small_config();
    const auto model = random_model(c, 41);
    ThreadPool pool(1);
    KvCacheSession session(*model, pool);
    std::vector<std::int32_t> tokens = {4};
    Rng rng(2);
    (void)generate_kv(session, tokens, 40, SamplingParams{}, rng, {}, 10);
    for (const auto t : tokens)
        EXPECT_LT(t, 10);
    const std::vector<std::int32_t> bad = {1, c.vocab_size};
    EXPECT_THROW((void)session.prefill(bad), InputError);
    EXPECT_THROW((void)session.step(-1), InputError);
    EXPECT_THROW(KvCacheSession(*model, pool, c.max_seq_len + 1), std::invalid_argument);
}

}  // namespace
}  // namespace gpt2
