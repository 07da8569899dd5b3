// Data parallelism through mpiexec: the same global batch trains the same model however it is
// split over ranks, threads and micro-steps; ranks other than 0 never open the corpus; an error
// on any rank ends the whole job quickly.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "formats/checkpoint.hpp"
#include "parallel/comm.hpp"
#include "process_support.hpp"
#include "test_support.hpp"
#include "train_run_fixture.hpp"

namespace gpt2 {
namespace {

using test::TrainRun;

using test::mpiexec;
using test::run_command;
using test::ScratchDir;

const std::string kModelFlags =
    test::small_model(32) +
    " --lr 1e-3 --warmup-steps 2 --eps 1e-5"
    " --val-every 0 --sample-every 0 --checkpoint-every 0 --seed 5 --val-tokens 256";

struct RunOutcome {
    std::vector<double> losses;
    LoadedModel model;
};

RunOutcome read_outcome(const ScratchDir& dir, const std::string& name) {
    return RunOutcome{test::metrics_values(dir / (name + ".jsonl"), "train", "loss"),
                      load_checkpoint(dir / (name + "/model_000010.bin"))};
}

// `command` on `ranks` ranks with its out-dir and metrics file named `name` in `dir`: its output.
std::string run_named(const ScratchDir& dir, int ranks, const std::string& command,
                      const std::string& name) {
    const auto result = run_command(mpiexec(ranks) + command + " --out-dir " + (dir / name) +
                                    " --metrics-file " + (dir / (name + ".jsonl")));
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return result.output;
}

// The log `output` says `text`.
void expect_logged(const std::string& output, const std::string& text) {
    EXPECT_NE(output.find(text), std::string::npos) << "expected: " << text << "\n" << output;
}

// Runs `a_name` and `b_name` of 20 steps: losses within `tolerance` relative, final weights as
// same_training with `weights_tolerance`.
void expect_same_training(const ScratchDir& dir, const std::string& a_name,
                          const std::string& b_name, double tolerance,
                          double weights_tolerance = 1e-5) {
    const std::vector<double> a = test::metrics_values(dir / (a_name + ".jsonl"), "train", "loss");
    const std::vector<double> b = test::metrics_values(dir / (b_name + ".jsonl"), "train", "loss");
    ASSERT_EQ(a.size(), 20u) << a_name;
    ASSERT_EQ(b.size(), a.size()) << b_name;
    for (std::size_t s = 0; s < a.size(); ++s)
        EXPECT_NEAR(b[s], a[s], tolerance * a[s]) << b_name << " step " << s + 1;
    const LoadedModel ma = load_checkpoint(dir / (a_name + "/model_000020.bin"));
    const LoadedModel mb = load_checkpoint(dir / (b_name + "/model_000020.bin"));
    EXPECT_TRUE(test::same_training(ma.model.config, mb.model.params.span(), ma.model.params.span(),
                                    weights_tolerance, 1e-2))
        << b_name;
}

TEST(MpiTraining, SameGlobalBatchGivesTheSameTrainingHoweverItIsSplit) {
    const ScratchDir dir("gpt2-mpi-split");
    test::write_corpus(dir.path() / "corpus.txt", 60000);
    struct Split {
        std::string name;
        int ranks, threads, batch, accum;
    };
    // 8 sequences per step in every case.
    const std::vector<Split> splits = {{"np1_w4", 1, 4, 8, 1},
                                       {"np2_w2", 2, 2, 4, 1},
                                       {"np4_w1", 4, 1, 2, 1},
                                       {"np1_w1_accum4", 1, 1, 2, 4}};
    for (const Split& s : splits) {
        const std::string command = mpiexec(s.ranks) + test::build_path("train_gpt2") +
                                    kModelFlags + " --data " + (dir / "corpus.txt") +
                                    " --max-steps 10 --threads " + std::to_string(s.threads) +
                                    " --batch-size " + std::to_string(s.batch) + " --grad-accum " +
                                    std::to_string(s.accum) + " --out-dir " + (dir / s.name) +
                                    " --metrics-file " + (dir / (s.name + ".jsonl"));
        const auto result = run_command(command);
        ASSERT_EQ(result.exit_code, 0) << command << "\n" << result.output;
    }
    const RunOutcome reference = read_outcome(dir, splits[0].name);
    ASSERT_EQ(reference.losses.size(), 10u);
    for (std::size_t i = 1; i < splits.size(); ++i) {
        const RunOutcome other = read_outcome(dir, splits[i].name);
        ASSERT_EQ(other.losses.size(), reference.losses.size()) << splits[i].name;
        for (std::size_t s = 0; s < reference.losses.size(); ++s) {
            EXPECT_NEAR(other.losses[s], reference.losses[s], 1e-5 * reference.losses[s])
                << splits[i].name << " step " << s + 1;
        }
        EXPECT_TRUE(test::same_training(reference.model.model.config,
                                        other.model.model.params.span(),
                                        reference.model.model.params.span(), 1e-5, 1e-2))
            << splits[i].name;
    }
}

// Dropout draws its masks by each sequence's place in the step, not by thread or rank: 1 to 4
// workers, 2 ranks and gradient accumulation train alike with --dropout 0.2, unlike a run without
// it; stopped at step 5 and resumed, a run ends bitwise where the straight one did.
TEST(MpiTraining, DropoutTrainsAlikeHoweverTheStepIsSplitAndResumesBitwise) {
    const ScratchDir dir("gpt2-mpi-dropout");
    test::write_corpus(dir.path() / "corpus.txt", 60000);
    const auto train = [&](const std::string& name, int ranks, int threads, int batch, int accum,
                           const std::string& extra) {
        const std::string command =
            mpiexec(ranks) + test::build_path("train_gpt2") + kModelFlags + " --data " +
            (dir / "corpus.txt") + " --threads " + std::to_string(threads) + " --batch-size " +
            std::to_string(batch) + " --grad-accum " + std::to_string(accum) + " --out-dir " +
            (dir / name) + " --metrics-file " + (dir / (name + ".jsonl")) + " " + extra;
        const auto result = run_command(command);
        EXPECT_EQ(result.exit_code, 0) << command << "\n" << result.output;
        return result.output;
    };
    // The schedule spans 10 steps however many the first start runs.
    const std::string ten = "--max-steps 10 --dropout 0.2 --lr-decay-steps 10";
    expect_logged(train("np1_w1", 1, 1, 8, 1, ten),
                  "dropout 0.2 on the embeddings, the attention probabilities and the attention "
                  "and MLP outputs (training steps only)");
    train("np1_w3", 1, 3, 8, 1, ten);
    train("np1_w4", 1, 4, 8, 1, ten);
    train("np2_w2", 2, 2, 4, 1, ten);
    train("np1_w1_accum4", 1, 1, 2, 4, ten);
    train("no_dropout", 1, 1, 8, 1, "--max-steps 10");
    const RunOutcome reference = read_outcome(dir, "np1_w1");
    ASSERT_EQ(reference.losses.size(), 10u);
    for (const std::string name : {"np1_w3", "np1_w4", "np2_w2", "np1_w1_accum4"}) {
        const RunOutcome other = read_outcome(dir, name);
        ASSERT_EQ(other.losses.size(), reference.losses.size()) << name;
        for (std::size_t s = 0; s < reference.losses.size(); ++s) {
            EXPECT_NEAR(other.losses[s], reference.losses[s], 1e-5 * reference.losses[s])
                << name << " step " << s + 1;
        }
        EXPECT_TRUE(test::same_training(reference.model.model.config,
                                        other.model.model.params.span(),
                                        reference.model.model.params.span(), 1e-5, 1e-2))
            << name;
    }
    const RunOutcome plain = read_outcome(dir, "no_dropout");
    EXPECT_GT(std::abs(plain.losses[0] - reference.losses[0]), 1e-4) << "dropout changed nothing";
    // Stopped at step 5 (a checkpoint) and resumed with 2 ranks: bitwise the straight run.
    train("resumed", 2, 2, 4, 1, "--max-steps 5 --dropout 0.2 --lr-decay-steps 10");
    train("resumed", 2, 2, 4, 1, ten + " --resume auto");
    const RunOutcome resumed = read_outcome(dir, "resumed");
    const RunOutcome straight = read_outcome(dir, "np2_w2");
    EXPECT_TRUE(std::equal(resumed.model.model.params.span().begin(),
                           resumed.model.model.params.span().end(),
                           straight.model.model.params.span().begin()));
}

// The overlapped, bucketed allreduce gives the training of one allreduce after backward: with
// the char vocabulary (embedding rows summed in the rank's buffer) and with a BPE vocabulary large
// enough that the last micro-batch's embedding rows travel separately; with many tiny buckets, the
// default and none; for 2 ranks x 2 workers with gradient accumulation and 3 ranks x 1 worker.
// Repeated runs are bitwise equal.
TEST(MpiTraining, BucketedOverlappedAllreduceTrainsAsOneAllreduce) {
    const ScratchDir dir("gpt2-mpi-buckets");
    test::write_corpus(dir.path() / "corpus.txt", 60000);
    struct Run {
        std::string name;
        int ranks, threads, batch, accum;
        std::string bucket_mb;
    };
    for (const std::string tokenizer : {"char", "bpe"}) {
        const std::string vocab = tokenizer == "bpe" ? " --tokenizer bpe --vocab-size 400" : "";
        // "0" alone would share memory on one machine (the next test): --share-memory off keeps
        // one allreduce.
        const std::vector<Run> runs = {
            {"np2_one", 2, 2, 4, 2, "0 --share-memory off"}, {"np2_tiny", 2, 2, 4, 2, "0.004"},
            {"np2_tiny_again", 2, 2, 4, 2, "0.004"},         {"np2_default", 2, 2, 4, 2, "25"},
            {"np3_one", 3, 1, 4, 1, "0 --share-memory off"}, {"np3_tiny", 3, 1, 4, 1, "0.004"}};
        for (const Run& r : runs) {
            const std::string name = tokenizer + "_" + r.name;
            const std::string command =
                mpiexec(r.ranks) + test::build_path("train_gpt2") + kModelFlags + vocab +
                " --data " + (dir / "corpus.txt") + " --max-steps 10 --threads " +
                std::to_string(r.threads) + " --batch-size " + std::to_string(r.batch) +
                " --grad-accum " + std::to_string(r.accum) + " --bucket-mb " + r.bucket_mb +
                " --out-dir " + (dir / name) + " --metrics-file " + (dir / (name + ".jsonl"));
            const auto result = run_command(command);
            ASSERT_EQ(result.exit_code, 0) << command << "\n" << result.output;
            EXPECT_NE(
                result.output.find(r.bucket_mb.starts_with("0 ") ? "one allreduce after backward"
                                                                 : "summed while backward runs"),
                std::string::npos)
                << result.output;
        }
        for (const auto& [one, bucketed] : std::vector<std::pair<std::string, std::string>>{
                 {"np2_one", "np2_tiny"}, {"np2_one", "np2_default"}, {"np3_one", "np3_tiny"}}) {
            const RunOutcome a = read_outcome(dir, tokenizer + "_" + one);
            const RunOutcome b = read_outcome(dir, tokenizer + "_" + bucketed);
            ASSERT_EQ(a.losses.size(), 10u);
            ASSERT_EQ(b.losses.size(), a.losses.size());
            for (std::size_t s = 0; s < a.losses.size(); ++s) {
                EXPECT_NEAR(b.losses[s], a.losses[s], 1e-6 * a.losses[s])
                    << tokenizer << " " << bucketed << " step " << s + 1;
            }
            EXPECT_TRUE(test::same_training(a.model.model.config, b.model.model.params.span(),
                                            a.model.model.params.span(), 1e-5, 1e-2))
                << tokenizer << " " << bucketed;
        }
        const RunOutcome first = read_outcome(dir, tokenizer + "_np2_tiny");
        const RunOutcome again = read_outcome(dir, tokenizer + "_np2_tiny_again");
        EXPECT_EQ(first.losses, again.losses) << tokenizer;
        EXPECT_TRUE(std::equal(first.model.model.params.span().begin(),
                               first.model.model.params.span().end(),
                               again.model.model.params.span().begin()))
            << tokenizer;
    }
}

// Ranks on one machine share one copy of the weights and sum the gradient in shared memory (the
// default there): the same training as one allreduce, for 2 ranks x 2 workers with gradient
// accumulation and 3 ranks x 1 worker, in fp32 and bf16, bitwise repeatable; its checkpoints
// (moments gathered from the ranks' slices) resume on one rank, and a plain checkpoint resumes
// into shared memory on 3 ranks, both as the uninterrupted run.
TEST(MpiTraining, RanksOnOneMachineShareTheWeightsAndTrainAsOneAllreduce) {
    const ScratchDir dir("gpt2-mpi-shared");
    test::write_corpus(dir.path() / "corpus.txt", 60000);
    const std::string common = test::build_path("train_gpt2") +
                               test::without_given(kModelFlags, "--checkpoint-every") + " --data " +
                               (dir / "corpus.txt") + " --lr-decay-steps 20 --checkpoint-every 10";
    const auto run = [&](int ranks, int threads, int batch, int accum, const std::string& extra,
                         const std::string& name) {
        return run_named(dir, ranks,
                         common + " --threads " + std::to_string(threads) + " --batch-size " +
                             std::to_string(batch) + " --grad-accum " + std::to_string(accum) +
                             " " + extra,
                         name);
    };
    const auto expect_same = [&](const std::string& a_name, const std::string& b_name,
                                 double tolerance, double weights_tolerance = 1e-5) {
        expect_same_training(dir, a_name, b_name, tolerance, weights_tolerance);
    };
    // bf16 rounds the weights for the products, so that a last-bit difference in the norm's
    // summation order can move a product: the bf16 tolerance of test_precision's rank splits.
    for (const std::string precision : {"fp32", "bf16"}) {
        const std::string p = " --max-steps 20 --precision " + precision;
        const double loss_tolerance = precision == "fp32" ? 1e-6 : 1e-4;
        const double weights_tolerance = precision == "fp32" ? 1e-5 : 2e-2;
        (void)run(2, 2, 3, 2, p + " --share-memory off", precision + "_np2_one");
        const std::string shared = run(2, 2, 3, 2, p, precision + "_np2_shared");
        EXPECT_NE(shared.find("shared memory, each rank sums and updates 1/2 of the weights"),
                  std::string::npos)
            << shared;
        EXPECT_NE(shared.find("weights (one copy for the 2 ranks of this machine)"),
                  std::string::npos)
            << shared;
        expect_same(precision + "_np2_one", precision + "_np2_shared", loss_tolerance,
                    weights_tolerance);
        (void)run(3, 1, 2, 2, p + " --share-memory off", precision + "_np3_one");
        (void)run(3, 1, 2, 2, p, precision + "_np3_shared");
        (void)run(3, 1, 2, 2, p, precision + "_np3_shared_again");
        expect_same(precision + "_np3_one", precision + "_np3_shared", loss_tolerance,
                    weights_tolerance);
        EXPECT_EQ(
            test::metrics_values(dir / (precision + "_np3_shared.jsonl"), "train", "loss"),
            test::metrics_values(dir / (precision + "_np3_shared_again.jsonl"), "train", "loss"));
        const LoadedModel first =
            load_checkpoint(dir / (precision + "_np3_shared/model_000020.bin"));
        const LoadedModel again =
            load_checkpoint(dir / (precision + "_np3_shared_again/model_000020.bin"));
        EXPECT_TRUE(std::equal(first.model.params.span().begin(), first.model.params.span().end(),
                               again.model.params.span().begin()));
    }
    // Shared to one rank, and plain to shared on 3 ranks (12 sequences per step throughout).
    (void)run(2, 2, 3, 2, "--max-steps 10", "to_one");
    (void)run(1, 2, 6, 2, "--max-steps 20 --resume auto", "to_one");
    expect_same("fp32_np2_one", "to_one", 1e-5);
    (void)run(2, 2, 3, 2, "--max-steps 10 --share-memory off", "to_shared");
    (void)run(3, 1, 2, 2, "--max-steps 20 --resume auto", "to_shared");
    expect_same("fp32_np2_one", "to_shared", 1e-5);
}

// Several ranks on each of several machines (simulated: --simulate-machines cuts the world into
// machines of consecutive ranks): each machine shares one copy of the weights, and each slice of
// the gradient takes one allreduce between the machines' ranks that own it. The same training as
// one allreduce of every rank's gradient, bitwise repeatable; its checkpoint (moments from the
// first machine's slices) resumes on one rank, and a plain checkpoint resumes into it, both as
// the uninterrupted run.
TEST(MpiTraining, RanksOnSeveralMachinesShareEachMachineAndAllreduceItsSlices) {
    const ScratchDir dir("gpt2-mpi-machines");
    test::write_corpus(dir.path() / "corpus.txt", 60000);
    const std::string base = test::build_path("train_gpt2") +
                             test::without_given(kModelFlags, "--checkpoint-every") + " --data " +
                             (dir / "corpus.txt") + " --lr-decay-steps 20 --checkpoint-every 10";
    const std::string common = base + " --threads 1";
    const auto run = [&](int ranks, int batch, const std::string& extra, const std::string& name) {
        return run_named(
            dir, ranks,
            common + " --batch-size " + std::to_string(batch) + " --grad-accum 2 " + extra, name);
    };
    const auto expect_same = [&](const std::string& a_name, const std::string& b_name,
                                 double tolerance) {
        expect_same_training(dir, a_name, b_name, tolerance);
    };
    // 24 sequences per step throughout: 4 ranks x 3 x 2 micro-steps, or 1 rank x 12 x 2.
    (void)run(4, 3, "--max-steps 20 --share-memory off", "one");
    // The slices travel in buckets while backward runs (auto: 25 MiB, here one bucket; 0.004
    // MiB: many, each waiting for both ranks of its machine), or in one allreduce after it.
    const std::string machines = run(4, 3, "--max-steps 20 --simulate-machines 2", "machines");
    expect_logged(machines,
                  "shared memory on each machine, each rank sums and updates 1/2 of the "
                  "weights, and its slice is summed across the 2 machines in buckets of "
                  "25 MiB while backward runs");
    expect_logged(machines, "(one copy for the 2 ranks of this machine)");
    expect_same("one", "machines", 1e-6);
    const std::string after =
        run(4, 3, "--max-steps 20 --simulate-machines 2 --bucket-mb 0", "machines_after");
    expect_logged(after,
                  "its slice is summed across the 2 machines in one allreduce after "
                  "backward");
    expect_same("one", "machines_after", 1e-6);
    const std::string tiny =
        run(4, 3, "--max-steps 20 --simulate-machines 2 --bucket-mb 0.004", "machines_tiny");
    expect_logged(tiny, "in buckets of 0.004 MiB while backward runs");
    expect_same("one", "machines_tiny", 1e-6);
    (void)run(4, 3, "--max-steps 20 --simulate-machines 2 --bucket-mb 0.004", "machines_again");
    EXPECT_EQ(test::metrics_values(dir / "machines_tiny.jsonl", "train", "loss"),
              test::metrics_values(dir / "machines_again.jsonl", "train", "loss"));
    const LoadedModel first = load_checkpoint(dir / "machines_tiny/model_000020.bin");
    const LoadedModel again = load_checkpoint(dir / "machines_again/model_000020.bin");
    EXPECT_TRUE(std::equal(first.model.params.span().begin(), first.model.params.span().end(),
                           again.model.params.span().begin()));
    // A BPE vocabulary larger than the step's embedding rows (4 ranks x 2 x 32 rows of 33 floats
    // against about 300 x 32 in wte), so that the rows travel on their own: each rank adds the
    // world's rows that fall in its slice.
    const std::string bpe = " --tokenizer bpe --vocab-size 400 --max-steps 20";
    (void)run(4, 2, bpe + " --share-memory off", "bpe_one");
    (void)run(4, 2, bpe + " --simulate-machines 2 --bucket-mb 0.004", "bpe_machines");
    expect_same("bpe_one", "bpe_machines", 1e-6);
    // The gradient norm of the first machine's slices clips on every machine, so machines whose
    // ranks sum their slices' squares over different numbers of threads stay bitwise equal
    // (--check-replicas compares every rank's weights at every step; clipping on every step).
    const std::string mixed_flags =
        " --batch-size 3 --grad-accum 2 --max-steps 20 "
        "--simulate-machines 2 --check-replicas 1 --grad-clip 0.05 --out-dir " +
        (dir / "mixed");
    const auto mixed = run_command(mpiexec(2) + base + mixed_flags + " --threads 1 : -n 2 " + base +
                                   mixed_flags + " --threads 3");
    EXPECT_EQ(mixed.exit_code, 0) << mixed.output;
    EXPECT_EQ(mixed.output.find("replicas diverged"), std::string::npos) << mixed.output;
    EXPECT_NE(mixed.output.find("step 20/20 | loss"), std::string::npos) << mixed.output;
    // A machine that cannot share its memory makes every machine train without sharing: ZeRO-1
    // slices instead, the same training.
    const std::string fallback =
        run(4, 3, "--max-steps 20 --simulate-machines 2 --inject-share-failure", "fallback");
    expect_logged(fallback,
                  "shared memory is off for this run (another machine could not map its "
                  "shared memory): each rank keeps its own weights and a slice of the "
                  "optimizer instead (ZeRO-1)");
    expect_logged(fallback, "ZeRO-1, one reduce-scatter after backward");
    expect_same("one", "fallback", 1e-5);
    // One rank on each of the 4 machines has nothing to share: overlapped buckets (auto).
    const std::string four = run(4, 3, "--max-steps 2 --simulate-machines 4", "four");
    expect_logged(four,
                  "buckets of 25 MiB, summed while backward runs (auto: ranks on several "
                  "machines)");
    // Its checkpoint to one rank, and a plain one into it.
    (void)run(4, 3, "--max-steps 10 --simulate-machines 2", "to_one");
    (void)run(1, 12, "--max-steps 20 --resume auto", "to_one");
    expect_same("one", "to_one", 1e-5);
    (void)run(4, 3, "--max-steps 10 --share-memory off", "to_machines");
    (void)run(4, 3, "--max-steps 20 --resume auto --simulate-machines 2", "to_machines");
    expect_same("one", "to_machines", 1e-5);
}

// Elastic resume: a run checkpointed with 1 rank x batch 8 continues on 2 ranks x batch 2 with
// grad accum 2 derived (the same 8 sequences per step) and matches the uninterrupted run; 3 ranks
// x batch 2 cannot make 8 and is refused with the arithmetic.
TEST(MpiTraining, ResumingOnOtherRanksKeepsTheGlobalBatchOrSaysWhyNot) {
    const ScratchDir dir("gpt2-mpi-elastic");
    test::write_corpus(dir.path() / "corpus.txt", 60000);
    const std::string common = test::build_path("train_gpt2") +
                               test::without_given(kModelFlags, "--checkpoint-every") + " --data " +
                               (dir / "corpus.txt") + " --lr-decay-steps 20 --checkpoint-every 10";
    const auto whole = run_command(mpiexec(1) + common + " --threads 2 --batch-size 8 " +
                                   "--max-steps 20 --out-dir " + (dir / "whole") +
                                   " --metrics-file " + (dir / "whole.jsonl"));
    ASSERT_EQ(whole.exit_code, 0) << whole.output;
    const auto first = run_command(mpiexec(1) + common + " --threads 2 --batch-size 8 " +
                                   "--max-steps 10 --out-dir " + (dir / "elastic") +
                                   " --metrics-file " + (dir / "elastic.jsonl"));
    ASSERT_EQ(first.exit_code, 0) << first.output;

    const auto refused = run_command(mpiexec(3) + common + " --threads 1 --batch-size 2 " +
                                     "--max-steps 20 --resume auto --out-dir " + (dir / "elastic"));
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_NE(refused.output.find("the checkpoint's global batch is 8 sequences per step, which 3 "
                                  "ranks x --batch-size 2 = 6 per micro-step does not divide"),
              std::string::npos)
        << refused.output;

    const auto resumed = run_command(mpiexec(2) + common + " --threads 1 --batch-size 2 " +
                                     "--max-steps 20 --resume auto --out-dir " + (dir / "elastic") +
                                     " --metrics-file " + (dir / "elastic.jsonl"));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("elastic resume: 2 ranks x batch 2 x grad accum 2 keeps the "
                                  "checkpoint's 8 sequences per step"),
              std::string::npos)
        << resumed.output;
    const std::vector<double> expected = test::metrics_values(dir / "whole.jsonl", "train", "loss");
    const std::vector<double> actual = test::metrics_values(dir / "elastic.jsonl", "train", "loss");
    ASSERT_EQ(expected.size(), 20u);
    ASSERT_EQ(actual.size(), 20u);
    for (std::size_t s = 0; s < 20; ++s)
        EXPECT_NEAR(actual[s], expected[s], 1e-5 * expected[s]) << "step " << s + 1;
    const LoadedModel a = load_checkpoint(dir / "whole/model_000020.bin");
    const LoadedModel b = load_checkpoint(dir / "elastic/model_000020.bin");
    EXPECT_TRUE(test::same_training(a.model.config, b.model.params.span(), a.model.params.span(),
                                    1e-5, 1e-2));
}

// ZeRO-1 trains as plain data parallelism (2 ranks x 2 workers, 3 ranks x 1), with each rank's
// moments a shard, after backward or in overlapped buckets; its checkpoints hold the whole
// moments, so a ZeRO run checkpointed on 3 ranks resumes on 2 (re-sharded, grad accum derived)
// and still matches the plain run.
TEST(MpiTraining, ZeroOneTrainsAsPlainAndItsCheckpointsMoveBetweenRankCounts) {
    const ScratchDir dir("gpt2-mpi-zero");
    test::write_corpus(dir.path() / "corpus.txt", 60000);
    const std::string common = test::build_path("train_gpt2") +
                               test::without_given(kModelFlags, "--checkpoint-every") + " --data " +
                               (dir / "corpus.txt") + " --lr-decay-steps 20 --checkpoint-every 10";
    const auto run = [&](int ranks, int threads, int batch, const std::string& extra,
                         const std::string& name) {
        const auto result =
            run_command(mpiexec(ranks) + common + " --threads " + std::to_string(threads) +
                        " --batch-size " + std::to_string(batch) + " " + extra + " --out-dir " +
                        (dir / name) + " --metrics-file " + (dir / (name + ".jsonl")));
        EXPECT_EQ(result.exit_code, 0) << result.output;
        return result.output;
    };
    (void)run(2, 2, 6, "--max-steps 20", "plain");
    const std::string zero2 = run(2, 2, 6, "--max-steps 20 --zero 1", "zero2");
    EXPECT_NE(zero2.find("AdamW moments (ZeRO-1: this rank's slice of 2)"), std::string::npos)
        << zero2;
    // Summed in tiny overlapped buckets, on 2 and 3 ranks, bitwise repeatable.
    const std::string buckets = run(2, 2, 6, "--max-steps 20 --zero 1 --bucket-mb 0.004", "zb2");
    EXPECT_NE(buckets.find("ZeRO-1, summed in buckets of 0.004 MiB while backward runs, each rank "
                           "keeping its slice"),
              std::string::npos)
        << buckets;
    (void)run(3, 1, 4, "--max-steps 20 --zero 1 --bucket-mb 0.004", "zb3");
    (void)run(3, 1, 4, "--max-steps 20 --zero 1 --bucket-mb 0.004", "zb3_again");
    EXPECT_EQ(test::metrics_values(dir / "zb3.jsonl", "train", "loss"),
              test::metrics_values(dir / "zb3_again.jsonl", "train", "loss"));
    (void)run(3, 1, 4, "--max-steps 10 --zero 1", "moved");
    const std::string moved = run(2, 1, 3, "--max-steps 20 --zero 1 --resume auto", "moved");
    EXPECT_NE(moved.find("grad accum 2 keeps the checkpoint's 12 sequences"), std::string::npos)
        << moved;

    const std::vector<double> expected = test::metrics_values(dir / "plain.jsonl", "train", "loss");
    ASSERT_EQ(expected.size(), 20u);
    const LoadedModel reference = load_checkpoint(dir / "plain/model_000020.bin");
    for (const std::string name : {"zero2", "moved", "zb2", "zb3"}) {
        const std::vector<double> actual =
            test::metrics_values(dir / (name + ".jsonl"), "train", "loss");
        ASSERT_EQ(actual.size(), expected.size()) << name;
        for (std::size_t s = 0; s < expected.size(); ++s)
            EXPECT_NEAR(actual[s], expected[s], 1e-5 * expected[s]) << name << " step " << s + 1;
        const LoadedModel other = load_checkpoint(dir / (name + "/model_000020.bin"));
        EXPECT_TRUE(test::same_training(reference.model.config, other.model.params.span(),
                                        reference.model.params.span(), 1e-5, 1e-2))
            << name;
    }
    const std::string local = run(2, 1, 6, "--max-steps 1 --share-memory off", "local");
    EXPECT_NE(local.find("one allreduce after backward (--share-memory off)"), std::string::npos)
        << local;
    const std::string alone = run(1, 1, 6, "--max-steps 1 --zero 1", "alone");
    EXPECT_NE(alone.find("--zero 1 with one rank: there is nothing to slice"), std::string::npos)
        << alone;
    const auto bad_size = run_command(mpiexec(1) + common + " --bucket-mb lots");
    EXPECT_EQ(bad_size.exit_code, 2) << bad_size.output;
    EXPECT_NE(bad_size.output.find("lots is not auto or a size in MiB"), std::string::npos)
        << bad_size.output;
}

// Every rank logs checksums of what it holds (--log-level debug); rank 1 is given a corpus path
// that does not exist, so it can only have its tokens from rank 0's broadcast.
TEST(MpiTraining, RanksReceiveTokenizerAndTokensFromRankZero) {
    const ScratchDir dir("gpt2-mpi-bcast");
    test::write_corpus(dir.path() / "corpus.txt", 30000);
    const std::string common =
        kModelFlags + " --max-steps 1 --batch-size 2 --threads 1 --log-level debug --out-dir " +
        (dir / "out");
    const std::string command = mpiexec(1) + test::build_path("train_gpt2") + common + " --data " +
                                (dir / "corpus.txt") + " : -n 1 " + test::build_path("train_gpt2") +
                                common + " --data " + (dir / "only-rank-0-has-it/corpus.txt");
    const auto result = run_command(command);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const std::regex pattern(
        R"(rank (\d): tokenizer ([0-9a-f]{16}) \((\d+) bytes\), train tokens ([0-9a-f]{16}), val tokens ([0-9a-f]{16}))");
    std::set<std::string> seen_ranks, fingerprints;
    for (auto it = std::sregex_iterator(result.output.begin(), result.output.end(), pattern);
         it != std::sregex_iterator(); ++it) {
        seen_ranks.insert((*it)[1].str());
        fingerprints.insert((*it)[2].str() + (*it)[3].str() + (*it)[4].str() + (*it)[5].str());
    }
    EXPECT_EQ(seen_ranks, (std::set<std::string>{"0", "1"})) << result.output;
    EXPECT_EQ(fingerprints.size(), 1u) << result.output;
}

// A failure on one rank while the others wait in a collective must end the whole job, fast,
// with a message naming the rank and the cause.
struct FailureCase {
    const char* name;
    const char* rank0_flags;
    const char* rank1_flags;
    int expected_exit;  // 0: any non-zero
    const char* expected_text;
};

class MpiFailure : public ::testing::TestWithParam<FailureCase> {};

TEST_P(MpiFailure, EndsTheWholeJobQuicklyWithAClearMessage) {
    const FailureCase& c = GetParam();
    const ScratchDir dir(std::string("gpt2-mpi-fail-") + c.name);
    test::write_corpus(dir.path() / "corpus.txt", 30000);
    const std::string common = kModelFlags +
                               " --max-steps 3 --batch-size 2 --threads 1 --out-dir " +
                               (dir / "out") + " --data " + (dir / "corpus.txt");
    const std::string train = test::build_path("train_gpt2");
    // A rank's own flags replace the common ones (a flag given twice is refused).
    const std::string command = "timeout 120 " + mpiexec(1) + train +
                                test::without_given(common, c.rank0_flags) + " " + c.rank0_flags +
                                " : -n 1 " + train + test::without_given(common, c.rank1_flags) +
                                " " + c.rank1_flags;
    const auto result = run_command(command);
    if (c.expected_exit != 0) {
        EXPECT_EQ(result.exit_code, c.expected_exit) << result.output;
    } else {
        EXPECT_NE(result.exit_code, 0) << result.output;
    }
    EXPECT_NE(result.exit_code, 124) << "the job hung until the timeout:\n" << result.output;
    EXPECT_NE(result.output.find(c.expected_text), std::string::npos) << result.output;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MpiFailure,
    ::testing::Values(FailureCase{"rank1_bad_value", "", "--batch-size 0", 2,
                                  "rank 1 of 2): the ranks' command lines differ"},
                      FailureCase{"rank0_missing_corpus", "--data /nonexistent/corpus.txt", "", 0,
                                  "rank 0 of 2): /nonexistent/corpus.txt"},
                      FailureCase{"rank1_unparsable_flag", "", "--lr not-a-number", 2, "--lr"}),
    [](const ::testing::TestParamInfo<FailureCase>& info) { return std::string(info.param.name); });

// ---- 64-bit sizes ----

TEST(Chunks, BuffersBeyondTwoToThe31ElementsTravelInIntSizedPieces) {
    const std::size_t total = (std::size_t{1} << 31) + 5;
    const std::vector<Chunk> chunks = chunk_ranges(total, std::size_t{1} << 30);
    ASSERT_EQ(chunks.size(), 3u);
    std::size_t next = 0;
    for (const Chunk& c : chunks) {
        EXPECT_EQ(c.begin, next);
        EXPECT_LE(c.count, static_cast<std::size_t>(INT32_MAX));
        next += c.count;
    }
    EXPECT_EQ(next, total);
    // A maximum above INT_MAX is capped: MPI counts are int.
    for (const Chunk& c : chunk_ranges(std::size_t{5} << 31, std::size_t{1} << 40))
        EXPECT_LE(c.count, static_cast<std::size_t>(INT32_MAX));
    EXPECT_TRUE(chunk_ranges(0, 8).empty());
}

TEST_F(TrainRun, TheChunkedMpiPathGivesTheSameTrainingAsOneCall) {
    const auto whole =
        train("--max-steps 3 --metrics-file " + path("a.jsonl") + " --out-dir " + path("a"), 2);
    ASSERT_EQ(whole.exit_code, 0) << whole.output;
    // Tokens, parameters and gradients all cross in pieces of 1000 elements.
    const auto chunked = train("--max-steps 3 --mpi-chunk-elements 1000 --metrics-file " +
                                   path("b.jsonl") + " --out-dir " + path("b"),
                               2);
    ASSERT_EQ(chunked.exit_code, 0) << chunked.output;
    const auto a = test::metrics_records(path("a.jsonl"), "train");
    const auto b = test::metrics_records(path("b.jsonl"), "train");
    ASSERT_EQ(a.size(), 3u);
    ASSERT_EQ(b.size(), 3u);
    for (std::size_t i = 0; i < a.size(); ++i)
        EXPECT_EQ(a[i]["loss"], b[i]["loss"]) << "step " << i + 1;
}

}  // namespace
}  // namespace gpt2
