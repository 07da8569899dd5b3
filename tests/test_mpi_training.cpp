// Data parallelism through mpiexec: the same global batch trains the same model however it is
// split over ranks, threads and micro-steps; ranks other than 0 never open the corpus; an error
// on any rank ends the whole job quickly.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "formats/checkpoint.hpp"
#include "parallel/comm.hpp"
#include "process_support.hpp"
#include "shared_runs.hpp"
#include "test_support.hpp"
#include "train/log_lines.hpp"
#include "train_run_fixture.hpp"

namespace gpt2 {
namespace {

using test::TrainRun;

using test::mpiexec;
using test::run_command;
using test::ScratchDir;
using test::SharedRuns;

// AdamW pinned: these tests are about how the gradient travels between ranks and workers (Muon's
// exchange: test_muon_training.cpp), and --optimizer auto would take Muon at some of their batches.
const std::string kModelFlags =
    test::small_model(32) +
    " --optimizer adamw --lr 1e-3 --warmup-steps 2 --eps 1e-5"
    " --val-every 0 --sample-every 0 --checkpoint-every 0 --seed 5 --val-tokens 256"
    " --verbose";  // the start-up's memory line says how the ranks share the weights

// The runs of one group of tests: made once for all its TESTs (shared_runs.hpp), on one corpus.
SharedRuns runs_with_corpus(const std::string& group) {
    SharedRuns runs(group);
    runs.once("corpus", [&] { test::write_corpus(runs.path() / "corpus.txt", 60000); });
    return runs;
}

// The flags of the runs that checkpoint at step 10 and resume from there (schedule of 20 steps).
std::string resumable(const SharedRuns& runs) {
    return test::build_path("train_gpt2") + test::without_given(kModelFlags, "--checkpoint-every") +
           " --data " + (runs / "corpus.txt") + " --lr-decay-steps 20 --checkpoint-every 10";
}

// train_gpt2 `flags` on `ranks` ranks with its out-dir and metrics file named `name`.
std::string named(const SharedRuns& runs, int ranks, const std::string& flags,
                  const std::string& name) {
    return mpiexec(ranks) + flags + " --out-dir " + (runs / name) + " --metrics-file " +
           (runs / (name + ".jsonl"));
}

// `commands` run once as `name`; each must succeed: the last one's output.
std::string succeeded(const SharedRuns& runs, const std::string& name,
                      const std::vector<std::string>& commands) {
    const std::vector<test::ProcessResult> results = runs.run(name, commands);
    for (std::size_t i = 0; i < results.size(); ++i)
        EXPECT_EQ(results[i].exit_code, 0)
            << name << " command " << i + 1 << ": " << commands[i] << "\n"
            << results[i].output;
    return results.empty() ? std::string() : results.back().output;
}

// The log `output` says `text`.
void expect_logged(const std::string& output, const std::string& text) {
    EXPECT_NE(output.find(text), std::string::npos) << "expected: " << text << "\n" << output;
}

std::string checkpoint_of(const SharedRuns& runs, const std::string& name, int step) {
    char file[32];
    std::snprintf(file, sizeof file, "/model_%06d.bin", step);
    return runs / (name + file);
}

std::vector<double> losses_of(const SharedRuns& runs, const std::string& name) {
    return test::metrics_values(runs / (name + ".jsonl"), "train", "loss");
}

// Runs `a_name` and `b_name` of `steps` steps: losses within `tolerance` relative, final weights
// as same_training with `weights_tolerance`.
void expect_same_training(const SharedRuns& runs, const std::string& a_name,
                          const std::string& b_name, double tolerance,
                          double weights_tolerance = 1e-5, int steps = 20) {
    const std::vector<double> a = losses_of(runs, a_name);
    const std::vector<double> b = losses_of(runs, b_name);
    ASSERT_EQ(a.size(), static_cast<std::size_t>(steps)) << a_name;
    ASSERT_EQ(b.size(), a.size()) << b_name;
    for (std::size_t s = 0; s < a.size(); ++s)
        EXPECT_NEAR(b[s], a[s], tolerance * a[s]) << b_name << " step " << s + 1;
    const LoadedModel ma = load_checkpoint(checkpoint_of(runs, a_name, steps));
    const LoadedModel mb = load_checkpoint(checkpoint_of(runs, b_name, steps));
    EXPECT_TRUE(test::same_training(ma.model.config, mb.model.params.span(), ma.model.params.span(),
                                    weights_tolerance, 1e-2))
        << b_name;
}

// The final weights of `a_name` and `b_name` (of `steps` steps) bitwise equal.
void expect_same_weights(const SharedRuns& runs, const std::string& a_name,
                         const std::string& b_name, int steps = 20) {
    const LoadedModel a = load_checkpoint(checkpoint_of(runs, a_name, steps));
    const LoadedModel b = load_checkpoint(checkpoint_of(runs, b_name, steps));
    EXPECT_TRUE(std::equal(a.model.params.span().begin(), a.model.params.span().end(),
                           b.model.params.span().begin()))
        << a_name << " vs " << b_name;
}

// ---- One global batch split over ranks, threads and micro-steps ----

// 8 sequences per step in every case, 10 steps.
std::string split_run(int ranks, int threads, int batch, int accum) {
    const SharedRuns runs = runs_with_corpus("split");
    const std::string name = "np" + std::to_string(ranks) + "_w" + std::to_string(threads) + "_b" +
                             std::to_string(batch) + "_accum" + std::to_string(accum);
    const std::string flags = test::build_path("train_gpt2") + kModelFlags + " --data " +
                              (runs / "corpus.txt") + " --max-steps 10 --threads " +
                              std::to_string(threads) + " --batch-size " + std::to_string(batch) +
                              " --grad-accum " + std::to_string(accum);
    (void)succeeded(runs, name, {named(runs, ranks, flags, name)});  // the log is not checked
    return name;
}

// The split against one rank of 4 workers taking the 8 sequences at once. Each worker takes 2
// sequences a micro-step in every split, so the first step (the same weights) computes the same
// per-token losses, and its loss, added sequence by sequence in the step's order, is the same
// bits however the sequences were spread over ranks, workers and micro-steps.
void expect_split_trains_as_one_rank(int ranks, int threads, int batch, int accum) {
    const std::string reference = split_run(1, 4, 8, 1);
    const std::string other = split_run(ranks, threads, batch, accum);
    expect_same_training(SharedRuns("split"), reference, other, 1e-5, 1e-5, 10);
    EXPECT_EQ(losses_of(SharedRuns("split"), other).front(),
              losses_of(SharedRuns("split"), reference).front());
}

TEST(MpiTraining, TwoRanksOfTwoWorkersTrainAsOneRankOfFour) {
    expect_split_trains_as_one_rank(2, 2, 4, 1);
}

TEST(MpiTraining, FourRanksOfOneWorkerTrainAsOneRankOfFour) {
    expect_split_trains_as_one_rank(4, 1, 2, 1);
}

TEST(MpiTraining, FourMicroStepsOnOneWorkerTrainAsOneStepOfTheirSequences) {
    expect_split_trains_as_one_rank(1, 1, 2, 4);
}

// ---- Dropout ----

// Dropout draws its masks by each sequence's place in the step, not by thread or rank. The
// schedule spans 10 steps however many the first start runs.
const std::string kDropout = " --max-steps 10 --dropout 0.2 --lr-decay-steps 10";

// A run of 10 steps (`extra` after the common flags): its name; its log in `log`.
std::string dropout_run(int ranks, int threads, int batch, int accum, const std::string& extra,
                        const std::string& name, std::string* log = nullptr) {
    const SharedRuns runs = runs_with_corpus("dropout");
    const std::string flags = test::build_path("train_gpt2") + kModelFlags + " --data " +
                              (runs / "corpus.txt") + " --threads " + std::to_string(threads) +
                              " --batch-size " + std::to_string(batch) + " --grad-accum " +
                              std::to_string(accum) + extra;
    const std::string output = succeeded(runs, name, {named(runs, ranks, flags, name)});
    if (log != nullptr) *log = output;
    return name;
}

TEST(MpiTraining, DropoutSaysWhereItApplies) {
    std::string log;
    (void)dropout_run(1, 1, 8, 1, kDropout, "np1_w1", &log);
    expect_logged(log,
                  "dropout 0.2 on the embeddings, the attention probabilities and the attention "
                  "and MLP outputs (training steps only)");
}

TEST(MpiTraining, DropoutTrainsAlikeHoweverTheStepIsSplit) {
    const std::string reference = dropout_run(1, 1, 8, 1, kDropout, "np1_w1");
    for (const std::string& name :
         {dropout_run(1, 3, 8, 1, kDropout, "np1_w3"), dropout_run(1, 4, 8, 1, kDropout, "np1_w4"),
          dropout_run(2, 2, 4, 1, kDropout, "np2_w2"),
          dropout_run(1, 1, 2, 4, kDropout, "np1_w1_accum4")})
        expect_same_training(SharedRuns("dropout"), reference, name, 1e-5, 1e-5, 10);
}

TEST(MpiTraining, DropoutChangesTheTraining) {
    const SharedRuns runs("dropout");
    const std::vector<double> with = losses_of(runs, dropout_run(1, 1, 8, 1, kDropout, "np1_w1"));
    const std::vector<double> without =
        losses_of(runs, dropout_run(1, 1, 8, 1, " --max-steps 10", "no_dropout"));
    ASSERT_EQ(with.size(), 10u);
    ASSERT_FALSE(without.empty());
    EXPECT_GT(std::abs(without[0] - with[0]), 1e-4) << "dropout changed nothing";
}

// Stopped at step 5 (a checkpoint) and resumed with 2 ranks: bitwise the straight run.
TEST(MpiTraining, DropoutResumesBitwise) {
    const SharedRuns runs = runs_with_corpus("dropout");
    const std::string straight = dropout_run(2, 2, 4, 1, kDropout, "np2_w2");
    const std::string flags = test::build_path("train_gpt2") + kModelFlags + " --data " +
                              (runs / "corpus.txt") + " --threads 2 --batch-size 4 --grad-accum 1";
    (void)succeeded(  // the log is not checked: the weights are
        runs, "resumed",
        {named(runs, 2, flags + " --max-steps 5 --dropout 0.2 --lr-decay-steps 10", "resumed"),
         named(runs, 2, flags + kDropout + " --resume auto", "resumed")});
    expect_same_weights(runs, "resumed", straight, 10);
}

// ---- Document masking in attention ----

// Documents of 5 to 60 words separated by <|endoftext|> (the end-of-text token for a trained
// BPE), about `bytes` bytes.
void write_documents(const std::filesystem::path& path, std::size_t bytes) {
    static constexpr std::array<const char*, 8> kWords = {"the",  "king", "shall", "speak",
                                                          "love", "war",  "my",    "lord"};
    std::ofstream out(path, std::ios::binary);
    std::uint64_t state = 777;
    std::size_t written = 0;
    while (written < bytes) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        for (std::uint64_t w = 0, n = 5 + (state >> 40) % 56; w < n; ++w) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            const std::string word = kWords[(state >> 33) % kWords.size()];
            out << word << ' ';
            written += word.size() + 1;
        }
        out << "<|endoftext|>";
        written += 13;
    }
}

const std::string kDocuments = " --max-steps 10 --tokenizer bpe --vocab-size 300";

// A run of 10 steps on the documents corpus (`extra` after the common flags): its name.
std::string documents_run(int ranks, int threads, int batch, const std::string& extra,
                          const std::string& name, std::string* log = nullptr) {
    SharedRuns runs("documents");
    runs.once("corpus", [&] { write_documents(runs.path() / "corpus.txt", 30000); });
    const std::string flags = test::build_path("train_gpt2") + kModelFlags + " --data " +
                              (runs / "corpus.txt") + " --threads " + std::to_string(threads) +
                              " --batch-size " + std::to_string(batch) + kDocuments + extra;
    const std::string output = succeeded(runs, name, {named(runs, ranks, flags, name)});
    if (log != nullptr) *log = output;
    return name;
}

const std::string kWithinDocuments = " --attention-within-documents";

TEST(MpiTraining, AttentionWithinDocumentsTrainsAlikeOnOneAndTwoRanks) {
    std::string log;
    const std::string reference = documents_run(1, 1, 8, kWithinDocuments, "np1_w1", &log);
    // (The trained BPE's end-of-text id depends on how many merges the corpus offered.)
    expect_logged(log,
                  "attention within documents: a token attends only to its own document's "
                  "tokens, a document beginning at each end-of-text token (id ");
    expect_logged(log, ") and at each window's start");
    expect_same_training(SharedRuns("documents"), reference,
                         documents_run(2, 2, 4, kWithinDocuments, "np2_w2"), 1e-5, 1e-5, 10);
    // Masking changed the training (the windows hold several documents).
    const std::vector<double> unmasked =
        losses_of(SharedRuns("documents"), documents_run(1, 1, 8, "", "unmasked"));
    const std::vector<double> masked = losses_of(SharedRuns("documents"), reference);
    ASSERT_FALSE(unmasked.empty());
    ASSERT_FALSE(masked.empty());
    EXPECT_GT(std::abs(unmasked[0] - masked[0]), 1e-5 * masked[0]) << "masking changed nothing";
}

// The char tokenizer has no end-of-text token: refused with one line, exit 2.
TEST(MpiTraining, AttentionWithinDocumentsIsRefusedForATokenizerWithoutEndOfText) {
    const ScratchDir dir("gpt2-mpi-documents-char");
    test::write_corpus(dir.path() / "corpus.txt", 3000);
    const auto refused = run_command(test::build_path("train_gpt2") + kModelFlags + " --data " +
                                     (dir.path() / "corpus.txt").string() + " --out-dir " +
                                     (dir.path() / "out").string() + kWithinDocuments);
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_NE(refused.output.find("error: --attention-within-documents: the char tokenizer has no "
                                  "end-of-text token to begin documents at (use --tokenizer bpe "
                                  "or gpt2)"),
              std::string::npos)
        << refused.output;
}

// ---- The overlapped, bucketed allreduce ----

// With the char vocabulary (embedding rows summed in the rank's buffer) and with a BPE vocabulary
// large enough that the last micro-batch's embedding rows travel separately; with many tiny
// buckets, the default and none; for 2 ranks x 2 workers with gradient accumulation and 3 ranks x
// 1 worker.
struct BucketRun {
    std::string name;
    int ranks, threads, batch, accum;
    std::string bucket_mb;
};
// "0" alone would share memory on one machine: --share-memory off keeps one allreduce.
const BucketRun kNp2One{"np2_one", 2, 2, 4, 2, "0 --share-memory off"};
const BucketRun kNp2Tiny{"np2_tiny", 2, 2, 4, 2, "0.004"};
const BucketRun kNp2TinyAgain{"np2_tiny_again", 2, 2, 4, 2, "0.004"};
const BucketRun kNp2Default{"np2_default", 2, 2, 4, 2, "25"};
const BucketRun kNp3One{"np3_one", 3, 1, 4, 1, "0 --share-memory off"};
const BucketRun kNp3Tiny{"np3_tiny", 3, 1, 4, 1, "0.004"};

// The run `r` with `tokenizer` (char or bpe), made once: its name. Its log says how the gradient
// is summed.
std::string bucket_run(const std::string& tokenizer, const BucketRun& r) {
    const SharedRuns runs = runs_with_corpus("buckets");
    const std::string vocab = tokenizer == "bpe" ? " --tokenizer bpe --vocab-size 400" : "";
    const std::string name = tokenizer + "_" + r.name;
    const std::string flags = test::build_path("train_gpt2") + kModelFlags + vocab + " --data " +
                              (runs / "corpus.txt") + " --max-steps 10 --threads " +
                              std::to_string(r.threads) + " --batch-size " +
                              std::to_string(r.batch) + " --grad-accum " + std::to_string(r.accum) +
                              " --bucket-mb " + r.bucket_mb;
    expect_logged(succeeded(runs, name, {named(runs, r.ranks, flags, name)}),
                  std::string(r.bucket_mb.starts_with("0 ") ? log_lines::kOneAllreduce
                                                            : log_lines::kSummedWhileBackward));
    return name;
}

class BucketedAllreduce : public ::testing::TestWithParam<std::string> {};

TEST_P(BucketedAllreduce, TinyBucketsOnTwoRanksTrainAsOneAllreduce) {
    expect_same_training(SharedRuns("buckets"), bucket_run(GetParam(), kNp2One),
                         bucket_run(GetParam(), kNp2Tiny), 1e-6, 1e-5, 10);
}

TEST_P(BucketedAllreduce, DefaultBucketsOnTwoRanksTrainAsOneAllreduce) {
    expect_same_training(SharedRuns("buckets"), bucket_run(GetParam(), kNp2One),
                         bucket_run(GetParam(), kNp2Default), 1e-6, 1e-5, 10);
}

TEST_P(BucketedAllreduce, TinyBucketsOnThreeRanksTrainAsOneAllreduce) {
    expect_same_training(SharedRuns("buckets"), bucket_run(GetParam(), kNp3One),
                         bucket_run(GetParam(), kNp3Tiny), 1e-6, 1e-5, 10);
}

TEST_P(BucketedAllreduce, RepeatedRunsAreBitwiseEqual) {
    const SharedRuns runs("buckets");
    const std::string first = bucket_run(GetParam(), kNp2Tiny);
    const std::string again = bucket_run(GetParam(), kNp2TinyAgain);
    EXPECT_EQ(losses_of(runs, first), losses_of(runs, again));
    expect_same_weights(runs, first, again, 10);
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, BucketedAllreduce, ::testing::Values("char", "bpe"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                             return info.param;
                         });

// ---- Ranks on one machine share the weights ----

// Ranks on one machine share one copy of the weights and sum the gradient in shared memory (the
// default there): for 2 ranks x 2 workers with gradient accumulation and 3 ranks x 1 worker, in
// fp32 and bf16, 12 sequences per step throughout.
std::string shared_memory_run(int ranks, int threads, int batch, const std::string& extra,
                              const std::string& name,
                              const std::vector<std::string>& resumed_with = {}) {
    const SharedRuns runs = runs_with_corpus("shared");
    const auto command = [&](int n, int t, int b, const std::string& flags) {
        return named(runs, n,
                     resumable(runs) + " --threads " + std::to_string(t) + " --batch-size " +
                         std::to_string(b) + " --grad-accum 2 " + flags,
                     name);
    };
    std::vector<std::string> commands = {command(ranks, threads, batch, extra)};
    // A later start in the same out-dir: ranks, threads, batch, then its flags.
    if (!resumed_with.empty())
        commands.push_back(command(std::stoi(resumed_with[0]), std::stoi(resumed_with[1]),
                                   std::stoi(resumed_with[2]), resumed_with[3]));
    return succeeded(runs, name, commands);
}

// bf16 rounds the weights for the products, so that a last-bit difference in the norm's
// summation order can move a product: the bf16 tolerance of test_precision's rank splits.
class SharedMemory : public ::testing::TestWithParam<std::string> {
  protected:
    [[nodiscard]] std::string precision() const { return GetParam(); }
    [[nodiscard]] std::string flags() const { return " --max-steps 20 --precision " + GetParam(); }
    [[nodiscard]] double loss_tolerance() const { return GetParam() == "fp32" ? 1e-6 : 1e-4; }
    [[nodiscard]] double weights_tolerance() const { return GetParam() == "fp32" ? 1e-5 : 2e-2; }
    [[nodiscard]] std::string two_ranks_shared() const {
        return shared_memory_run(2, 2, 3, flags(), precision() + "_np2_shared");
    }
    void one_allreduce(int ranks, int threads, int batch) const {
        (void)shared_memory_run(ranks, threads, batch,  // the log is checked where it says more
                                flags() + " --share-memory off",
                                precision() + "_np" + std::to_string(ranks) + "_one");
    }
};

TEST_P(SharedMemory, TwoRanksOnOneMachineSayTheyShareTheWeights) {
    const std::string log = two_ranks_shared();
    expect_logged(log, "shared memory, each rank sums and updates 1/2 of the weights");
    expect_logged(log, "weights (one copy for the 2 ranks of this machine)");
}

TEST_P(SharedMemory, TwoRanksOnOneMachineTrainAsOneAllreduce) {
    one_allreduce(2, 2, 3);
    (void)two_ranks_shared();  // its log: the test above
    expect_same_training(SharedRuns("shared"), precision() + "_np2_one",
                         precision() + "_np2_shared", loss_tolerance(), weights_tolerance());
}

TEST_P(SharedMemory, ThreeRanksOnOneMachineTrainAsOneAllreduce) {
    one_allreduce(3, 1, 2);
    (void)shared_memory_run(3, 1, 2, flags(), precision() + "_np3_shared");  // as 2 ranks' log
    expect_same_training(SharedRuns("shared"), precision() + "_np3_one",
                         precision() + "_np3_shared", loss_tolerance(), weights_tolerance());
}

TEST_P(SharedMemory, RepeatedRunsAreBitwiseEqual) {
    const SharedRuns runs("shared");
    (void)shared_memory_run(3, 1, 2, flags(), precision() + "_np3_shared");  // as 2 ranks' log
    (void)shared_memory_run(3, 1, 2, flags(), precision() + "_np3_shared_again");
    EXPECT_EQ(losses_of(runs, precision() + "_np3_shared"),
              losses_of(runs, precision() + "_np3_shared_again"));
    expect_same_weights(runs, precision() + "_np3_shared", precision() + "_np3_shared_again");
}

INSTANTIATE_TEST_SUITE_P(Precisions, SharedMemory, ::testing::Values("fp32", "bf16"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                             return info.param;
                         });

// Its checkpoints (moments gathered from the ranks' slices) resume on one rank as the
// uninterrupted run.
TEST(MpiTraining, ASharedMemoryCheckpointResumesOnOneRank) {
    (void)shared_memory_run(2, 2, 3, " --max-steps 20 --precision fp32 --share-memory off",
                            "fp32_np2_one");
    (void)shared_memory_run(2, 2, 3, "--max-steps 10", "to_one",
                            {"1", "2", "6", "--max-steps 20 --resume auto"});
    expect_same_training(SharedRuns("shared"), "fp32_np2_one", "to_one", 1e-5);
}

// A plain checkpoint resumes into shared memory on 3 ranks as the uninterrupted run.
TEST(MpiTraining, APlainCheckpointResumesIntoSharedMemory) {
    (void)shared_memory_run(2, 2, 3, " --max-steps 20 --precision fp32 --share-memory off",
                            "fp32_np2_one");
    (void)shared_memory_run(2, 2, 3, "--max-steps 10 --share-memory off", "to_shared",
                            {"3", "1", "2", "--max-steps 20 --resume auto"});
    expect_same_training(SharedRuns("shared"), "fp32_np2_one", "to_shared", 1e-5);
}

// ---- Ranks on several machines ----

// Several ranks on each of several machines (simulated: --simulate-machines cuts the world into
// machines of consecutive ranks): each machine shares one copy of the weights, and each slice of
// the gradient takes one allreduce between the machines' ranks that own it. 24 sequences per step
// throughout: 4 ranks x 3 x 2 micro-steps, or 1 rank x 12 x 2.
std::string machines_command(const SharedRuns& runs, int ranks, int batch, const std::string& extra,
                             const std::string& name) {
    return named(runs, ranks,
                 resumable(runs) + " --threads 1 --batch-size " + std::to_string(batch) +
                     " --grad-accum 2 " + extra,
                 name);
}
std::string machines_run(int ranks, int batch, const std::string& extra, const std::string& name) {
    const SharedRuns runs = runs_with_corpus("machines");
    return succeeded(runs, name, {machines_command(runs, ranks, batch, extra, name)});
}
// The reference: one allreduce of every rank's gradient.
void one_allreduce_on_four_ranks() {
    (void)machines_run(4, 3, "--max-steps 20 --share-memory off", "one");  // its log: not checked
}

// The slices travel in buckets while backward runs (auto: 25 MiB, here one bucket).
TEST(MpiTraining, SeveralMachinesSumTheirSlicesInBucketsAndTrainAsOneAllreduce) {
    one_allreduce_on_four_ranks();
    const std::string log = machines_run(4, 3, "--max-steps 20 --simulate-machines 2", "machines");
    expect_logged(log,
                  "shared memory on each machine, each rank sums and updates 1/2 of the "
                  "weights, and its slice is summed across the 2 machines in buckets of "
                  "25 MiB while backward runs");
    expect_logged(log, "(one copy for the 2 ranks of this machine)");
    expect_same_training(SharedRuns("machines"), "one", "machines", 1e-6);
}

TEST(MpiTraining, SeveralMachinesSumTheirSlicesInOneAllreduceAfterBackward) {
    one_allreduce_on_four_ranks();
    const std::string log =
        machines_run(4, 3, "--max-steps 20 --simulate-machines 2 --bucket-mb 0", "machines_after");
    expect_logged(log,
                  "its slice is summed across the 2 machines in one allreduce after "
                  "backward");
    expect_same_training(SharedRuns("machines"), "one", "machines_after", 1e-6);
}

// 0.004 MiB: many buckets, each waiting for both ranks of its machine.
const std::string kTinyMachines = "--max-steps 20 --simulate-machines 2 --bucket-mb 0.004";

TEST(MpiTraining, SeveralMachinesInTinyBucketsTrainAsOneAllreduce) {
    one_allreduce_on_four_ranks();
    expect_logged(machines_run(4, 3, kTinyMachines, "machines_tiny"),
                  "in buckets of 0.004 MiB while backward runs");
    expect_same_training(SharedRuns("machines"), "one", "machines_tiny", 1e-6);
}

TEST(MpiTraining, SeveralMachinesInTinyBucketsAreBitwiseRepeatable) {
    const SharedRuns runs("machines");
    (void)machines_run(4, 3, kTinyMachines, "machines_tiny");  // its log: the test above
    (void)machines_run(4, 3, kTinyMachines, "machines_again");
    EXPECT_EQ(losses_of(runs, "machines_tiny"), losses_of(runs, "machines_again"));
    expect_same_weights(runs, "machines_tiny", "machines_again");
}

// A BPE vocabulary larger than the step's embedding rows (4 ranks x 2 x 32 rows of 33 floats
// against about 300 x 32 in wte), so that the rows travel on their own: each rank adds the
// world's rows that fall in its slice.
TEST(MpiTraining, SeveralMachinesAddTheEmbeddingRowsOfALargeVocabularyToTheirSlices) {
    const std::string bpe = " --tokenizer bpe --vocab-size 400 --max-steps 20";
    (void)machines_run(4, 2, bpe + " --share-memory off", "bpe_one");  // logs: checked above
    (void)machines_run(4, 2, bpe + " --simulate-machines 2 --bucket-mb 0.004", "bpe_machines");
    expect_same_training(SharedRuns("machines"), "bpe_one", "bpe_machines", 1e-6);
}

// The gradient norm of the first machine's slices clips on every machine, so machines whose
// ranks sum their slices' squares over different numbers of threads stay bitwise equal
// (--check-replicas compares every rank's weights at every step; clipping on every step).
TEST(MpiTraining, MachinesWithDifferentThreadCountsStayBitwiseEqualWhenClipping) {
    const SharedRuns runs = runs_with_corpus("machines");
    const std::string base = resumable(runs);
    const std::string mixed_flags =
        " --batch-size 3 --grad-accum 2 --max-steps 20 "
        "--simulate-machines 2 --check-replicas 1 --grad-clip 0.05 --out-dir " +
        (runs / "mixed");
    const std::vector<test::ProcessResult> mixed =
        runs.run("mixed", {mpiexec(2) + base + mixed_flags + " --threads 1 : -n 2 " + base +
                           mixed_flags + " --threads 3"});
    ASSERT_EQ(mixed.size(), 1u);
    EXPECT_EQ(mixed[0].exit_code, 0) << mixed[0].output;
    EXPECT_EQ(mixed[0].output.find("replicas diverged"), std::string::npos) << mixed[0].output;
    EXPECT_NE(mixed[0].output.find("step 20/20 | loss"), std::string::npos) << mixed[0].output;
}

// A machine that cannot share its memory makes every machine train without sharing: ZeRO-1
// slices instead, the same training.
TEST(MpiTraining, AMachineThatCannotShareMakesEveryMachineUseZeroOne) {
    one_allreduce_on_four_ranks();
    const std::string log = machines_run(
        4, 3, "--max-steps 20 --simulate-machines 2 --inject-share-failure", "fallback");
    expect_logged(log,
                  "shared memory is off for this run (another machine could not map its "
                  "shared memory): each rank keeps its own weights and a slice of the "
                  "optimizer instead (ZeRO-1)");
    expect_logged(log, "ZeRO-1, one reduce-scatter after backward");
    expect_same_training(SharedRuns("machines"), "one", "fallback", 1e-5);
}

// One rank on each of the 4 machines has nothing to share: overlapped buckets (auto).
TEST(MpiTraining, OneRankPerMachineSumsInOverlappedBuckets) {
    expect_logged(machines_run(4, 3, "--max-steps 2 --simulate-machines 4", "four"),
                  "buckets of 25 MiB, " + std::string(log_lines::kSummedWhileBackward) +
                      " (auto: ranks on several machines)");
}

// Its checkpoint (moments from the first machine's slices) resumes on one rank as the
// uninterrupted run.
TEST(MpiTraining, ASeveralMachinesCheckpointResumesOnOneRank) {
    one_allreduce_on_four_ranks();
    const SharedRuns runs = runs_with_corpus("machines");
    (void)succeeded(runs, "to_one",  // the logs are not checked: the training is
                    {machines_command(runs, 4, 3, "--max-steps 10 --simulate-machines 2", "to_one"),
                     machines_command(runs, 1, 12, "--max-steps 20 --resume auto", "to_one")});
    expect_same_training(runs, "one", "to_one", 1e-5);
}

// A plain checkpoint resumes into several machines as the uninterrupted run.
TEST(MpiTraining, APlainCheckpointResumesIntoSeveralMachines) {
    one_allreduce_on_four_ranks();
    const SharedRuns runs = runs_with_corpus("machines");
    (void)succeeded(
        runs, "to_machines",  // the logs are not checked: the training is
        {machines_command(runs, 4, 3, "--max-steps 10 --share-memory off", "to_machines"),
         machines_command(runs, 4, 3, "--max-steps 20 --resume auto --simulate-machines 2",
                          "to_machines")});
    expect_same_training(runs, "one", "to_machines", 1e-5);
}

// ---- Elastic resume ----

// A run checkpointed with 1 rank x batch 8 continues on 2 ranks x batch 2 with grad accum 2
// derived (the same 8 sequences per step); 3 ranks x batch 2 cannot make 8. The starts in
// order: the first 10 steps, the refused resume, the resume that continues.
std::vector<test::ProcessResult> elastic_runs() {
    const SharedRuns runs = runs_with_corpus("elastic");
    const std::string common = resumable(runs);
    return runs.run(
        "elastic",
        {named(runs, 1, common + " --threads 2 --batch-size 8 --max-steps 10", "elastic"),
         mpiexec(3) + common + " --threads 1 --batch-size 2 " +
             "--max-steps 20 --resume auto --out-dir " + (runs / "elastic"),
         named(runs, 2, common + " --threads 1 --batch-size 2 --max-steps 20 --resume auto",
               "elastic")});
}

TEST(MpiTraining, ResumingOnRanksThatCannotMakeTheGlobalBatchIsRefusedWithTheArithmetic) {
    const std::vector<test::ProcessResult> starts = elastic_runs();
    ASSERT_EQ(starts.size(), 3u);
    ASSERT_EQ(starts[0].exit_code, 0) << starts[0].output;
    EXPECT_EQ(starts[1].exit_code, 2) << starts[1].output;
    expect_logged(starts[1].output,
                  "the checkpoint's global batch is 8 sequences per step, which 3 "
                  "ranks x --batch-size 2 = 6 per micro-step does not divide");
}

TEST(MpiTraining, ResumingOnOtherRanksKeepsTheGlobalBatchAndTheTraining) {
    const SharedRuns runs = runs_with_corpus("elastic");
    (void)succeeded(
        runs, "whole",  // the log is not checked: the training is
        {named(runs, 1, resumable(runs) + " --threads 2 --batch-size 8 --max-steps 20", "whole")});
    const std::vector<test::ProcessResult> starts = elastic_runs();
    ASSERT_EQ(starts.size(), 3u);
    ASSERT_EQ(starts[0].exit_code, 0) << starts[0].output;
    ASSERT_EQ(starts[2].exit_code, 0) << starts[2].output;
    expect_logged(starts[2].output,
                  "elastic resume: 2 ranks x batch 2 x grad accum 2 keeps the "
                  "checkpoint's 8 sequences per step");
    expect_same_training(runs, "whole", "elastic", 1e-5);
}

// ---- ZeRO-1 ----

// ZeRO-1 trains as plain data parallelism (2 ranks x 2 workers, 3 ranks x 1), with each rank's
// moments a slice, after backward or in overlapped buckets; its checkpoints hold the whole
// moments, so a ZeRO run checkpointed on 3 ranks resumes on 2 (re-sliced, grad accum derived).
std::string zero_command(const SharedRuns& runs, int ranks, int threads, int batch,
                         const std::string& extra, const std::string& name) {
    return named(runs, ranks,
                 resumable(runs) + " --threads " + std::to_string(threads) + " --batch-size " +
                     std::to_string(batch) + " " + extra,
                 name);
}
std::string zero_run(int ranks, int threads, int batch, const std::string& extra,
                     const std::string& name) {
    const SharedRuns runs = runs_with_corpus("zero");
    return succeeded(runs, name, {zero_command(runs, ranks, threads, batch, extra, name)});
}
// The reference: plain data parallelism on 2 ranks.
void plain_on_two_ranks() {
    (void)zero_run(2, 2, 6, "--max-steps 20", "plain");  // its log: not checked
}
const std::string kZeroBuckets = "--max-steps 20 --zero 1 --bucket-mb 0.004";

TEST(MpiTraining, ZeroOneAfterBackwardTrainsAsPlain) {
    plain_on_two_ranks();
    expect_logged(zero_run(2, 2, 6, "--max-steps 20 --zero 1", "zero2"),
                  "AdamW moments (ZeRO-1: this rank's slice of 2)");
    expect_same_training(SharedRuns("zero"), "plain", "zero2", 1e-5);
}

TEST(MpiTraining, ZeroOneInTinyBucketsTrainsAsPlain) {
    plain_on_two_ranks();
    expect_logged(zero_run(2, 2, 6, kZeroBuckets, "zb2"),
                  "ZeRO-1, summed in buckets of 0.004 MiB while backward runs, each rank "
                  "keeping its slice");
    expect_same_training(SharedRuns("zero"), "plain", "zb2", 1e-5);
    (void)zero_run(3, 1, 4, kZeroBuckets, "zb3");  // its log: as on 2 ranks
    expect_same_training(SharedRuns("zero"), "plain", "zb3", 1e-5);
}

TEST(MpiTraining, ZeroOneInTinyBucketsIsBitwiseRepeatable) {
    const SharedRuns runs("zero");
    (void)zero_run(3, 1, 4, kZeroBuckets, "zb3");  // its log: the test above
    (void)zero_run(3, 1, 4, kZeroBuckets, "zb3_again");
    EXPECT_EQ(losses_of(runs, "zb3"), losses_of(runs, "zb3_again"));
}

TEST(MpiTraining, AZeroOneCheckpointMovesBetweenRankCounts) {
    plain_on_two_ranks();
    const SharedRuns runs = runs_with_corpus("zero");
    const std::string moved =
        succeeded(runs, "moved",
                  {zero_command(runs, 3, 1, 4, "--max-steps 10 --zero 1", "moved"),
                   zero_command(runs, 2, 1, 3, "--max-steps 20 --zero 1 --resume auto", "moved")});
    expect_logged(moved, "grad accum 2 keeps the checkpoint's 12 sequences");
    expect_same_training(runs, "plain", "moved", 1e-5);
}

TEST(MpiTraining, ShareMemoryOffSaysItUsesOneAllreduce) {
    expect_logged(zero_run(2, 1, 6, "--max-steps 1 --share-memory off", "local"),
                  std::string(log_lines::kOneAllreduce) + " (--share-memory off)");
}

TEST(MpiTraining, ZeroOneOnOneRankSaysThereIsNothingToSlice) {
    expect_logged(zero_run(1, 1, 6, "--max-steps 1 --zero 1", "alone"),
                  "--zero 1 with one rank: there is nothing to slice");
}

TEST(MpiTraining, ABucketSizeThatIsNotANumberIsRefused) {
    const SharedRuns runs = runs_with_corpus("zero");
    const auto bad_size = run_command(mpiexec(1) + resumable(runs) + " --bucket-mb lots");
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
