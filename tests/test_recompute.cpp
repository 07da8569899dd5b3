// Recomputation (--recompute): every level gives bitwise the same losses, gradients and training
// as the default, with 1-4 workers and 2 ranks, and resumes bitwise across levels; the memory
// plan is what the contexts allocate; a run that would not fit is refused with one clear line and
// leaves the checkpoints alone.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/file_io.hpp"
#include "core/random.hpp"
#include "formats/checkpoint.hpp"
#include "formats/resume_state.hpp"
#include "model/forward_backward.hpp"
#include "optim/adamw.hpp"
#include "parallel/allreduce.hpp"
#include "parallel/comm.hpp"
#include "process_support.hpp"
#include "train/log_lines.hpp"
#include "train/memory_plan.hpp"
#include "train/step.hpp"

namespace gpt2 {
namespace {

using test::run_command;
using test::ScratchDir;

// maxT 80 and T 70: two attention panels, the second partial.
const ModelConfig kConfig{80, 97, 128, 3, 2, 32};
constexpr int kT = 70;

std::vector<std::int32_t> random_tokens(std::size_t n, std::uint64_t seed) {
    Rng rng(seed);
    std::vector<std::int32_t> tokens(n);
    for (auto& t : tokens)
        t = static_cast<std::int32_t>(rng.below(97));
    return tokens;
}

Model make_model(Precision precision) {
    Model model(kConfig);
    init_parameters(model, 3);
    set_precision(model, precision);
    return model;
}

bool bitwise_equal(std::span<const float> a, std::span<const float> b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

class RecomputeLevels : public ::testing::TestWithParam<Precision> {};

TEST_P(RecomputeLevels, LayersGivesBitwiseTheLossAndGradientOfCheap) {
    const Model model = make_model(GetParam());
    const int B = 2;
    const std::vector<std::int32_t> tokens = random_tokens(static_cast<std::size_t>(B) * kT + 1, 5);
    const std::span<const std::int32_t> all(tokens);
    const TokenBatch batch{all.first(tokens.size() - 1), all.subspan(1), B, kT};
    std::vector<double> losses, validation;
    std::vector<std::vector<float>> gradients;
    for (const Recompute level : {Recompute::Cheap, Recompute::Layers}) {
        ThreadLocalTrainingContext ctx(kConfig, B, kT, GetParam(), level);
        std::vector<float> gradient(model.layout.total(), 0.0f);
        losses.push_back(forward_backward(model, ctx, batch, 1.0f / (B * kT), gradient));
        gradients.push_back(gradient);
        validation.push_back(forward_loss(model, ctx, batch));
    }
    EXPECT_EQ(losses[0], losses[1]);
    EXPECT_EQ(validation[0], validation[1]);
    EXPECT_TRUE(bitwise_equal(gradients[0], gradients[1]));
    // The gradient is a real one (not all zero, so the comparison means something).
    double norm = 0.0;
    for (const float g : gradients[0])
        norm += static_cast<double>(g) * g;
    EXPECT_GT(norm, 1e-6);
}

// The plan the start-up check uses is what a context allocates, and layers keeps one layer.
TEST_P(RecomputeLevels, TheMemoryPlanIsWhatTheContextAllocates) {
    for (const Recompute level : {Recompute::Cheap, Recompute::Layers}) {
        const ThreadLocalTrainingContext ctx(kConfig, 3, kT, GetParam(), level);
        EXPECT_EQ(ctx.activation_bytes(), context_bytes(kConfig, 3, kT, GetParam(), level));
        EXPECT_EQ(ctx.stored_layers(), level == Recompute::Layers ? 1 : kConfig.num_layers);
    }
    EXPECT_LT(context_bytes(kConfig, 3, kT, GetParam(), Recompute::Layers),
              context_bytes(kConfig, 3, kT, GetParam(), Recompute::Cheap));
}

INSTANTIATE_TEST_SUITE_P(Precisions, RecomputeLevels,
                         ::testing::Values(Precision::Fp32, Precision::Bf16),
                         [](const ::testing::TestParamInfo<Precision>& info) {
                             return std::string(precision_name(info.param));
                         });

// Five optimizer steps with W workers: losses and final weights.
std::pair<std::vector<double>, std::vector<float>> train_five_steps(int workers,
                                                                    Recompute recompute) {
    const int B = 4;
    Model model = make_model(Precision::Fp32);
    AdamW optimizer(model.layout.total());
    WorkerGroup group(kConfig, workers, B, kT, false, Precision::Fp32, recompute);
    const Communicator comm = Communicator::single_process();
    AllreduceExchange exchange(comm, model.layout.total(), 0);
    std::vector<double> losses;
    for (int step = 0; step < 5; ++step) {
        const std::vector<std::int32_t> tokens =
            random_tokens(static_cast<std::size_t>(B) * kT + 1, 100 + static_cast<unsigned>(step));
        const std::span<const std::int32_t> all(tokens);
        const StepBatch batch{all.first(tokens.size() - 1), all.subspan(1), 1, B};
        const StepRules rules{AdamWHyper{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f}, 1.0f};
        losses.push_back(
            train_step(TrainState{model, optimizer, group, exchange}, batch, rules).loss);
    }
    return {losses,
            std::vector<float>(model.params.data(), model.params.data() + model.params.size())};
}

TEST(RecomputeTraining, LayersTrainsBitwiseAsCheapWithOneToFourWorkers) {
    for (int workers = 1; workers <= 4; ++workers) {
        const auto cheap = train_five_steps(workers, Recompute::Cheap);
        const auto layers = train_five_steps(workers, Recompute::Layers);
        EXPECT_EQ(cheap.first, layers.first) << workers << " workers";
        EXPECT_TRUE(bitwise_equal(cheap.second, layers.second)) << workers << " workers";
    }
}

// ---- the program ---------------------------------------------------------------------------

std::string train_command(const ScratchDir& dir, const std::string& out, int ranks,
                          const std::string& extra) {
    const std::string launcher = ranks > 0 ? test::mpiexec(ranks) : "";
    return launcher + test::build_path("train_gpt2") + test::small_model(48) +
           " --batch-size 4 --lr 1e-3"
           " --warmup-steps 3 --val-every 5 --val-tokens 384 --sample-every 0 --checkpoint-every 0"
           " --seed 11 --data " +
           (dir / "corpus.txt") + " --out-dir " + (dir / out) + " --metrics-file " +
           (dir / (out + ".jsonl")) + " " + extra;
}

std::vector<double> logged_losses(const std::string& metrics_file) {
    std::vector<double> losses;
    for (const nlohmann::json& record : test::metrics_records(metrics_file, "")) {
        if (record["type"] == "train") losses.push_back(record["loss"].get<double>());
        if (record["type"] == "val") losses.push_back(record["val_loss"].get<double>());
    }
    return losses;
}

// Two ranks of two workers: --recompute layers trains bitwise as cheap, and a cheap run stopped
// at step 10 resumes under --recompute layers bitwise as the straight run.
TEST(RecomputeProgram, TwoRanksTrainAndResumeBitwiseAcrossLevels) {
    const ScratchDir dir("gpt2-recompute-ranks");
    test::write_corpus(dir.path() / "corpus.txt", 40000);
    const std::string flags = "--max-steps 20 --threads 2";
    const auto cheap = run_command(train_command(dir, "cheap", 2, flags + " --recompute cheap"));
    ASSERT_EQ(cheap.exit_code, 0) << cheap.output;
    EXPECT_NE(cheap.output.find("--recompute cheap)"), std::string::npos) << cheap.output;
    const auto layers = run_command(train_command(dir, "layers", 2, flags + " --recompute layers"));
    ASSERT_EQ(layers.exit_code, 0) << layers.output;
    EXPECT_NE(layers.output.find("--recompute layers)"), std::string::npos) << layers.output;
    const auto first = run_command(
        train_command(dir, "resumed", 2, flags + " --recompute cheap --stop-at-step 10"));
    ASSERT_EQ(first.exit_code, 0) << first.output;
    const auto second =
        run_command(train_command(dir, "resumed", 2, flags + " --recompute layers --resume auto"));
    ASSERT_EQ(second.exit_code, 0) << second.output;

    const std::vector<double> reference = logged_losses(dir / "cheap.jsonl");
    ASSERT_EQ(reference.size(), 25u);  // 20 steps, validations at 0, 5, ..., 20
    EXPECT_EQ(logged_losses(dir / "layers.jsonl"), reference);
    EXPECT_EQ(logged_losses(dir / "resumed.jsonl"), reference);
    const auto params = [&](const std::string& out) {
        return load_checkpoint(model_path(dir / out, 20)).model.params;
    };
    const auto a = params("cheap"), b = params("layers"), c = params("resumed");
    EXPECT_TRUE(bitwise_equal(a.span(), b.span()));
    EXPECT_TRUE(bitwise_equal(a.span(), c.span()));
}

// What the program's first run below needs, at each level (one rank, 2 workers, batch 4).
std::size_t rank_need(Recompute level) {
    const ModelConfig config{48, 65, 128, 2, 2, 32};  // char tokenizer over the test corpus
    return memory_need(config, 2, 4, 48, Precision::Fp32, level, 1).total();
}

// Too little memory: one clear line naming the flags that fit, exit 1, and the checkpoint that
// --resume auto would have continued is untouched; with room for layers only, auto picks layers.
TEST(RecomputeProgram, TooLittleMemoryIsRefusedBeforeAnythingRunsAndAutoRecomputesLayers) {
    const ScratchDir dir("gpt2-recompute-memory");
    test::write_corpus(dir.path() / "corpus.txt", 40000);
    const auto first = run_command(train_command(dir, "out", 0, "--max-steps 5 --threads 2"));
    ASSERT_EQ(first.exit_code, 0) << first.output;
    const std::filesystem::path checkpoint = model_path(dir / "out", 5);
    const std::vector<std::uint8_t> before = read_file_bytes(checkpoint);
    ASSERT_FALSE(before.empty());

    const std::size_t cheap = rank_need(Recompute::Cheap);
    const std::size_t layers = rank_need(Recompute::Layers);
    ASSERT_LT(layers, cheap);
    const std::string between = std::to_string((cheap + layers) / 2);
    const auto refused = run_command(
        "GPT2_MEMORY_AVAILABLE=" + between + " " +
        train_command(dir, "out", 0, "--max-steps 10 --threads 2 --resume auto --recompute cheap"));
    EXPECT_EQ(refused.exit_code, 1) << refused.output;
    EXPECT_NE(refused.output.find("error: " + std::string(log_lines::kNotEnoughMemory)),
              std::string::npos)
        << refused.output;
    EXPECT_NE(refused.output.find("GPT2_MEMORY_AVAILABLE); would fit: --recompute layers"),
              std::string::npos)
        << refused.output;
    EXPECT_EQ(refused.output.find("step 6"), std::string::npos) << refused.output;
    EXPECT_EQ(read_file_bytes(checkpoint), before);
    EXPECT_FALSE(std::filesystem::exists(model_path(dir / "out", 10)));

    // Two ranks, nothing fits: one line (from one rank), a non-zero exit, no hang.
    const auto none = run_command("GPT2_MEMORY_AVAILABLE=1K " +
                                  train_command(dir, "two", 2, "--max-steps 10 --threads 1"));
    EXPECT_NE(none.exit_code, 0) << none.output;
    std::size_t count = 0;
    for (std::size_t at = none.output.find(log_lines::kNotEnoughMemory); at != std::string::npos;
         at = none.output.find(log_lines::kNotEnoughMemory, at + 1))
        ++count;
    EXPECT_EQ(count, 1u) << none.output;
    EXPECT_NE(none.output.find("nothing fits"), std::string::npos) << none.output;

    const auto automatic = run_command("GPT2_MEMORY_AVAILABLE=" + between + " " +
                                       train_command(dir, "auto", 0, "--max-steps 2 --threads 2"));
    EXPECT_EQ(automatic.exit_code, 0) << automatic.output;
    EXPECT_NE(automatic.output.find("--recompute layers chosen by auto"), std::string::npos)
        << automatic.output;
}

}  // namespace
}  // namespace gpt2
