// train_gpt2 --optimizer muon end to end: it trains and says so, ranks that slice the weights
// (shared memory, ZeRO-1) train as one allreduce, a resume is bitwise, a resume with the other
// optimizer and Muon's flags without it are refused in one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "core/file_io.hpp"
#include "formats/checkpoint.hpp"
#include "formats/resume_state.hpp"
#include "process_support.hpp"
#include "train_run_fixture.hpp"

namespace gpt2 {
namespace {

using test::TrainRun;

const std::string kMuon = "--optimizer muon --muon-lr 0.02 --max-steps 8 --checkpoint-every 0";

std::vector<float> final_weights(const std::string& dir, int step) {
    const LoadedModel loaded = load_checkpoint(model_path(dir, step));
    return {loaded.model.params.data(), loaded.model.params.data() + loaded.model.params.size()};
}

TEST_F(TrainRun, MuonTrainsAndSaysSo) {
    const auto run = train(kMuon + " --verbose --out-dir " + path("one") + " --metrics-file " +
                           path("one.jsonl"));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("Muon momentum and AdamW moments"), std::string::npos) << run.output;
    const std::vector<double> losses = test::metrics_values(path("one.jsonl"), "train", "loss");
    ASSERT_EQ(losses.size(), 8u);
    EXPECT_LT(losses.back(), losses.front());
}

// Two ranks, each updating its slice of whole matrices, against one allreduce after which each
// updates all: the same training (the sum's grouping differs between the two, as for AdamW). Ranks
// that share nothing take ZeRO-1 for Muon unless --zero 0 is given: the same bits as --zero 1.
TEST_F(TrainRun, MuonOnSlicedRanksTrainsAsOneAllreduceAndRepeatsBitwise) {
    std::vector<std::vector<double>> losses;
    std::vector<std::string> outputs;
    for (const std::string& how :
         {std::string("--share-memory off --zero 0"), std::string(""), std::string("--zero 1"),
          std::string(""), std::string("--share-memory off"),
          std::string("--simulate-machines 2")}) {
        const std::string name = "r" + std::to_string(losses.size());
        const auto run = train(kMuon + " " + how + " --out-dir " + path(name) + " --metrics-file " +
                                   path(name + ".jsonl"),
                               2);
        ASSERT_EQ(run.exit_code, 0) << how << "\n" << run.output;
        outputs.push_back(run.output);
        losses.push_back(test::metrics_values(path(name + ".jsonl"), "train", "loss"));
        ASSERT_EQ(losses.back().size(), 8u) << how;
        for (std::size_t s = 0; s < 8; ++s)
            EXPECT_NEAR(losses.back()[s], losses[0][s], 1e-5 * losses[0][s]) << how << " " << s;
    }
    EXPECT_EQ(losses[1], losses[3]) << "shared memory, twice";
    EXPECT_EQ(final_weights(path("r1"), 8), final_weights(path("r3"), 8));
    EXPECT_NE(outputs[0].find("one allreduce after backward (--share-memory off)"),
              std::string::npos)
        << outputs[0];
    EXPECT_NE(outputs[4].find("ZeRO-1, one reduce-scatter after backward (auto: Muon's update "
                              "divided over the ranks)"),
              std::string::npos)
        << outputs[4];
    EXPECT_EQ(losses[4], losses[2]) << "--share-memory off chose ZeRO-1 for Muon";
    // One rank on each of two machines: ZeRO-1 for Muon, its reduce-scatter in buckets.
    EXPECT_NE(outputs[5].find("ZeRO-1, summed in buckets of 25 MiB while backward runs, each rank "
                              "keeping its slice (auto: Muon's update divided over the ranks)"),
              std::string::npos)
        << outputs[5];
    EXPECT_EQ(final_weights(path("r4"), 8), final_weights(path("r2"), 8));
}

TEST_F(TrainRun, AMuonRunResumesBitwiseAndRefusesTheOtherOptimizer) {
    const auto whole = train(kMuon + " --out-dir " + path("whole"));
    // AdamW's state, which a Muon resume refuses.
    const auto plain =
        train("--optimizer adamw --max-steps 8 --checkpoint-every 0 --out-dir " + path("plain"));
    ASSERT_EQ(plain.exit_code, 0) << plain.output;
    EXPECT_NE(plain.output.find("optimizer: AdamW (lr 0.001)\n"), std::string::npos)
        << plain.output;
    ASSERT_EQ(whole.exit_code, 0) << whole.output;
    const std::string half = test::without_given(kMuon, "--max-steps") + " --max-steps 4";
    const auto first = train(half + " --lr-decay-steps 8 --out-dir " + path("split"));
    ASSERT_EQ(first.exit_code, 0) << first.output;
    const std::string state = state_path(path("split"), 4).string();
    const std::vector<std::uint8_t> state_bytes = read_file_bytes(state);
    const auto other = train("--optimizer adamw --max-steps 8 --checkpoint-every 0 --resume " +
                             state + " --out-dir " + path("split"));
    EXPECT_EQ(other.exit_code, 2) << other.output;
    EXPECT_NE(other.output.find("error: --resume " + state +
                                ": the state is of a run trained with --optimizer muon, this run "
                                "asks for adamw: resume with --optimizer muon"),
              std::string::npos)
        << other.output;
    EXPECT_EQ(read_file_bytes(state), state_bytes);
    const auto resumed = train(kMuon + " --resume " + state + " --out-dir " + path("split"));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_EQ(final_weights(path("whole"), 8), final_weights(path("split"), 8));
    // Without --optimizer (auto) the state's own optimizer resumes, bitwise too.
    const auto own = train(test::without_given(kMuon, "--optimizer") + " --resume " + state +
                           " --out-dir " + path("own"));
    ASSERT_EQ(own.exit_code, 0) << own.output;
    EXPECT_NE(own.output.find("(--optimizer auto: the resumed state's optimizer)"),
              std::string::npos)
        << own.output;
    EXPECT_EQ(final_weights(path("whole"), 8), final_weights(path("own"), 8));
}

TEST_F(TrainRun, MuonsFlagsWithoutMuonAreRefused) {
    const auto run = train("--optimizer adamw --muon-lr 0.05 --max-steps 1 --out-dir " + path("a"));
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_NE(run.output.find("--muon-lr applies to Muon only, and this run trains with AdamW"),
              std::string::npos)
        << run.output;
    // auto settles on AdamW for LoRA: Muon's flags are refused then, once it has.
    const auto settled = train(
        "--optimizer auto --muon-momentum 0.9 --lora-rank 2 --max-steps 1 --out-dir " + path("b"));
    EXPECT_EQ(settled.exit_code, 2) << settled.output;
    EXPECT_NE(settled.output.find("--muon-momentum applies to Muon only, and this run trains with "
                                  "AdamW (--optimizer auto: LoRA trains its adapters with AdamW)"),
              std::string::npos)
        << settled.output;
    const auto lora = train("--optimizer muon --lora-rank 2 --max-steps 1 --out-dir " + path("c"));
    EXPECT_EQ(lora.exit_code, 2) << lora.output;
    EXPECT_NE(lora.output.find("drop --optimizer muon or --lora-rank"), std::string::npos)
        << lora.output;
}

// --optimizer auto: Muon from scratch where its Newton-Schulz iterations cost at most half of
// forward and backward, else AdamW; AdamW for --init-from weights; and it says why.
TEST_F(TrainRun, AutoTakesMuonFromScratchWhereItPaysAndAdamWForFineTuning) {
    // L=2 C=32: Newton-Schulz 2 x 9.8 MFLOP; forward and backward 6 x 30,080 x 1,024 tokens.
    const auto scratch =
        train("--optimizer auto --max-steps 2 --batch-size 64 --out-dir " + path("scratch"));
    ASSERT_EQ(scratch.exit_code, 0) << scratch.output;
    EXPECT_NE(scratch.output.find("optimizer: Muon on the hidden matrices (lr 0.02, momentum "
                                  "0.95), AdamW on the rest (lr 0.001) (--optimizer auto: a run "
                                  "from scratch, Newton-Schulz 11% of forward and backward)"),
              std::string::npos)
        << scratch.output;
    // The same model at 32 tokens a step: Muon would cost 3.4x forward and backward.
    const auto small =
        train("--optimizer auto --max-steps 2 --batch-size 2 --out-dir " + path("small"));
    ASSERT_EQ(small.exit_code, 0) << small.output;
    EXPECT_NE(small.output.find("optimizer: AdamW (lr 0.001) (--optimizer auto: Muon's "
                                "Newton-Schulz would cost 3.4x forward and backward at this "
                                "batch; it pays up to 0.5x)"),
              std::string::npos)
        << small.output;
    const auto tuned = train("--optimizer auto --max-steps 2 --init-from " + path("scratch") +
                             " --out-dir " + path("tuned"));
    ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
    EXPECT_NE(tuned.output.find("optimizer: AdamW (lr 0.001) (--optimizer auto: fine-tuning "
                                "--init-from weights)"),
              std::string::npos)
        << tuned.output;
}

// A figure human_bytes printed ("123.9 MiB", "1.83 GiB") after `label` in `text`, in bytes.
double bytes_after(const std::string& text, const std::string& label) {
    const std::size_t at = text.find(label);
    if (at == std::string::npos) return -1.0;
    std::istringstream in(text.substr(at + label.size()));
    double value = 0.0;
    std::string unit;
    in >> value >> unit;
    const double scale = unit.starts_with("GiB")   ? 1024.0 * 1024 * 1024
                         : unit.starts_with("MiB") ? 1024.0 * 1024
                         : unit.starts_with("KiB") ? 1024.0
                                                   : 1.0;
    return value * scale;
}

// The memory plan's figure follows what Muon keeps resident: one float for a matrix weight (the
// unused second buffer is never touched, so never resident) and each worker's scratch. The same
// model with AdamW and with Muon: the plans differ by what the peak resident sets differ by.
TEST_F(TrainRun, TheMemoryPlanFollowsMuonsResidentState) {
#ifdef GPT2_SANITIZER_BUILD
    GTEST_SKIP() << "a sanitizer's shadow memory is in the resident set";
#endif
    const std::string model =
        "--n-layer 4 --n-head 12 --n-embd 768 --seq-len 16 --batch-size 2 --threads 2 "
        "--max-steps 1 --checkpoint-every 0 --log-level debug ";
    double plan[2], rss[2];
    for (int i = 0; i < 2; ++i) {
        const auto run = train(model + (i == 0 ? "--optimizer adamw" : "--optimizer muon") +
                               " --out-dir " + path(i == 0 ? "adamw" : "muon"));
        ASSERT_EQ(run.exit_code, 0) << run.output;
        const std::size_t line = run.output.find("memory per rank:");
        ASSERT_NE(line, std::string::npos) << run.output;
        const std::string memory = run.output.substr(line, run.output.find('\n', line) - line);
        plan[i] = bytes_after(memory, " = ");
        rss[i] = bytes_after(run.output, "peak RSS ");
        ASSERT_GT(plan[i], 0.0) << memory;
        ASSERT_GT(rss[i], 0.0) << run.output;
    }
    // 28M matrix weights: 113 MB less state, less 2 workers' scratch of 23.6 MB. The second
    // buffer is mapped in 2 MiB huge pages: touching AdamW's part of it makes resident the huge
    // pages it shares with the matrices' part, at most one at each end of the five stretches
    // between and around the four matrix families (20 MiB), and 2% for the rest of the process.
    const double planned = plan[0] - plan[1], measured = rss[0] - rss[1];
    EXPECT_GT(planned, 50e6);
    EXPECT_NEAR(measured, planned, 20.0 * 1024 * 1024 + 0.02 * planned)
        << "plans " << plan[0] << " / " << plan[1] << ", peak RSS " << rss[0] << " / " << rss[1];
}

}  // namespace
}  // namespace gpt2
