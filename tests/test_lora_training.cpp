// LoRA fine-tuning in train_gpt2: the replica's adapter, frozen base and no model gradient (in
// process), the same adapter for 1, 2 and 4 workers and 2 ranks, the merged checkpoint with its
// PEFT adapter beside it, --lora-from, LoRA on a loss mask, bitwise resume on the base from
// --init-from, and every refusal of the flags.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/file_io.hpp"
#include "data/multiple_choice.hpp"
#include "formats/checkpoint.hpp"
#include "formats/peft.hpp"
#include "formats/resume_state.hpp"
#include "model/lora.hpp"
#include "parallel/adapter_exchange.hpp"
#include "parallel/comm.hpp"
#include "process_support.hpp"
#include "scratch_files.hpp"
#include "train/replica.hpp"
#include "train/step.hpp"
#include "train/text_format.hpp"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;
using test::run_command;
using test::ScratchDir;

// ---- in process -------------------------------------------------------------------------------

TrainOptions small_lora_options(int threads, float lora_dropout,
                                Precision precision = Precision::Fp32) {
    TrainOptions o;
    o.compute.precision = precision;
    o.model.num_layers = 2;
    o.model.num_heads = 2;
    o.model.channels = 32;
    o.batch.batch_size = 4;
    o.batch.seq_len = 16;
    o.parallel.threads = threads;
    o.lora.rank = 4;
    o.lora.alpha = 8.0f;
    o.lora.dropout = lora_dropout;
    o.seed = 11;
    return o;
}

struct LoraSteps {
    std::vector<float> adapter;
    std::vector<double> losses;
};

// Three steps of the small model's LoRA replica with `threads` workers, one rank, on fixed tokens;
// checks on the way that the workers hold no model gradient and the base stays bitwise as built.
// `lora_dropout`: LoRA's input dropout in every step, as the training loop passes it.
LoraSteps train_lora_in_process(int threads, float lora_dropout = 0.0f,
                                Precision precision = Precision::Fp32) {
    const TrainOptions o = small_lora_options(threads, lora_dropout, precision);
    const Communicator comm = Communicator::single_process();
    const ModelConfig config{16, 50, 64, 2, 2, 32};
    StartPoint start;
    ExchangePlan plan = plan_exchange(o, comm);
    const std::unique_ptr<Replica> replica = build_replica(o, comm, config, start, plan);
    EXPECT_NE(replica->model.lora, nullptr);
    EXPECT_NE(dynamic_cast<AdapterExchange*>(replica->exchange.get()), nullptr);
    EXPECT_TRUE(replica->workers.gradient().empty());  // no model gradient
    for (int w = 0; w < replica->workers.size(); ++w)
        EXPECT_EQ(replica->workers.context(w).gradient_window.size(), 0u) << w;
    EXPECT_EQ(replica->optimizer->state.m.size(), replica->model.lora->layout.total());
    const std::vector<float> base(replica->model.params.span().begin(),
                                  replica->model.params.span().end());

    std::vector<std::int32_t> inputs(4 * 16), targets(4 * 16);
    LoraSteps out;
    for (int step = 0; step < 3; ++step) {
        for (std::size_t i = 0; i < inputs.size(); ++i) {
            inputs[i] = static_cast<std::int32_t>((i * 7 + static_cast<std::size_t>(step)) % 50);
            targets[i] = static_cast<std::int32_t>((i * 11 + 3) % 50);
        }
        StepBatch batch{inputs,
                        targets,
                        1,
                        4,
                        0,
                        1,
                        Dropout{0.0f, o.seed, static_cast<std::uint64_t>(step),
                                replica->model.lora->config.dropout}};
        const StepMetrics m = train_step(
            TrainState{replica->model, *replica->optimizer, replica->workers, *replica->exchange},
            batch, StepRules{AdamWHyper{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f}, 1.0f});
        EXPECT_FALSE(m.skipped);
        out.losses.push_back(m.loss);
    }
    const auto after = replica->model.params.span();
    EXPECT_TRUE(std::equal(base.begin(), base.end(), after.begin(), after.end()))
        << "the base weights changed";
    out.adapter.assign(replica->model.lora->params.span().begin(),
                       replica->model.lora->params.span().end());
    return out;
}

TEST(LoraReplica, FrozenBaseNoModelGradientAndTheSameAdapterForOneTwoAndFourWorkers) {
    const LoraSteps one = train_lora_in_process(1);
    double b_norm = 0.0;  // B starts at zero: training moved it
    for (const float x : one.adapter)
        b_norm += std::abs(x);
    ASSERT_GT(b_norm, 0.0);
    for (const int threads : {2, 4}) {
        const LoraSteps other = train_lora_in_process(threads);
        ASSERT_EQ(other.adapter.size(), one.adapter.size());
        for (std::size_t s = 0; s < one.losses.size(); ++s)
            EXPECT_NEAR(other.losses[s], one.losses[s], 1e-5 * one.losses[s]) << threads;
        for (std::size_t i = 0; i < one.adapter.size(); ++i)
            ASSERT_NEAR(other.adapter[i], one.adapter[i], 1e-5 * (1.0 + std::abs(one.adapter[i])))
                << threads << " workers, element " << i;
    }
}

// LoRA's input dropout draws its masks by sequence, not by worker: 1, 2 and 4 workers train the
// same adapter, which is not the adapter trained without it.
// Rank 0 trains the weights it loaded where they lie: the replica takes over the loaded model's
// buffer instead of copying it (a 1558M base from --init-from is never in memory twice), with
// LoRA and without.
TEST(LoraReplica, TheLoadedWeightsBecomeTheReplicasWithoutACopy) {
    for (const int lora_rank : {4, 0}) {
        TrainOptions o = small_lora_options(1, 0.0f);
        o.lora.rank = lora_rank;
        const Communicator comm = Communicator::single_process();
        const ModelConfig config{16, 50, 64, 2, 2, 32};
        StartPoint start;
        start.model = LoadedModel{Model(config), std::nullopt};
        init_parameters(start.model->model, 5);
        const float* loaded = start.model->model.params.data();
        const std::vector<float> weights(loaded, loaded + start.model->model.params.size());
        ExchangePlan plan = plan_exchange(o, comm);
        const std::unique_ptr<Replica> replica = build_replica(o, comm, config, start, plan);
        EXPECT_EQ(replica->model.params.data(), loaded) << "LoRA rank " << lora_rank;
        EXPECT_FALSE(start.model.has_value());
        const auto trained = replica->model.params.span();
        EXPECT_TRUE(std::equal(weights.begin(), weights.end(), trained.begin(), trained.end()));
        EXPECT_EQ(replica->model.lora != nullptr, lora_rank > 0);
    }
}

TEST(LoraReplica, InputDropoutTrainsTheSameAdapterForOneTwoAndFourWorkers) {
    const LoraSteps one = train_lora_in_process(1, 0.3f);
    const LoraSteps undropped = train_lora_in_process(1);
    ASSERT_EQ(undropped.adapter.size(), one.adapter.size());
    EXPECT_NE(undropped.adapter, one.adapter);
    EXPECT_NE(undropped.losses, one.losses);
    for (const int threads : {2, 4}) {
        const LoraSteps other = train_lora_in_process(threads, 0.3f);
        ASSERT_EQ(other.adapter.size(), one.adapter.size());
        for (std::size_t s = 0; s < one.losses.size(); ++s)
            EXPECT_NEAR(other.losses[s], one.losses[s], 1e-5 * one.losses[s]) << threads;
        for (std::size_t i = 0; i < one.adapter.size(); ++i)
            ASSERT_NEAR(other.adapter[i], one.adapter[i], 1e-5 * (1.0 + std::abs(one.adapter[i])))
                << threads << " workers, element " << i;
    }
}

// The same in bf16 (the products on bf16 operands, the dropped adapter input in fp32): the masks
// change the adapter, the workers agree, and the adapter stays near fp32's with the same masks.
// Bounds, in norm relative to the reference adapter:
// - 1 against 2 workers, 1e-3: the workers sum the same terms in another order (1e-7 relative in
//   fp32), which can flip a few bf16 roundings of the emulated products' operands (2^-8 each);
//   measured 1.6e-4 emulated, 8e-8 on AMX. A sequence lost or counted twice moves it by O(0.1).
// - bf16 against fp32, 4e-2: twice the project's bf16 tolerance (2e-2 for a tensor computed in
//   bf16, tests/test_bf16.cpp), because these are three AdamW steps from B = 0, and AdamW's first
//   steps move each element by about lr times the sign of its gradient: an element whose small
//   gradient the rounding turns over moves 2 lr the other way. Measured 1.4e-2 (AMX and emulated
//   alike); without the masks the adapter is 0.23 away, so the bound still tells them apart.
TEST(LoraReplica, InputDropoutInBf16TrainsTheSameAdapterForOneAndTwoWorkersNearFp32s) {
    const auto relative_distance = [](const std::vector<float>& a, const std::vector<float>& b) {
        double diff = 0.0, norm = 0.0;
        for (std::size_t i = 0; i < a.size(); ++i) {
            diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
            norm += static_cast<double>(b[i]) * b[i];
        }
        return std::sqrt(diff / norm);
    };
    const LoraSteps one = train_lora_in_process(1, 0.3f, Precision::Bf16);
    const LoraSteps undropped = train_lora_in_process(1, 0.0f, Precision::Bf16);
    const LoraSteps two = train_lora_in_process(2, 0.3f, Precision::Bf16);
    const LoraSteps fp32 = train_lora_in_process(1, 0.3f, Precision::Fp32);
    for (const LoraSteps* other : {&undropped, &two, &fp32})
        ASSERT_EQ(other->adapter.size(), one.adapter.size());
    EXPECT_NE(undropped.adapter, one.adapter);
    EXPECT_LT(relative_distance(two.adapter, one.adapter), 1e-3);
    EXPECT_LT(relative_distance(one.adapter, fp32.adapter), 4e-2);
    EXPECT_GT(relative_distance(undropped.adapter, fp32.adapter), 0.1);
    for (std::size_t s = 0; s < one.losses.size(); ++s)
        EXPECT_NEAR(one.losses[s], fp32.losses[s], 2e-2 * fp32.losses[s]) << "step " << s;
}

// ---- train_gpt2 -------------------------------------------------------------------------------

// The base every LoRA run adapts: two steps of full training of the small model.
class LoraTraining : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = std::make_unique<ScratchDir>("gpt2-lora-train");
        test::write_corpus(dir_->path() / "corpus.txt", 20000);
        const auto base =
            run_command(test::build_path("train_gpt2") + test::small_model(16) +
                        " --batch-size 4 --threads 1 --max-steps 2 --val-every 0"
                        " --sample-every 0 --data " +
                        (*dir_ / "corpus.txt") + " --out-dir " + (*dir_ / "base") + " 2>&1");
        ASSERT_EQ(base.exit_code, 0) << base.output;
    }
    static void TearDownTestSuite() { dir_.reset(); }
    static std::string base_file() { return *dir_ / "base/model_000002.bin"; }
    // A LoRA run of three steps from the base into dir/<name> (one rank: without mpiexec);
    // `flags` may replace the defaults (--val-every, --sample-every, ...).
    static test::ProcessResult lora(int ranks, const std::string& name, const std::string& flags) {
        return run_command((ranks > 1 ? test::mpiexec(ranks) : std::string()) +
                           test::build_path("train_gpt2") +
                           test::without_given(" --seq-len 16 --max-steps 3 --val-every 0"
                                               " --sample-every 0 --seed 3 --lr 1e-2"
                                               " --warmup-steps 1",
                                               flags) +
                           " --data " + (*dir_ / "corpus.txt") + " --init-from " + base_file() +
                           " --out-dir " + (*dir_ / name) + " --metrics-file " +
                           (*dir_ / (name + ".jsonl")) + " " + flags + " 2>&1");
    }
    // A LoRA run (`lora`: r 4, alpha 8 unless told) of six steps into dir/<name>, on `ranks`
    // ranks with 4 sequences per step, from `init_from` (empty: none); `flags` adds
    // --stop-at-step, --resume and others.
    static test::ProcessResult six_steps(int ranks, const std::string& name,
                                         const std::string& flags,
                                         const std::string& init_from = base_file(),
                                         const std::string& lora = "--lora-rank 4 --lora-alpha 8") {
        return run_command(
            (ranks > 1 ? test::mpiexec(ranks) : std::string()) + test::build_path("train_gpt2") +
            " --seq-len 16 --max-steps 6 --val-every 0 --sample-every 0 --seed 3 --lr 1e-2"
            " --warmup-steps 1 " +
            lora + " --batch-size " + std::to_string(4 / ranks) + " --threads 2 --data " +
            (*dir_ / "corpus.txt") +
            (init_from.empty() ? std::string() : " --init-from " + init_from) + " --out-dir " +
            (*dir_ / name) + " --metrics-file " + (*dir_ / (name + ".jsonl")) + " " + flags +
            " 2>&1");
    }
    static std::unique_ptr<ScratchDir> dir_;
};
std::unique_ptr<ScratchDir> LoraTraining::dir_;

std::unique_ptr<LoraAdapter> adapter_of(const ScratchDir& dir, const std::string& name,
                                        const ModelConfig& config) {
    return read_peft_adapter(dir.path() / name / "model_000003.adapter", config);
}

// What merging adds to layer l's matrix adapted by t, element by element (row by row): the
// element's index into the model's parameters and scale x (B A)[o][c], summed in double.
struct MergedDelta {
    std::size_t at;
    double value;
};
std::vector<MergedDelta> merged_deltas(const LoraAdapter& adapter, const ParameterLayout& layout,
                                       int l, LoraTarget t, float scale) {
    const ProductShape shape = lora_product_shape(adapter.layout.model(), t);
    const int r = adapter.config.rank;
    const float* A = adapter.params.data() + adapter.layout.a_offset(l, t);
    const float* B = adapter.params.data() + adapter.layout.b_offset(l, t);
    const std::size_t w0 =
        layout.offset(lora_target_weight(t)) + static_cast<std::size_t>(l) * shape.out * shape.in;
    std::vector<MergedDelta> deltas;
    for (int o = 0; o < shape.out; ++o) {
        for (int c = 0; c < shape.in; ++c) {
            double ba = 0.0;
            for (int k = 0; k < r; ++k)
                ba += static_cast<double>(B[o * r + k]) * A[k * shape.in + c];
            deltas.push_back(
                {w0 + static_cast<std::size_t>(o) * shape.in + c, static_cast<double>(scale) * ba});
        }
    }
    return deltas;
}

TEST_F(LoraTraining, OneAndTwoRanksTrainTheSameAdapterAndTheMergedCheckpointIsWPlusScaledBA) {
    const auto one = lora(1, "np1", "--lora-rank 4 --lora-alpha 8 --batch-size 4 --threads 2");
    ASSERT_EQ(one.exit_code, 0) << one.output;
    const auto two = lora(2, "np2", "--lora-rank 4 --lora-alpha 8 --batch-size 2 --threads 1");
    ASSERT_EQ(two.exit_code, 0) << two.output;
    EXPECT_NE(one.output.find("LoRA r=4 alpha=8 on c_attn, attn.c_proj, c_fc, mlp.c_proj: 4,096 "
                              "trained parameters of "),
              std::string::npos)
        << one.output;
    EXPECT_NE(one.output.find("base frozen"), std::string::npos) << one.output;
    EXPECT_NE(two.output.find("gradient across ranks: the adapter's, in one allreduce after "
                              "backward (LoRA: the base is frozen)"),
              std::string::npos)
        << two.output;
    EXPECT_NE(one.output.find("memory per rank (LoRA): "), std::string::npos) << one.output;
    // A checkpoint merges the adapter one matrix at a time (the largest: c_fc's, 4C x C floats),
    // not into a copy of the weights.
    EXPECT_NE(one.output.find("adapter moments 32.0 KiB + checkpoint merge buffer "),
              std::string::npos)
        << one.output;
    EXPECT_NE(one.output.find("checkpoint " + (*dir_ / "np1/model_000003.bin") +
                              " (merged weights) and LoRA adapter " +
                              (*dir_ / "np1/model_000003.adapter") + " ("),
              std::string::npos)
        << one.output;

    const LoadedModel base = load_checkpoint(base_file());
    const ModelConfig& config = base.model.config;
    const auto a1 = adapter_of(*dir_, "np1", config);
    const auto a2 = adapter_of(*dir_, "np2", config);
    ASSERT_EQ(a1->layout.total(), 4096u);
    ASSERT_EQ(a2->layout.total(), a1->layout.total());
    for (std::size_t i = 0; i < a1->layout.total(); ++i)
        ASSERT_NEAR(a2->params.data()[i], a1->params.data()[i],
                    1e-5 * (1.0 + std::abs(a1->params.data()[i])))
            << i;
    const std::vector<double> l1 = test::metrics_values(*dir_ / "np1.jsonl", "train", "loss");
    const std::vector<double> l2 = test::metrics_values(*dir_ / "np2.jsonl", "train", "loss");
    ASSERT_EQ(l1.size(), 3u);
    ASSERT_EQ(l2.size(), l1.size());
    for (std::size_t s = 0; s < l1.size(); ++s)
        EXPECT_NEAR(l2[s], l1[s], 1e-5 * l1[s]) << s;

    // The checkpoint holds W + (alpha / r) B A where adapted and the base elsewhere, bitwise.
    const LoadedModel merged = load_checkpoint(*dir_ / "np1/model_000003.bin");
    std::vector<bool> adapted(base.model.params.size(), false);
    const float scale = 8.0f / 4.0f;
    for (int l = 0; l < config.num_layers; ++l) {
        for (int i = 0; i < kGpt2LoraTargets; ++i) {
            const auto t = static_cast<LoraTarget>(i);
            for (const auto& [at, delta] : merged_deltas(*a1, base.model.layout, l, t, scale)) {
                adapted[at] = true;
                const double expected = base.model.params.data()[at] + delta;
                ASSERT_NEAR(merged.model.params.data()[at], expected,
                            1e-6 * (1.0 + std::abs(expected)))
                    << "layer " << l << " " << lora_target_module(t);
            }
        }
    }
    for (std::size_t at = 0; at < adapted.size(); ++at) {
        if (!adapted[at]) {
            ASSERT_EQ(merged.model.params.data()[at], base.model.params.data()[at]);
        }
    }
}

// --lora-dropout: one and two ranks train the same adapter (the masks are the sequences'), the
// start-up log says the rate and adapter_config.json records it as PEFT's lora_dropout.
TEST_F(LoraTraining, InputDropoutTrainsTheSameAdapterOnOneAndTwoRanksAndIsRecorded) {
    const std::string flags = "--lora-rank 4 --lora-alpha 8 --lora-dropout 0.2";
    // One worker on one rank: the masks of the second rank's sequences are not the first's again.
    const auto one = lora(1, "drop1", flags + " --batch-size 4 --threads 1");
    ASSERT_EQ(one.exit_code, 0) << one.output;
    const auto two = lora(2, "drop2", flags + " --batch-size 2 --threads 1");
    ASSERT_EQ(two.exit_code, 0) << two.output;
    const auto none = lora(1, "drop0", "--lora-rank 4 --lora-alpha 8 --batch-size 4 --threads 2");
    ASSERT_EQ(none.exit_code, 0) << none.output;
    EXPECT_NE(one.output.find("LoRA r=4 alpha=8 dropout=0.2 (on the adapters' inputs) on c_attn, "
                              "attn.c_proj, c_fc, mlp.c_proj: 4,096 trained parameters of "),
              std::string::npos)
        << one.output;
    const auto config_of = [&](const std::string& name) {
        return nlohmann::json::parse(
            read_text_file(dir_->path() / name / "model_000003.adapter" / "adapter_config.json"));
    };
    EXPECT_EQ(config_of("drop1").at("lora_dropout").get<double>(), 0.2);
    EXPECT_EQ(config_of("drop0").at("lora_dropout").get<double>(), 0.0);

    const ModelConfig config = load_checkpoint(base_file()).model.config;
    const auto a1 = adapter_of(*dir_, "drop1", config);
    const auto a2 = adapter_of(*dir_, "drop2", config);
    const auto a0 = adapter_of(*dir_, "drop0", config);
    ASSERT_EQ(a2->layout.total(), a1->layout.total());
    for (std::size_t i = 0; i < a1->layout.total(); ++i)
        ASSERT_NEAR(a2->params.data()[i], a1->params.data()[i],
                    1e-5 * (1.0 + std::abs(a1->params.data()[i])))
            << i;
    EXPECT_FALSE(
        std::equal(a0->params.data(), a0->params.data() + a0->layout.total(), a1->params.data()))
        << "the dropout changed nothing";
}

TEST_F(LoraTraining, LoraFromContinuesTheSavedAdapterAndRefusesContradictingFlags) {
    const auto first = lora(1, "first", "--lora-rank 2 --lora-alpha 4 --lora-targets c_attn");
    ASSERT_EQ(first.exit_code, 0) << first.output;
    const std::string saved = *dir_ / "first/model_000003.adapter";
    const auto more = lora(1, "more", "--lora-from " + saved);
    ASSERT_EQ(more.exit_code, 0) << more.output;
    EXPECT_NE(more.output.find("LoRA r=2 alpha=4 on c_attn: "), std::string::npos) << more.output;
    // It started from the saved adapter: its first loss is the saved run's adapted model's, not
    // the base's (B = 0) as a fresh adapter's first step.
    const std::vector<double> fresh = test::metrics_values(*dir_ / "first.jsonl", "train", "loss");
    const std::vector<double> continued =
        test::metrics_values(*dir_ / "more.jsonl", "train", "loss");
    ASSERT_FALSE(continued.empty());
    EXPECT_NE(continued[0], fresh[0]);

    const auto rank = lora(1, "bad", "--lora-from " + saved + " --lora-rank 8");
    EXPECT_EQ(rank.exit_code, 2) << rank.output;
    EXPECT_NE(rank.output.find("--lora-rank 8 contradicts --lora-from " + saved +
                               ", whose adapter_config.json says r 2: drop --lora-rank"),
              std::string::npos)
        << rank.output;
    const auto missing = lora(1, "bad", "--lora-from " + (*dir_ / "nowhere"));
    EXPECT_EQ(missing.exit_code, 1) << missing.output;
    EXPECT_NE(missing.output.find("--lora-from " + (*dir_ / "nowhere") +
                                  ": no adapter_config.json there (expected a PEFT adapter "
                                  "directory)"),
              std::string::npos)
        << missing.output;
}

// The text of the sample train_gpt2 printed at `step`.
std::string sample_text(const std::string& output, int step) {
    const std::string head = "sample at step " + std::to_string(step) + ":\n";
    const std::size_t begin = output.find(head);
    if (begin == std::string::npos) return {};
    const std::size_t end = output.find("\n---", begin);
    return output.substr(begin + head.size(), end - begin - head.size());
}

// A memory figure of train_gpt2's start-up log: the words after `label` up to the next " +".
std::string memory_figure(const std::string& output, const std::string& label) {
    const std::size_t at = output.find(label);
    if (at == std::string::npos) return {};
    const std::size_t begin = at + label.size();
    return output.substr(begin, output.find(" +", begin) - begin);
}

// --lora-base bf16: whatever reads the base in a bf16 run reads the layer matrices' bf16 copy. With
// the fp32 copies overwritten with NaN (instead of released), training, validation, HellaSwag and
// the sample give bitwise what --lora-base fp32 gives, and the merged checkpoint holds
// bf16(W) + (alpha/r) B A for adapted matrices, bf16(W) for the unadapted layer matrices, and W
// elsewhere. The memory plan's frozen weights are the smaller for it.
TEST_F(LoraTraining, ABf16BaseIsReadOnlyInBf16AndTheCheckpointMergesTheRoundedBase) {
    std::vector<MultipleChoiceExample> examples;
    for (int i = 0; i < 6; ++i) {
        MultipleChoiceExample e;
        e.index = i;
        e.label = i % 4;
        e.context = {1 + i, 2, 3 + i % 5};
        for (int k = 0; k < 4; ++k)
            e.endings.push_back({(i + k) % 15, (2 * i + k) % 15});
        examples.push_back(std::move(e));
    }
    write_multiple_choice_file(dir_->path() / "bf16base-eval.bin", examples);
    const std::string flags =
        "--lora-rank 4 --lora-alpha 8 --lora-targets c_attn,c_fc --precision bf16 --batch-size 4 "
        "--threads 2 --val-every 2 --val-tokens 64 --sample-every 3 --sample-tokens 12 "
        "--hellaswag " +
        (*dir_ / "bf16base-eval.bin");
    const auto both = lora(1, "fp32base", flags);
    ASSERT_EQ(both.exit_code, 0) << both.output;
    const auto bf16 = lora(1, "bf16base", flags + " --lora-base bf16 --test-poison-lora-base");
    ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
    EXPECT_NE(bf16.output.find("base frozen (its layer matrices in bf16 only: --lora-base bf16)"),
              std::string::npos)
        << bf16.output;

    for (const auto& [type, key] : std::vector<std::pair<std::string, std::string>>{
             {"train", "loss"}, {"val", "val_loss"}, {"eval", "hellaswag_acc_norm"}}) {
        const std::vector<double> a = test::metrics_values(*dir_ / "fp32base.jsonl", type, key);
        const std::vector<double> b = test::metrics_values(*dir_ / "bf16base.jsonl", type, key);
        ASSERT_FALSE(a.empty()) << key;
        for (const double x : b)
            EXPECT_TRUE(std::isfinite(x)) << key;
        EXPECT_EQ(a, b) << key;  // bitwise: the metrics file prints doubles exactly
    }
    const std::string sample = sample_text(both.output, 3);
    ASSERT_FALSE(sample.empty()) << both.output;
    EXPECT_EQ(sample_text(bf16.output, 3), sample);

    // The memory plan: the fp32 layer matrices' whole pages are left out of the frozen weights.
    const LoadedModel base = load_checkpoint(base_file());
    const ModelConfig& config = base.model.config;
    const std::size_t P = base.model.params.size();
    EXPECT_EQ(memory_figure(both.output, "+ frozen weights "),
              human_bytes(static_cast<double>(P * 6)));
    EXPECT_EQ(memory_figure(bf16.output, "+ frozen weights "),
              human_bytes(static_cast<double>(P * 6 - releasable_fp32_bytes(base.model.layout))));

    const LoadedModel merged = load_checkpoint(*dir_ / "bf16base/model_000003.bin");
    const auto adapter = adapter_of(*dir_, "bf16base", config);
    const float scale = 8.0f / 4.0f;
    std::vector<bool> layer_matrix(P, false);
    for (const ParamTensor t : kLayerMatrices) {
        const std::size_t offset = base.model.layout.offset(t);
        for (std::size_t i = offset; i < offset + base.model.layout.size(t); ++i)
            layer_matrix[i] = true;
    }
    std::vector<bool> adapted(P, false);
    for (int l = 0; l < config.num_layers; ++l) {
        for (const LoraTarget t : {LoraTarget::CAttn, LoraTarget::CFc}) {
            for (const auto& [at, delta] :
                 merged_deltas(*adapter, base.model.layout, l, t, scale)) {
                adapted[at] = true;
                const double expected = to_float(to_bf16(base.model.params.data()[at])) + delta;
                ASSERT_NEAR(merged.model.params.data()[at], expected,
                            1e-6 * (1.0 + std::abs(expected)))
                    << "layer " << l << " " << lora_target_module(t);
            }
        }
    }
    std::size_t rounded = 0;
    for (std::size_t at = 0; at < P; ++at) {
        if (adapted[at]) continue;
        const float w = base.model.params.data()[at];
        ASSERT_EQ(merged.model.params.data()[at], layer_matrix[at] ? to_float(to_bf16(w)) : w)
            << at;
        if (layer_matrix[at] && to_float(to_bf16(w)) != w) ++rounded;
    }
    EXPECT_GT(rounded, 0u) << "the base's layer matrices were bf16 already";
}

bool same_weights(const fs::path& a, const fs::path& b) {
    const LoadedModel x = load_checkpoint(a);
    const LoadedModel y = load_checkpoint(b);
    return x.model.config == y.model.config &&
           std::memcmp(x.model.params.data(), y.model.params.data(),
                       x.model.params.size() * sizeof(float)) == 0;
}

// Six steps straight, and three + three with a stop and --resume auto between (the base again
// from --init-from, the adapter from the checkpoint): the same losses, adapter files and merged
// weights, bit for bit.
void expect_bitwise_lora_resume(
    const ScratchDir& dir, int ranks,
    const std::function<test::ProcessResult(const std::string&, const std::string&)>& run,
    const std::string& prefix = "") {
    const std::string straight = prefix + "straight" + std::to_string(ranks);
    const std::string resumed = prefix + "resumed" + std::to_string(ranks);
    const auto whole = run(straight, "");
    ASSERT_EQ(whole.exit_code, 0) << whole.output;
    const auto first = run(resumed, "--stop-at-step 3");
    ASSERT_EQ(first.exit_code, 0) << first.output;
    const auto second = run(resumed, "--resume auto");
    ASSERT_EQ(second.exit_code, 0) << second.output;
    EXPECT_NE(second.output.find("resuming LoRA: the frozen base from --init-from "),
              std::string::npos)
        << second.output;
    EXPECT_NE(second.output.find("at step 3"), std::string::npos) << second.output;

    const std::vector<double> a =
        test::metrics_values(dir / (straight + ".jsonl"), "train", "loss");
    const std::vector<double> b = test::metrics_values(dir / (resumed + ".jsonl"), "train", "loss");
    ASSERT_EQ(a.size(), 6u);
    EXPECT_EQ(a, b);  // bitwise: the metrics file prints doubles exactly
    for (const char* file : {"adapter_model.safetensors", "adapter_config.json"}) {
        EXPECT_EQ(read_file_bytes(adapter_path(dir / straight, 6) / file),
                  read_file_bytes(adapter_path(dir / resumed, 6) / file))
            << file;
    }
    EXPECT_TRUE(same_weights(model_path(dir / straight, 6), model_path(dir / resumed, 6)));
}

TEST_F(LoraTraining, AStoppedLoraRunResumesBitwiseOnItsBaseFromInitFrom) {
    expect_bitwise_lora_resume(*dir_, 1, [](const std::string& name, const std::string& flags) {
        return six_steps(1, name, flags);
    });
}

TEST_F(LoraTraining, AStoppedLoraRunOfTwoRanksResumesBitwise) {
    expect_bitwise_lora_resume(*dir_, 2, [](const std::string& name, const std::string& flags) {
        return six_steps(2, name, flags);
    });
}

// With --lora-dropout: 3 + 3 steps equal 6 straight bitwise (the masks are the step's), and a
// resume with another rate, or without the flag, is refused naming the state file and the rate.
TEST_F(LoraTraining, ALoraRunWithInputDropoutResumesBitwiseAndRefusesAnotherRate) {
    const std::string dropped = "--lora-rank 4 --lora-alpha 8 --lora-dropout 0.2";
    expect_bitwise_lora_resume(
        *dir_, 1,
        [&](const std::string& name, const std::string& flags) {
            return six_steps(1, name, flags, base_file(), dropped);
        },
        "dropout-");
    const std::string state = state_path(*dir_ / "dropout-resumed1", 3).string();
    const std::vector<std::uint8_t> state_bytes = read_file_bytes(state);
    const auto other = six_steps(1, "dropout-resumed1", "--resume " + state, base_file(),
                                 "--lora-rank 4 --lora-alpha 8 --lora-dropout 0.1");
    EXPECT_EQ(other.exit_code, 2) << other.output;
    EXPECT_NE(other.output.find("error: --resume " + state +
                                ": the LoRA run had another adapter: --lora-dropout 0.1 (the "
                                "state's 0.2); give the flags it was trained with"),
              std::string::npos)
        << other.output;
    const auto without = six_steps(1, "dropout-resumed1", "--resume " + state);
    EXPECT_EQ(without.exit_code, 2) << without.output;
    EXPECT_NE(without.output.find("--lora-dropout 0 (the state's 0.2)"), std::string::npos)
        << without.output;
    EXPECT_EQ(read_file_bytes(state), state_bytes);
}

// The Llama family (docs/llama.md's Hugging Face stand-in: SmolLM2's layout, 4 query heads over 2
// key/value heads): LoRA on every projection PEFT's Llama names give, with input dropout, on two
// ranks: 3 + 3 steps equal 6 straight bitwise (the state's version 9: its model's record and the
// adapter's), and a resume asking for other projections is refused naming them.
TEST_F(LoraTraining, ALlamaFamilyLoraRunOfTwoRanksResumesBitwise) {
    const std::string standin = std::string(GPT2_TEST_DATA_DIR) + "/hf_llama_standin";
    const std::string adapter =
        "--lora-rank 4 --lora-alpha 8 --lora-targets all --lora-dropout 0.1";
    expect_bitwise_lora_resume(
        *dir_, 2,
        [&](const std::string& name, const std::string& flags) {
            return six_steps(2, name, flags, standin, adapter);
        },
        "llama-");
    const std::string state = state_path(*dir_ / "llama-resumed2", 3).string();
    const std::vector<std::uint8_t> bytes = read_file_bytes(state);
    EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 8), "GPT2STA9");
    const auto config = nlohmann::json::parse(
        read_text_file(adapter_path(*dir_ / "llama-straight2", 6) / "adapter_config.json"));
    EXPECT_EQ(config.at("target_modules"), nlohmann::json({"q_proj", "k_proj", "v_proj", "o_proj",
                                                           "gate_proj", "up_proj", "down_proj"}));
    EXPECT_EQ(config.at("fan_in_fan_out"), false);
    const auto other =
        six_steps(1, "llama-resumed2", "--resume " + state, standin,
                  "--lora-rank 4 --lora-alpha 8 --lora-targets q_proj,v_proj --lora-dropout 0.1");
    EXPECT_EQ(other.exit_code, 2) << other.output;
    EXPECT_NE(other.output.find("--lora-targets q_proj,v_proj (the state's "
                                "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj)"),
              std::string::npos)
        << other.output;
}

// --lora-base bf16 (the fp32 layer matrices released after the start): 3 + 3 steps equal 6
// straight, bit for bit, the resume releasing the base it reads again from --init-from alike.
TEST_F(LoraTraining, ALoraRunWithABf16BaseResumesBitwise) {
    expect_bitwise_lora_resume(
        *dir_, 1,
        [&](const std::string& name, const std::string& flags) {
            return six_steps(1, name, flags, base_file(),
                             "--lora-rank 4 --lora-alpha 8 --precision bf16 --lora-base bf16");
        },
        "bf16base-");
}

// What a LoRA state records is checked before the corpus is read: a resume that would train
// another adapter, on another base, or the other kind of run is refused in one line naming the
// state file and what differs, and the checkpoints stay as they were.
TEST_F(LoraTraining, AResumeThatContradictsTheLoraStateIsRefusedNamingWhatDiffers) {
    const auto first = six_steps(1, "stopped", "--stop-at-step 3");
    ASSERT_EQ(first.exit_code, 0) << first.output;
    const std::string state = state_path(*dir_ / "stopped", 3).string();
    const std::string merged = model_path(*dir_ / "stopped", 3).string();
    const std::vector<std::uint8_t> state_bytes = read_file_bytes(state);
    struct Case {
        std::string flags;
        std::string init_from;
        int exit_code;
        std::string message;
        std::string lora = "--lora-rank 4 --lora-alpha 8";
    };
    const std::vector<Case> cases = {
        {"--resume auto", base_file(), 2,
         "error: --resume " + state +
             ": the LoRA run had another adapter: --lora-rank 2 (the state's r 4); give the "
             "flags it was trained with",
         "--lora-rank 2 --lora-alpha 8"},
        {"--resume auto", base_file(), 2,
         "error: --resume " + state +
             ": the LoRA run had another adapter: --lora-alpha 16 (the state's 8), "
             "--lora-targets c_attn (the state's c_attn,c_proj,c_fc); give the flags it was "
             "trained with",
         "--lora-rank 4 --lora-alpha 16 --lora-targets c_attn"},
        {"--resume auto", "", 2,
         "error: --resume " + state +
             ": a LoRA run resumes on the base it adapted, which came from --init-from: give "
             "that --init-from (the checkpoint's model file holds the merged weights, not the "
             "base)"},
        {"--resume auto", merged, 2,
         "error: --init-from " + merged + " is not the base the LoRA run of " + state +
             " adapted (base fingerprint "},
        {"--resume " + state + " --lora-from " + adapter_path(*dir_ / "stopped", 3).string(),
         base_file(), 2,
         "error: --lora-from and --resume: a resumed LoRA run takes its adapter from the "
         "checkpoint (model_NNNNNN.adapter beside the state file); drop --lora-from"},
    };
    for (const Case& c : cases) {
        const auto result = six_steps(1, "stopped", c.flags, c.init_from, c.lora);
        EXPECT_EQ(result.exit_code, c.exit_code) << c.flags << "\n" << result.output;
        EXPECT_NE(result.output.find(c.message), std::string::npos) << c.flags << "\n"
                                                                    << result.output;
    }
    // Full training on a LoRA state, and LoRA on a full-training state.
    const auto full = run_command(test::build_path("train_gpt2") +
                                  " --seq-len 16 --max-steps 6 --batch-size 4 --data " +
                                  (*dir_ / "corpus.txt") + " --resume " + state + " 2>&1");
    EXPECT_EQ(full.exit_code, 2) << full.output;
    EXPECT_NE(full.output.find("error: --resume " + state +
                               ": the state is of a LoRA run (r 4, alpha 8, targets "
                               "c_attn,c_proj,c_fc): resume it with the same --lora-rank, "
                               "--lora-alpha and --lora-targets and the --init-from base it "
                               "adapted"),
              std::string::npos)
        << full.output;
    const std::string full_state = state_path(*dir_ / "base", 2).string();
    const auto lora_on_full = six_steps(1, "stopped", "--resume " + full_state);
    EXPECT_EQ(lora_on_full.exit_code, 2) << lora_on_full.output;
    EXPECT_NE(lora_on_full.output.find("error: --resume " + full_state +
                                       ": the state is of full training (optimizer state for "
                                       "every weight), not of a LoRA run: drop --lora-rank to "
                                       "resume it"),
              std::string::npos)
        << lora_on_full.output;
    EXPECT_EQ(read_file_bytes(state), state_bytes);
    EXPECT_EQ(list_checkpoints(*dir_ / "stopped"), (std::vector<std::int64_t>{3}));
}

// Each refusal: one line naming the flags, exit 2, before anything is read.
TEST_F(LoraTraining, UnsupportedCombinationsAndBadValuesAreRefusedNamingTheFlags) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"--lora-rank 4 --zero 1",
         "error: --lora-rank and --zero 1: LoRA's adapter gradient (megabytes) travels in one "
         "allreduce after backward and every rank keeps the adapter's whole AdamW state; drop "
         "--zero"},
        {"--lora-rank 4 --share-memory auto",
         "error: --lora-rank and --share-memory auto: with LoRA each rank keeps its own frozen "
         "weights and LoRA's adapter gradient"},
        {"--lora-rank 4 --bucket-mb 1",
         "error: --lora-rank and --bucket-mb: LoRA's adapter gradient (megabytes) travels in one "
         "allreduce after backward"},
        {"--lora-rank 4 --lora-targets c_attn,wte",
         "error: --lora-targets: unknown projection 'wte' (GPT-2's: c_attn, attn.c_proj, c_fc, "
         "mlp.c_proj, c_proj; the Llama family's: q_proj, k_proj, v_proj, o_proj, gate_proj, "
         "up_proj, down_proj; or all)"},
        {"--lora-rank -1", "--lora-rank"},
        {"--lora-rank 4 --lora-alpha 0", "--lora-alpha"},
        {"--lora-alpha 16",
         "error: --lora-alpha needs --lora-rank R (or --lora-from DIR): without an adapter the "
         "whole model trains"},
        {"--lora-targets c_fc", "error: --lora-targets needs --lora-rank R"},
        {"--lora-dropout 0.1",
         "error: --lora-dropout needs --lora-rank R (or --lora-from DIR): without an adapter the "
         "whole model trains"},
        {"--lora-base bf16",
         "error: --lora-base needs --lora-rank R (or --lora-from DIR): without an adapter the "
         "whole model trains"},
        {"--lora-rank 4 --lora-base bf16",
         "error: --lora-base bf16 needs --precision bf16: in fp32 the products read the fp32 "
         "base"},
        {"--lora-rank 4 --precision bf16 --lora-base fp16", "--lora-base"},
        {"--lora-rank 4 --lora-dropout 1", "error: --lora-dropout must be in [0, 1)"},
        {"--lora-rank 4 --lora-dropout -0.1", "error: --lora-dropout must be in [0, 1)"},
    };
    for (const auto& [flags, message] : cases) {
        const auto result = lora(1, "refused", flags);
        EXPECT_EQ(result.exit_code, 2) << flags << "\n" << result.output;
        EXPECT_NE(result.output.find(message), std::string::npos) << flags << "\n" << result.output;
        EXPECT_FALSE(fs::exists(dir_->path() / "refused")) << flags;
    }
}

// prompt/response records through prepare_data --loss-on response, then LoRA on the masked shards.
TEST_F(LoraTraining, LoraTrainsOnTheLossMaskOfPromptResponseData) {
    std::string jsonl;
    for (int i = 0; i < 80; ++i) {
        jsonl += nlohmann::json{{"prompt", "Say " + std::to_string(i) + "?"},
                                {"response", "It is " + std::to_string(i * 3) + "."}}
                     .dump() +
                 "\n";
    }
    test::write_bytes(dir_->path() / "qa.jsonl", jsonl);
    const auto prepared =
        run_command(test::build_path("prepare_data") + " --data " + (*dir_ / "qa.jsonl") +
                    " --tokenizer char --loss-on response"
                    " --out-dir " +
                    (*dir_ / "shards") + " --name qa 2>&1");
    ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
    // The char tokenizer of the shards, a base of their vocabulary.
    const auto base = run_command(
        test::build_path("train_gpt2") + test::small_model(16) +
        " --batch-size 4 --threads 1 --max-steps 1 --val-every 0 --sample-every 0 --train-data " +
        (*dir_ / "shards/qa_train_*.bin") + " --val-data " + (*dir_ / "shards/qa_val_*.bin") +
        " --out-dir " + (*dir_ / "qa_base") + " 2>&1");
    ASSERT_EQ(base.exit_code, 0) << base.output;
    const auto tuned = run_command(
        test::build_path("train_gpt2") +
        " --seq-len 16 --batch-size 4 --threads 2 --max-steps 2 --val-every 0 --sample-every 0"
        " --lora-rank 4 --init-from " +
        (*dir_ / "qa_base/model_000001.bin") + " --train-data " +
        (*dir_ / "shards/qa_train_*.bin") + " --val-data " + (*dir_ / "shards/qa_val_*.bin") +
        " --out-dir " + (*dir_ / "qa_lora") + " --metrics-file " + (*dir_ / "qa_lora.jsonl") +
        " 2>&1");
    ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
    EXPECT_NE(tuned.output.find("loss mask:"), std::string::npos) << tuned.output;
    const std::vector<nlohmann::json> steps =
        test::metrics_records(*dir_ / "qa_lora.jsonl", "train");
    ASSERT_EQ(steps.size(), 2u);
    for (const nlohmann::json& step : steps) {
        EXPECT_GT(step["trained_tokens"].get<std::int64_t>(), 0);
        EXPECT_LT(step["trained_tokens"].get<std::int64_t>(), 4 * 16);  // prompts left out
        EXPECT_TRUE(std::isfinite(step["loss"].get<double>()));
    }
    EXPECT_TRUE(fs::is_directory(dir_->path() / "qa_lora/model_000002.adapter"));
}

}  // namespace
}  // namespace gpt2
