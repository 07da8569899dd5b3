// train_gpt2 --optimizer muon end to end: it trains and says so, ranks that slice the weights
// (shared memory, ZeRO-1) train as one allreduce, a resume is bitwise, a resume with the other
// optimizer and Muon's flags without it are refused in one line.
#include <gtest/gtest.h>

#include <algorithm>
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
// updates all: the same training (the sum's grouping differs between the two, as for AdamW).
TEST_F(TrainRun, MuonOnSlicedRanksTrainsAsOneAllreduceAndRepeatsBitwise) {
    std::vector<std::vector<double>> losses;
    for (const std::string& how : {std::string("--share-memory off"), std::string(""),
                                   std::string("--zero 1"), std::string("")}) {
        const std::string name = "r" + std::to_string(losses.size());
        const auto run = train(kMuon + " " + how + " --out-dir " + path(name) + " --metrics-file " +
                                   path(name + ".jsonl"),
                               2);
        ASSERT_EQ(run.exit_code, 0) << how << "\n" << run.output;
        losses.push_back(test::metrics_values(path(name + ".jsonl"), "train", "loss"));
        ASSERT_EQ(losses.back().size(), 8u) << how;
        for (std::size_t s = 0; s < 8; ++s)
            EXPECT_NEAR(losses.back()[s], losses[0][s], 1e-5 * losses[0][s]) << how << " " << s;
    }
    EXPECT_EQ(losses[1], losses[3]) << "shared memory, twice";
    EXPECT_EQ(final_weights(path("r1"), 8), final_weights(path("r3"), 8));
}

TEST_F(TrainRun, AMuonRunResumesBitwiseAndRefusesTheOtherOptimizer) {
    const auto whole = train(kMuon + " --out-dir " + path("whole"));
    // Without --optimizer: adamw, the default, which the state contradicts.
    const auto plain = train("--max-steps 8 --checkpoint-every 0 --out-dir " + path("plain"));
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

// --optimizer auto: Muon from scratch, AdamW for --init-from weights, and it says why.
TEST_F(TrainRun, AutoTakesMuonFromScratchAndAdamWForFineTuning) {
    const auto scratch = train("--optimizer auto --max-steps 2 --out-dir " + path("scratch"));
    ASSERT_EQ(scratch.exit_code, 0) << scratch.output;
    EXPECT_NE(scratch.output.find("optimizer: Muon on the hidden matrices (lr 0.02, momentum "
                                  "0.95), AdamW on the rest (lr 0.001) (--optimizer auto: a run "
                                  "from scratch)"),
              std::string::npos)
        << scratch.output;
    const auto tuned = train("--optimizer auto --max-steps 2 --init-from " + path("scratch") +
                             " --out-dir " + path("tuned"));
    ASSERT_EQ(tuned.exit_code, 0) << tuned.output;
    EXPECT_NE(tuned.output.find("optimizer: AdamW (lr 0.001) (--optimizer auto: fine-tuning "
                                "--init-from weights)"),
              std::string::npos)
        << tuned.output;
}

}  // namespace
}  // namespace gpt2
