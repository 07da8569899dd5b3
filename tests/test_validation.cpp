// The validation loss: a fixed set of tokens (the first --val-tokens of the validation data, in
// windows of --seq-len), the same bits for any batch size, thread count and rank count, so that
// runs, resumes and launches compare; a validation split too short for a window turns validation
// off with one warning; the old --val-batches is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "core/random.hpp"
#include "parallel/comm.hpp"
#include "parallel/validation_loss.hpp"
#include "random_model.hpp"
#include "train_run_fixture.hpp"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;

// validation_loss() itself: the same bits however the windows fall to workers (and contexts of any
// batch size), and the mean loss of exactly the first `windows` consecutive windows.
TEST(Evaluate, TheSameBitsForAnyWorkersAndTheMeanOfTheFirstWindows) {
    constexpr int T = 16;
    constexpr std::uint64_t kWindows = 7;
    const ModelConfig config = test::small_config(T);
    const std::unique_ptr<Model> model = test::random_model(config, 7, 1.0f);
    // More tokens than the windows cover: the rest must not count.
    std::vector<std::int32_t> stream((kWindows + 3) * T + 1);
    Rng rng(11);
    for (std::int32_t& token : stream)
        token = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(config.vocab_size)));
    const WindowReader read = [&stream](std::uint64_t window, std::span<std::int32_t> inputs,
                                        std::span<std::int32_t> targets) {
        for (std::size_t t = 0; t < inputs.size(); ++t) {
            inputs[t] = stream[window * T + t];
            targets[t] = stream[window * T + t + 1];
        }
    };
    const Communicator comm = Communicator::single_process();
    std::optional<double> first;
    // (workers, batch size): one worker, even and uneven splits, workers without sequences.
    for (const auto& [workers, batch] :
         std::vector<std::pair<int, int>>{{1, 1}, {2, 4}, {3, 3}, {3, 5}, {4, 2}}) {
        WorkerGroup group(config, workers, batch, T, false);
        const ValidationLoss e = validation_loss(*model, group, comm, kWindows, read);
        EXPECT_EQ(e.tokens, static_cast<std::int64_t>(kWindows * T));
        if (!first) {
            first = e.loss;
        } else {
            EXPECT_EQ(e.loss, *first) << workers << " workers, batch " << batch;
        }
    }
    // One forward over all seven windows at once (other row counts: equal to rounding).
    WorkerGroup whole(config, 1, static_cast<int>(kWindows), T, false);
    std::vector<std::int32_t> inputs(kWindows * T), targets(kWindows * T);
    for (std::uint64_t w = 0; w < kWindows; ++w) {
        read(w, std::span(inputs).subspan(w * T, T), std::span(targets).subspan(w * T, T));
    }
    const double mean = forward_loss(*model, whole.context(0),
                                     TokenBatch{inputs, targets, static_cast<int>(kWindows), T}) /
                        static_cast<double>(kWindows * T);
    ASSERT_TRUE(first.has_value());
    EXPECT_NEAR(*first, mean, 1e-6 * mean);
}

// Bits per byte: the loss of the targets that are text (a special token, of 0 bytes, left out), in
// bits, over their bytes; computed here window by window from each target's own loss, and the same
// bits for any split of the windows over workers.
TEST(Evaluate, BitsPerByteIsTheTextTargetsLossInBitsOverTheirBytes) {
    constexpr int T = 16;
    constexpr std::uint64_t kWindows = 5;
    const ModelConfig config = test::small_config(T);
    const std::unique_ptr<Model> model = test::random_model(config, 9, 1.0f);
    std::vector<std::int32_t> stream(kWindows * T + 1);
    Rng rng(13);
    for (std::int32_t& token : stream)
        token = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(config.vocab_size)));
    // Token 0 stands for the end-of-text token (0 bytes); the others are 1 to 4 bytes long.
    std::vector<std::int32_t> token_bytes(static_cast<std::size_t>(config.vocab_size));
    for (std::size_t id = 0; id < token_bytes.size(); ++id)
        token_bytes[id] = id == 0 ? 0 : static_cast<std::int32_t>(1 + id % 4);
    stream[3] = stream[40] = 0;
    const WindowReader read = [&stream](std::uint64_t window, std::span<std::int32_t> inputs,
                                        std::span<std::int32_t> targets) {
        for (std::size_t t = 0; t < inputs.size(); ++t) {
            inputs[t] = stream[window * T + t];
            targets[t] = stream[window * T + t + 1];
        }
    };
    double nats = 0.0, bytes = 0.0;
    {
        WorkerGroup one(config, 1, 1, T, false);
        std::vector<std::int32_t> inputs(T), targets(T);
        for (std::uint64_t w = 0; w < kWindows; ++w) {
            read(w, inputs, targets);
            (void)forward_loss(*model, one.context(0), TokenBatch{inputs, targets, 1, T});
            for (int t = 0; t < T; ++t) {
                const std::int32_t length = token_bytes[static_cast<std::size_t>(targets[t])];
                if (length == 0) continue;
                nats += one.context(0).acts.losses[t];
                bytes += length;
            }
        }
    }
    const double expected = nats / (bytes * std::log(2.0));
    const Communicator comm = Communicator::single_process();
    for (const auto& [workers, batch] : std::vector<std::pair<int, int>>{{1, 1}, {2, 3}, {3, 2}}) {
        WorkerGroup group(config, workers, batch, T, false);
        const ValidationLoss e =
            validation_loss(*model, group, comm, kWindows, read, std::nullopt, token_bytes);
        ASSERT_TRUE(e.bits_per_byte.has_value());
        EXPECT_NEAR(*e.bits_per_byte, expected, 1e-12 * expected) << workers << " workers";
        EXPECT_EQ(e.bytes, static_cast<std::int64_t>(bytes));
        EXPECT_FALSE(
            validation_loss(*model, group, comm, kWindows, read).bits_per_byte.has_value());
    }
}

class ValidationRun : public test::TrainRun {
  protected:
    // The metrics file's val records of run `name` (its --metrics-file name.jsonl).
    [[nodiscard]] std::vector<nlohmann::json> val_records(const std::string& name) const {
        return test::metrics_records(path(name + ".jsonl"), "val");
    }
    [[nodiscard]] std::string outputs(const std::string& name) const {
        return " --out-dir " + path(name) + " --metrics-file " + path(name + ".jsonl");
    }
};

// 25 windows of 16 tokens (uneven over every split below), validated at step 0 and at the end.
const std::string kValFlags = " --val-tokens 400 --val-every 100 --checkpoint-every 0";

// A checkpoint evaluated by 1 and 2 ranks, 1 and 2 threads and three batch sizes gives the very
// same validation loss, the one the training run measured for those weights; a fresh model's
// step-0 loss is the same on 1 and 2 ranks.
TEST_F(ValidationRun, TheLossIsTheSameBitsForAnyBatchThreadsAndRanks) {
    const auto trained = train("--max-steps 3" + kValFlags + outputs("trained"));
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
    const std::vector<nlohmann::json> trained_val = val_records("trained");
    ASSERT_EQ(trained_val.size(), 2u);  // steps 0 and 3
    for (const nlohmann::json& record : trained_val)
        EXPECT_EQ(record["val_tokens"], 400) << record;
    EXPECT_NE(trained.output.find("val loss "), std::string::npos) << trained.output;
    EXPECT_NE(trained.output.find(" (400 tokens) | "), std::string::npos) << trained.output;
    const double fresh = trained_val[0]["val_loss"].get<double>();
    const double at_3 = trained_val[1]["val_loss"].get<double>();
    EXPECT_NE(fresh, at_3);

    // Step 0 of the same fresh model on two ranks, each with another batch and thread count.
    const auto two_ranks =
        train("--max-steps 1 --threads 2 --batch-size 3" + kValFlags + outputs("fresh_np2"), 2);
    ASSERT_EQ(two_ranks.exit_code, 0) << two_ranks.output;
    ASSERT_FALSE(val_records("fresh_np2").empty());
    EXPECT_EQ(val_records("fresh_np2")[0]["val_loss"].get<double>(), fresh);

    // The step-3 weights started from (--init-from): their step-0 validation.
    struct Launch {
        std::string name;
        int ranks;  // 0: without mpiexec
        int threads, batch;
    };
    const std::vector<Launch> launches = {{"np1_w1_b2", 0, 1, 2},
                                          {"np1_w2_b2", 0, 2, 2},
                                          {"np1_w2_b5", 0, 2, 5},
                                          {"np2_w1_b2", 2, 1, 2},
                                          {"np2_w2_b3", 2, 2, 3}};
    for (const Launch& l : launches) {
        const auto run = train("--max-steps 1 --init-from " + path("trained/model_000003.bin") +
                                   " --threads " + std::to_string(l.threads) + " --batch-size " +
                                   std::to_string(l.batch) + kValFlags + outputs(l.name),
                               l.ranks);
        ASSERT_EQ(run.exit_code, 0) << l.name << "\n" << run.output;
        const std::vector<nlohmann::json> val = val_records(l.name);
        ASSERT_FALSE(val.empty()) << l.name;
        EXPECT_EQ(val[0]["step"], 0) << l.name;
        EXPECT_EQ(val[0]["val_tokens"], 400) << l.name;
        EXPECT_EQ(val[0]["val_loss"].get<double>(), at_3) << l.name;
    }
}

// --eval-only measures weights without training them: the validation loss and bits per byte the
// run measured for them (any launch), from --init-from or a checkpoint's state file; nothing is
// trained or written, not even --out-dir; a char model's bits per byte are its loss in bits.
TEST_F(ValidationRun, EvalOnlyMeasuresTheWeightsAsTrainingDidAndSavesNothing) {
    const auto trained = train("--max-steps 3" + kValFlags + outputs("trained"));
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
    const nlohmann::json at_3 = val_records("trained").back();
    ASSERT_EQ(at_3["step"], 3);
    EXPECT_DOUBLE_EQ(at_3["val_bpb"].get<double>(), at_3["val_loss"].get<double>() / std::log(2.0));
    for (const auto& [weights, ranks] :
         {std::pair{" --init-from " + path("trained/model_000003.bin"), 2},
          std::pair{" --resume " + path("trained/state_000003.bin"), 0}}) {
        const auto evaluated =
            train("--eval-only --threads 1" + weights + kValFlags + " --out-dir " + path("never") +
                      " --metrics-file " + path("eval.jsonl"),
                  ranks);
        ASSERT_EQ(evaluated.exit_code, 0) << evaluated.output;
        EXPECT_NE(
            evaluated.output.find(ranks > 0 ? "] eval of --init-from "
                                            : "] eval of the checkpoint of step 3 (--resume "),
            std::string::npos)
            << evaluated.output;
        EXPECT_EQ(evaluated.output.find("] step "), std::string::npos) << evaluated.output;
        const nlohmann::json record = test::metrics_records(path("eval.jsonl"), "val").back();
        EXPECT_EQ(record["val_loss"].get<double>(), at_3["val_loss"].get<double>());
        EXPECT_EQ(record["val_bpb"].get<double>(), at_3["val_bpb"].get<double>());
        EXPECT_TRUE(test::metrics_records(path("eval.jsonl"), "train").empty());
        EXPECT_FALSE(fs::exists(path("never"))) << evaluated.output;
    }
    const auto both = train("--eval-only --benchmark 2");
    EXPECT_EQ(both.exit_code, 2) << both.output;
}

// A validation split shorter than one window: one warning (from one rank), training goes on, no
// val records; --val-tokens is rounded down to whole windows and says so.
TEST_F(ValidationRun, ASplitTooShortForOneWindowTurnsValidationOffWithOneWarning) {
    // 30,000 characters x 0.0005: 15 validation tokens, fewer than 16 + 1.
    const auto short_split = train(
        "--max-steps 3 --val-every 1 --val-fraction 0.0005 --val-tokens 400 --checkpoint-every 0" +
            outputs("short"),
        2);
    ASSERT_EQ(short_split.exit_code, 0) << short_split.output;
    EXPECT_EQ(test::count_of(short_split.output, "no validation: --data "), 1u)
        << short_split.output;
    EXPECT_NE(short_split.output.find("validation split (--val-fraction 0.0005) holds 15 tokens, "
                                      "fewer than one window of --seq-len 16 + 1"),
              std::string::npos)
        << short_split.output;
    EXPECT_TRUE(val_records("short").empty());
    EXPECT_EQ(test::metrics_records(path("short.jsonl"), "train").size(), 3u);

    const auto rounded = train("--max-steps 1 --val-every 1 --val-tokens 410" + outputs("rounded"));
    ASSERT_EQ(rounded.exit_code, 0) << rounded.output;
    EXPECT_NE(rounded.output.find("validation: the first 400 tokens of --data "), std::string::npos)
        << rounded.output;
    EXPECT_NE(rounded.output.find("(--val-tokens 410: rounded down to whole windows)"),
              std::string::npos)
        << rounded.output;
    const std::vector<nlohmann::json> val = val_records("rounded");
    ASSERT_EQ(val.size(), 2u);
    EXPECT_EQ(val[0]["val_tokens"], 400);
}

// --val-batches is gone (its loss depended on the batch and the ranks); --val-tokens below one
// window is refused naming both flags.
TEST_F(ValidationRun, TheOldFlagAndTooFewTokensAreRefused) {
    const auto old_flag = train("--max-steps 1 --val-batches 2" + outputs("old"));
    EXPECT_EQ(old_flag.exit_code, 2) << old_flag.output;
    EXPECT_NE(old_flag.output.find("--val-batches"), std::string::npos) << old_flag.output;
    const auto too_few = train("--max-steps 1 --val-tokens 15" + outputs("few"));
    EXPECT_EQ(too_few.exit_code, 2) << too_few.output;
    EXPECT_NE(too_few.output.find("error: --val-tokens 15 is less than --seq-len 16"),
              std::string::npos)
        << too_few.output;
}

}  // namespace
}  // namespace gpt2
