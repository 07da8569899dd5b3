// Checkpoints and resume as a user meets them: an interrupted run resumed with --resume auto is
// bitwise identical to an uninterrupted one (also under mpiexec); SIGTERM stops cleanly with a
// checkpoint; a crash mid-write never costs the previous checkpoint; non-finite steps are skipped.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include <unistd.h>

#include "core/file_io.hpp"
#include "core/random.hpp"
#include "formats/checkpoint.hpp"
#include "formats/resume_state.hpp"
#include "optim/spike_guard.hpp"
#include "process_support.hpp"
#include "train/log_lines.hpp"
#include "train_run_fixture.hpp"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;
using test::TrainRun;

using test::run_command;
using test::ScratchDir;

std::string train_command(const ScratchDir& dir, const std::string& out, int ranks,
                          const std::string& extra) {
    const std::string launcher = ranks > 0 ? test::mpiexec(ranks) : "";
    // `extra` replaces the flags it gives too (a flag given twice is refused).
    return launcher + test::build_path("train_gpt2") +
           test::without_given(
               test::small_model(32) +
                   " --batch-size 4 --lr 1e-3"
                   " --warmup-steps 3 --val-every 5 --val-tokens 256 --sample-every 0"
                   " --checkpoint-every 0 --seed 11 --data " +
                   (dir / "corpus.txt") + " --out-dir " + (dir / out) + " --metrics-file " +
                   (dir / (out + ".jsonl")),
               extra) +
           " " + extra;
}

bool same_params(const std::filesystem::path& a, const std::filesystem::path& b) {
    const LoadedModel x = load_checkpoint(a);
    const LoadedModel y = load_checkpoint(b);
    return x.model.config == y.model.config &&
           std::memcmp(x.model.params.data(), y.model.params.data(),
                       x.model.params.size() * sizeof(float)) == 0;
}

// Trains 20 steps straight, and 10 + 10 with a stop and --resume auto between: same losses and
// parameters, bit for bit.
void expect_bitwise_resume(int ranks, int threads, const std::string& precision,
                           const std::string& model = "") {
    const ScratchDir dir("gpt2-resume-" + std::to_string(ranks) + "-" + std::to_string(threads) +
                         "-" + precision + (model.empty() ? "" : "-model"));
    test::write_corpus(dir.path() / "corpus.txt", 40000);
    const std::string flags = "--max-steps 20 --threads " + std::to_string(threads) +
                              " --precision " + precision + (model.empty() ? "" : " " + model);
    const auto straight = run_command(train_command(dir, "straight", ranks, flags));
    ASSERT_EQ(straight.exit_code, 0) << straight.output;
    EXPECT_NE(straight.output.find("precision " + precision), std::string::npos) << straight.output;
    const auto first =
        run_command(train_command(dir, "resumed", ranks, flags + " --stop-at-step 10"));
    ASSERT_EQ(first.exit_code, 0) << first.output;
    EXPECT_NE(first.output.find(std::string(log_lines::kStoppedBySignal) + " 10"),
              std::string::npos)
        << first.output;
    const auto second = run_command(train_command(dir, "resumed", ranks, flags + " --resume auto"));
    ASSERT_EQ(second.exit_code, 0) << second.output;
    EXPECT_NE(second.output.find("at step 10"), std::string::npos) << second.output;

    const std::vector<double> a = test::metrics_values(dir / "straight.jsonl", "train", "loss");
    const std::vector<double> b = test::metrics_values(dir / "resumed.jsonl", "train", "loss");
    ASSERT_EQ(a.size(), 20u);
    EXPECT_EQ(a, b);  // bitwise: the metrics file prints doubles exactly
    EXPECT_TRUE(same_params(model_path(dir / "straight", 20), model_path(dir / "resumed", 20)));
}

class Resume : public ::testing::TestWithParam<std::pair<int, int>> {};  // (ranks, threads)

TEST_P(Resume, InterruptedAndResumedRunIsBitwiseIdenticalToAStraightRun) {
    const auto [ranks, threads] = GetParam();
    expect_bitwise_resume(ranks, threads, "fp32");
}

INSTANTIATE_TEST_SUITE_P(RanksThreads, Resume, ::testing::Values(std::pair{0, 2}, std::pair{2, 1}),
                         [](const ::testing::TestParamInfo<std::pair<int, int>>& info) {
                             return "ranks" + std::to_string(info.param.first) + "_threads" +
                                    std::to_string(info.param.second);
                         });

// Checkpoints hold the fp32 master weights; the bf16 copy is rebuilt from them on resume exactly
// as AdamW writes it, so bf16 training resumes bit for bit too.
TEST(Resume, Bf16RunResumesBitwiseIdenticalToAStraightRun) {
    expect_bitwise_resume(0, 2, "bf16");
}

// The Llama family's block (rotary positions, grouped-query attention, SwiGLU, RMSNorm, its
// version-7 state) on two ranks: the same.
TEST(Resume, ALlamaFamilyRunOfTwoRanksResumesBitwise) {
    expect_bitwise_resume(2, 1, "fp32", "--model llama-tiny");
}

// The speedrun's block (QK-norm, the embeddings' norm, an untied head starting at zero, its
// version-8 state) on two ranks, the untied head's gradient through the overlapped exchange, and
// in bf16: the same.
TEST(Resume, ASpeedrunRunOfTwoRanksResumesBitwise) {
    expect_bitwise_resume(2, 1, "fp32",
                          "--model speedrun --n-layer 2 --n-head 2 --n-embd 64 --block-size 64");
}
TEST(Resume, ASpeedrunRunInBf16ResumesBitwise) {
    expect_bitwise_resume(0, 2, "bf16",
                          "--model speedrun --n-layer 2 --n-head 2 --n-embd 64 --block-size 64");
}

TEST(Signals, SigtermStopsAtAStepBoundaryWithACheckpointThatResumes) {
    const ScratchDir dir("gpt2-sigterm");
    test::write_corpus(dir.path() / "corpus.txt", 40000);
    const std::string command =
        train_command(dir, "out", 0, "--max-steps 100000 --threads 2 --log-every 1");
    const std::string log = dir / "log.txt";
    const auto result = run_command("bash -c '" + command + " > " + log + " 2>&1 & pid=$!; " +
                                    test::wait_for_log(log, "step 5/") +
                                    "kill -TERM $pid; wait $pid; echo exit=$?'");
    EXPECT_EQ(test::echoed_exit_code(result.output), 0) << result.output;
    const std::string text = read_text_file(log);
    EXPECT_NE(text.find("stopped by signal"), std::string::npos) << text;
    const std::vector<std::int64_t> steps = list_checkpoints(dir.path() / "out");
    ASSERT_EQ(steps.size(), 1u) << text;
    const auto resumed =
        run_command(train_command(dir, "out", 0,
                                  "--max-steps 100000 --threads 2 --resume auto --stop-at-step " +
                                      std::to_string(steps[0] + 2)));
    EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("at step " + std::to_string(steps[0])), std::string::npos)
        << resumed.output;
    EXPECT_EQ(list_checkpoints(dir.path() / "out").front(), steps[0] + 2);
}

TEST(CrashDuringWrite, ResumeUsesTheNewestCompleteCheckpoint) {
    const ScratchDir dir("gpt2-crash");
    test::write_corpus(dir.path() / "corpus.txt", 40000);
    const auto run = run_command(
        train_command(dir, "out", 0, "--max-steps 10 --checkpoint-every 5 --keep-checkpoints 0"));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const auto out = dir.path() / "out";
    ASSERT_EQ(list_checkpoints(out), (std::vector<std::int64_t>{10, 5}));
    // A writer killed mid-way leaves a temporary file, and one killed between the model and its
    // state leaves a model without state; neither may be taken for a checkpoint.
    std::filesystem::copy_file(model_path(out, 10), out / "model_000015.bin");
    std::ofstream(out / "state_000020.bin.tmp.4242") << "partial";
    // And the newest complete-looking checkpoint is corrupt (a flipped byte): skipped.
    {
        std::fstream f(model_path(out, 10), std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(4096);
        f.put('\x7f');
    }
    const auto resumed = run_command(train_command(dir, "out", 0, "--max-steps 10 --resume auto"));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("checksum mismatch"), std::string::npos) << resumed.output;
    EXPECT_NE(resumed.output.find(std::string(log_lines::kResumingFrom) + " " +
                                  state_path(out, 5).string()),
              std::string::npos)
        << resumed.output;
}

TEST(NonFinite, AStepWithANanGradientIsSkippedAndTrainingContinues) {
    const ScratchDir dir("gpt2-nan");
    test::write_corpus(dir.path() / "corpus.txt", 40000);
    const auto result =
        run_command(train_command(dir, "out", 0, "--max-steps 6 --inject-nan-step 2"));
    EXPECT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("step 3: non-finite"), std::string::npos) << result.output;
    const std::vector<double> losses = test::metrics_values(dir / "out.jsonl", "train", "loss");
    ASSERT_EQ(losses.size(), 6u);
    EXPECT_TRUE(std::isfinite(losses.back()));
    EXPECT_LT(losses.back(), losses.front());
}

TEST(NonFinite, TooManyBadStepsStopTheRunAndKeepTheLastGoodCheckpoint) {
    const ScratchDir dir("gpt2-nan-stop");
    test::write_corpus(dir.path() / "corpus.txt", 40000);
    const auto result = run_command(train_command(
        dir, "out", 2,
        "--max-steps 8 --threads 1 --checkpoint-every 2 --inject-nan-step 4 --max-bad-steps 1"));
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("skipped steps in a row (non-finite or spikes, --max-bad-steps)"),
              std::string::npos)
        << result.output;
    const auto steps = list_checkpoints(dir.path() / "out");
    ASSERT_FALSE(steps.empty());
    EXPECT_EQ(steps.front(), 4);
    EXPECT_NO_THROW((void)load_checkpoint(model_path(dir.path() / "out", 4)));
}

// ---- checkpoints of another run ----

TEST_F(TrainRun, AFreshRunRefusesAnOutDirHoldingCheckpoints) {
    ASSERT_EQ(train("--max-steps 4 --checkpoint-every 2 --out-dir " + path("out")).exit_code, 0);
    const auto again = train("--max-steps 2 --out-dir " + path("out"));
    EXPECT_EQ(again.exit_code, 2) << again.output;
    EXPECT_NE(again.output.find("already holds checkpoints (model_000002.bin, model_000004.bin"),
              std::string::npos)
        << again.output;
    EXPECT_NE(again.output.find("--resume auto"), std::string::npos) << again.output;
    // Nothing of the earlier run was touched.
    EXPECT_EQ(list_checkpoints(path("out")), (std::vector<std::int64_t>{4, 2}));
}

TEST_F(TrainRun, PruningOnlyRemovesCheckpointsOfItsOwnLineage) {
    ASSERT_EQ(
        train("--max-steps 6 --checkpoint-every 2 --keep-checkpoints 0 --out-dir " + path("out"))
            .exit_code,
        0);
    ASSERT_EQ(train("--max-steps 2 --out-dir " + path("other")).exit_code, 0);
    // Another run's (newer-numbered) checkpoint lands in the directory.
    fs::copy_file(path("other/model_000002.bin"), path("out/model_000100.bin"));
    fs::copy_file(path("other/state_000002.bin"), path("out/state_000100.bin"));
    const auto resumed = train("--resume " + path("out/state_000006.bin") +
                               " --max-steps 8 --checkpoint-every 1 --keep-checkpoints 1 "
                               "--out-dir " +
                               path("out"));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    // This lineage keeps its newest (8); the other run's 100 is untouched.
    EXPECT_EQ(list_checkpoints(path("out")), (std::vector<std::int64_t>{100, 8}));
}

TEST(ResumeStateFile, HeaderIsWrittenFieldByFieldWithLineageScheduleLengthAndSpikeWindows) {
    const ScratchDir dir("gpt2-state-format");
    const ModelConfig config{16, 50, 64, 1, 2, 8};
    OptimizerState optimizer(ParameterLayout(config).total());
    optimizer.step = 77;
    ResumeState state;
    state.step = 12;
    state.seed = 99;
    state.sequences_per_step = 8;
    state.seq_len = 16;
    state.sample_rng = Rng::State{1, 2, 3, 4};
    state.run_id = 0x1234567890abcdefULL;
    state.lr_decay_steps = 600;
    for (int i = 0; i < 130; ++i)  // one full window that wrapped, one partly filled
        (void)state.loss_window.push(0.5 * i);
    (void)state.norm_window.push(3.25);
    const fs::path path = dir.path() / "state_000012.bin";
    save_resume_state(path, state, config, optimizer);
    // 124 header bytes with no padding, the two spike windows (count, next, 128 doubles), two
    // moment arrays, one checksum.
    EXPECT_EQ(fs::file_size(path), 124 + 2 * (8 + 8 * 128) + 2 * 4 * optimizer.m.size() + 8);
    const std::vector<std::uint8_t> bytes = read_file_bytes(path);
    EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 8), "GPT2STA3");
    std::int32_t seq_len = 0;
    std::memcpy(&seq_len, bytes.data() + 32, 4);
    EXPECT_EQ(seq_len, 16);
    std::uint64_t num_params = 0;  // right after the six shape ints: no padding before it
    std::memcpy(&num_params, bytes.data() + 60, 8);
    EXPECT_EQ(num_params, optimizer.m.size());
    EXPECT_EQ(read_run_id(path), state.run_id);
    OptimizerState loaded_optimizer(optimizer.m.size());
    const ResumeState loaded = load_resume_state(path, config, loaded_optimizer);
    EXPECT_EQ(loaded.run_id, state.run_id);
    EXPECT_EQ(loaded.lr_decay_steps, 600);
    EXPECT_EQ(loaded.sample_rng, state.sample_rng);
    EXPECT_EQ(loaded.loss_window.values, state.loss_window.values);
    EXPECT_EQ(loaded.loss_window.count, 128u);
    EXPECT_EQ(loaded.loss_window.next, 2u);
    EXPECT_EQ(loaded.norm_window.count, 1u);
    EXPECT_EQ(loaded.norm_window.values[0], 3.25);
    EXPECT_EQ(loaded_optimizer.step, 77);
}

TEST(ResumeStateFile, VersionOneFilesStillLoad) {
    // Version 1 was a raw struct: 4 padding bytes after the shape, no lineage.
    const ScratchDir dir("gpt2-state-v1");
    const ModelConfig config{16, 50, 64, 1, 2, 8};
    const std::size_t P = ParameterLayout(config).total();
    std::vector<std::uint8_t> bytes;
    const auto put = [&](const auto& value) {
        const auto* p = reinterpret_cast<const std::uint8_t*>(&value);
        bytes.insert(bytes.end(), p, p + sizeof(value));
    };
    for (const char c : std::string("GPT2STA1"))
        put(c);
    put(std::int64_t{7});
    put(std::uint64_t{3});
    put(std::int64_t{8});
    put(std::int32_t{16});
    for (const std::int32_t v : {16, 50, 64, 1, 2, 8})
        put(v);
    put(std::int32_t{0});  // padding
    put(static_cast<std::uint64_t>(P));
    put(std::int64_t{7});
    for (const std::uint64_t v : {5, 6, 7, 8})
        put(v);
    ASSERT_EQ(bytes.size(), 112u);
    std::vector<float> moments(2 * P, 0.5f);
    const std::size_t header = bytes.size();
    bytes.resize(header + moments.size() * 4);
    std::memcpy(bytes.data() + header, moments.data(), moments.size() * 4);
    const std::span<const std::uint8_t> all(bytes);
    const std::uint64_t sum =
        checksum64(all.subspan(header + P * 4, P * 4),
                   checksum64(all.subspan(header, P * 4), checksum64(all.first(header))));
    put(sum);
    const fs::path path = dir.path() / "state_000007.bin";
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    OptimizerState optimizer(P);
    const ResumeState state = load_resume_state(path, config, optimizer);
    EXPECT_EQ(state.step, 7);
    EXPECT_EQ(state.run_id, 0u);
    EXPECT_EQ(state.sample_rng, (Rng::State{5, 6, 7, 8}));
    EXPECT_EQ(optimizer.v[P - 1], 0.5f);
    EXPECT_FALSE(read_run_id(path).has_value());
}

// A LoRA state is version 5: version 4's LoRA record (rank, alpha, targets, base, fingerprint)
// and then the input dropout rate. A version 4 file (the same without the rate) still loads, as a
// run without LoRA's dropout.
TEST(ResumeStateFile, LoraStatesRecordTheInputDropoutAndVersionFourFilesStillLoad) {
    const ScratchDir dir("gpt2-state-lora");
    const ModelConfig config{16, 50, 64, 1, 2, 8};
    OptimizerState optimizer(1000);  // the adapter's moments
    for (std::size_t i = 0; i < optimizer.m.size(); ++i)
        optimizer.m[i] = static_cast<float>(i);
    ResumeState state;
    state.step = 3;
    state.seq_len = 16;
    state.lora.config = LoraConfig{4, 8.0f, {true, false, true, false}, 0.25f};
    state.lora.base_from_file = true;
    state.lora.base_fingerprint = 0xfeedULL;
    const fs::path v5 = dir.path() / "state_000003.bin";
    save_resume_state(v5, state, config, optimizer);
    std::vector<std::uint8_t> bytes = read_file_bytes(v5);
    EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 8), "GPT2STA5");
    const std::size_t v4_header = 124 + 2 * (8 + 8 * 128) + 24;
    const std::size_t floats = optimizer.m.size() * 4;
    ASSERT_EQ(bytes.size(), v4_header + 4 + 2 * floats + 8);
    OptimizerState loaded_optimizer(optimizer.m.size());
    const ResumeState loaded = load_resume_state(v5, config, loaded_optimizer);
    EXPECT_EQ(loaded.lora.config, state.lora.config);
    EXPECT_EQ(loaded.lora.base_fingerprint, 0xfeedULL);
    EXPECT_EQ(read_state_header(v5)->lora.config.dropout, 0.25f);
    EXPECT_TRUE(std::equal(optimizer.m.span().begin(), optimizer.m.span().end(),
                           loaded_optimizer.m.span().begin()));

    // The same state as version 4 wrote it: magic 4, no rate, the checksum over those bytes.
    bytes[7] = '4';
    bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(v4_header),
                bytes.begin() + static_cast<std::ptrdiff_t>(v4_header + 4));
    bytes.resize(bytes.size() - 8);
    const std::span<const std::uint8_t> all(bytes);
    const std::uint64_t sum =
        checksum64(all.subspan(v4_header + floats, floats),
                   checksum64(all.subspan(v4_header, floats), checksum64(all.first(v4_header))));
    const auto* p = reinterpret_cast<const std::uint8_t*>(&sum);
    bytes.insert(bytes.end(), p, p + sizeof(sum));
    const fs::path v4 = dir.path() / "v4" / "state_000003.bin";
    fs::create_directories(v4.parent_path());
    std::ofstream(v4, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    const ResumeState old = load_resume_state(v4, config, loaded_optimizer);
    LoraConfig without_dropout = state.lora.config;
    without_dropout.dropout = 0.0f;
    EXPECT_EQ(old.lora.config, without_dropout);
    EXPECT_EQ(old.lora.base_fingerprint, 0xfeedULL);
    EXPECT_TRUE(std::equal(optimizer.m.span().begin(), optimizer.m.span().end(),
                           loaded_optimizer.m.span().begin()));
}

TEST_F(TrainRun, AStrayFileWithAHugeStepNumberIsSkippedWithAWarning) {
    ASSERT_EQ(train("--max-steps 2 --out-dir " + path("out")).exit_code, 0);
    std::ofstream(path("out/model_99999999999999999999.bin")) << "x";
    std::ofstream(path("out/state_99999999999999999999.bin")) << "x";
    EXPECT_EQ(list_checkpoints(path("out")), (std::vector<std::int64_t>{2}));
    const auto resumed =
        train("--resume auto --max-steps 3 --keep-checkpoints 1 --out-dir " + path("out"));
    EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("model_99999999999999999999.bin: not a checkpoint of ours"),
              std::string::npos)
        << resumed.output;
    EXPECT_NE(resumed.output.find(log_lines::kResumingFrom), std::string::npos) << resumed.output;
}

// ---- where checkpoints go, checked before any step ----

TEST_F(TrainRun, AReadOnlyOutDirIsRefusedBeforeAnyStep) {
    // Root writes through permission bits, so root gets a read-only file system instead.
    const fs::path out = path("read-only");
    fs::create_directories(out);
    std::optional<test::TinyFileSystem> read_only;
    if (::geteuid() == 0) {
        read_only.emplace(out, "1m", "ro");
        if (!read_only->mounted()) GTEST_SKIP() << "cannot mount a read-only tmpfs here";
    } else {
        fs::permissions(out, fs::perms::owner_read | fs::perms::owner_exec);
    }
    // The directory itself, and one that would be made inside it.
    for (const fs::path& dir : {out, out / "new"}) {
        const auto result = train("--max-steps 5 --out-dir " + dir.string());
        EXPECT_EQ(result.exit_code, 1) << result.output;
        EXPECT_NE(result.output.find("error: --out-dir " + dir.string() + " cannot be written"),
                  std::string::npos)
            << result.output;
        EXPECT_EQ(result.output.find("step 1/"), std::string::npos) << result.output;
        EXPECT_EQ(result.output.find("corpus "), std::string::npos)  // refused before the corpus
            << result.output;
    }
}

TEST_F(TrainRun, AnOutDirWithoutRoomForOneCheckpointIsRefusedBeforeAnyStep) {
    const fs::path out = path("small");
    const test::TinyFileSystem tiny(out, "128k");
    if (!tiny.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here";
    const auto result = train("--max-steps 5 --out-dir " + out.string());
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_NE(result.output.find("error: --out-dir " + out.string() + " has "), std::string::npos)
        << result.output;
    EXPECT_NE(result.output.find("free, but one checkpoint takes"), std::string::npos)
        << result.output;
    EXPECT_EQ(result.output.find("step 1/"), std::string::npos) << result.output;
    EXPECT_TRUE(fs::is_empty(out));  // nor the write probe left behind
}

TEST(CheckpointSizes, TheFootprintOfTheRoomCheckIsTheSizeOfTheFilesWritten) {
    const ScratchDir dir("gpt2-checkpoint-sizes");
    const ModelConfig config{16, 70, 128, 2, 2, 32};
    const Model model(config);
    const CheckpointExtras extras{std::vector<std::uint8_t>(1234, 7), std::string(321, 'x')};
    const fs::path model_file = save_checkpoint(dir.path() / "model_000001.bin", model, extras);
    EXPECT_EQ(fs::file_size(model_file), checkpoint_file_bytes(config, 1234, 321));
    for (const bool lora : {false, true}) {
        OptimizerState optimizer(lora ? 999 : ParameterLayout(config).total());
        ResumeState state;
        if (lora) state.lora.config = LoraConfig{4, 8.0f, {true, true, true, true}, 0.0f};
        const fs::path state_file = dir.path() / "state_000001.bin";
        save_resume_state(state_file, state, config, optimizer);
        EXPECT_EQ(fs::file_size(state_file), resume_state_file_bytes(optimizer.m.size(), lora));
    }
}

// ---- damaged checkpoints and model files without their state ----

TEST_F(TrainRun, ResumeAutoSkipsDamagedStateFilesForTheNewestCheckpointThatVerifies) {
    ASSERT_EQ(
        train("--max-steps 6 --checkpoint-every 2 --keep-checkpoints 0 --out-dir " + path("out"))
            .exit_code,
        0);
    {  // one flipped bit in the newest state, the next one truncated
        std::fstream f(path("out/state_000006.bin"),
                       std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(1000);
        const char byte = static_cast<char>(f.get());
        f.seekp(1000);
        f.put(static_cast<char>(byte ^ 0x10));
    }
    fs::resize_file(path("out/state_000004.bin"), fs::file_size(path("out/state_000004.bin")) / 2);
    const auto resumed =
        train("--resume auto --max-steps 6 --checkpoint-every 2 --out-dir " + path("out"));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("skipping checkpoint at step 6: " + path("out/state_000006.bin") +
                                  ": checksum mismatch"),
              std::string::npos)
        << resumed.output;
    EXPECT_NE(resumed.output.find("skipping checkpoint at step 4: " + path("out/state_000004.bin") +
                                  ": resume state has"),
              std::string::npos)
        << resumed.output;
    EXPECT_NE(resumed.output.find("2 damaged checkpoints skipped"), std::string::npos)
        << resumed.output;
    EXPECT_NE(resumed.output.find(std::string(log_lines::kResumingFrom) + " " +
                                  path("out/state_000002.bin")),
              std::string::npos)
        << resumed.output;
    // Trained again from step 2, the damaged files were replaced by whole ones.
    for (const std::int64_t step : {4, 6})
        EXPECT_NO_THROW(verify_resume_state(state_path(path("out"), step))) << step;
}

// A damaged newer checkpoint of the same run does not count as the newest when pruning: the one
// just written is kept (with --keep-checkpoints 1 it was the one deleted), the damaged one left.
TEST_F(TrainRun, PruningKeepsTheCheckpointJustWrittenOverADamagedNewerOne) {
    ASSERT_EQ(
        train("--max-steps 6 --checkpoint-every 1 --keep-checkpoints 0 --out-dir " + path("out"))
            .exit_code,
        0);
    for (const char* state : {"out/state_000006.bin", "out/state_000005.bin"}) {
        std::fstream f(path(state), std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(2000);
        f.put('\x55');  // the moments, not the header: the lineage still reads
    }
    const auto resumed = train(
        "--resume auto --max-steps 5 --checkpoint-every 1 "
        "--keep-checkpoints 1 --out-dir " +
        path("out"));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find(std::string(log_lines::kResumingFrom) + " " +
                                  path("out/state_000004.bin")),
              std::string::npos)
        << resumed.output;
    EXPECT_EQ(list_checkpoints(path("out")), (std::vector<std::int64_t>{6, 5}));
    EXPECT_NO_THROW(verify_resume_state(state_path(path("out"), 5)));
}

TEST_F(TrainRun, ResumeAutoWithOnlyDamagedCheckpointsIsRefusedNotStartedAfresh) {
    ASSERT_EQ(train("--max-steps 2 --out-dir " + path("out")).exit_code, 0);
    fs::resize_file(path("out/state_000002.bin"), 100);
    const auto resumed = train("--resume auto --max-steps 4 --out-dir " + path("out"));
    EXPECT_EQ(resumed.exit_code, 1) << resumed.output;
    EXPECT_NE(resumed.output.find("no checkpoint in " + path("out") +
                                  " can be resumed: every one is damaged (steps 2"),
              std::string::npos)
        << resumed.output;
    EXPECT_EQ(resumed.output.find("starting fresh"), std::string::npos) << resumed.output;
}

TEST_F(TrainRun, AModelFileWithoutItsStateIsCalledAFinishedModelAndNeverOverwritten) {
    ASSERT_EQ(train("--max-steps 2 --out-dir " + path("out")).exit_code, 0);
    fs::remove(path("out/state_000002.bin"));  // as a full disk leaves it
    const std::vector<std::uint8_t> model = read_file_bytes(path("out/model_000002.bin"));
    for (const std::string resume : {"", " --resume auto"}) {
        const auto result = train("--max-steps 2 --out-dir " + path("out") + resume);
        EXPECT_EQ(result.exit_code, 2) << resume << "\n" << result.output;
        EXPECT_NE(result.output.find("model_000002.bin has no state file: a finished model, not a "
                                     "run to resume (train from its weights with --init-from " +
                                     path("out/model_000002.bin")),
                  std::string::npos)
            << resume << "\n"
            << result.output;
        EXPECT_EQ(result.output.find("continue that run with --resume auto"), std::string::npos)
            << result.output;
        EXPECT_EQ(result.output.find("starting fresh"), std::string::npos) << result.output;
    }
    EXPECT_EQ(read_file_bytes(path("out/model_000002.bin")), model);
    // What the message advises works.
    const auto from_it = train("--max-steps 2 --init-from " + path("out/model_000002.bin") +
                               " --out-dir " + path("tuned"));
    EXPECT_EQ(from_it.exit_code, 0) << from_it.output;
}

TEST_F(TrainRun, ResumeOfAMissingStateFileNamesTheFileGiven) {
    ASSERT_EQ(train("--max-steps 2 --out-dir " + path("out")).exit_code, 0);
    const auto missing = train("--resume " + path("out/state_000100.bin") + " --max-steps 4");
    EXPECT_EQ(missing.exit_code, 1) << missing.output;
    EXPECT_NE(
        missing.output.find("error: --resume " + path("out/state_000100.bin") + ": no such file"),
        std::string::npos)
        << missing.output;
    fs::remove(path("out/model_000002.bin"));
    const auto no_model = train("--resume " + path("out/state_000002.bin") + " --max-steps 4");
    EXPECT_EQ(no_model.exit_code, 1) << no_model.output;
    EXPECT_NE(
        no_model.output.find("its model file " + path("out/model_000002.bin") + " is missing"),
        std::string::npos)
        << no_model.output;
    const auto model_named = train("--resume " + path("out/model_000002.bin") + " --max-steps 4");
    EXPECT_EQ(model_named.exit_code, 2) << model_named.output;
    EXPECT_NE(model_named.output.find("is a model file: name its state file, " +
                                      path("out/state_000002.bin")),
              std::string::npos)
        << model_named.output;
}

// ---- runs with nothing to do, or nothing saved ----

TEST_F(TrainRun, ResumingPastMaxStepsSaysSo) {
    ASSERT_EQ(train("--max-steps 4 --out-dir " + path("out")).exit_code, 0);
    const auto result = train("--resume auto --max-steps 3 --out-dir " + path("out"));
    EXPECT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("nothing to do: the checkpoint is at step 4 and --max-steps is 3"),
              std::string::npos)
        << result.output;
}

TEST_F(TrainRun, TheNonFiniteStopDoesNotClaimACheckpointThatDoesNotExist) {
    const auto result =
        train("--max-steps 5 --inject-nan-step 0 --max-bad-steps 1 --out-dir " + path("out"));
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("this run has written no checkpoint yet"), std::string::npos)
        << result.output;
    EXPECT_EQ(result.output.find("is kept"), std::string::npos) << result.output;
}

TEST_F(TrainRun, ResumingWithALargerMaxStepsKeepsTheLearningRateSchedule) {
    ASSERT_EQ(train("--max-steps 10 --metrics-file " + path("straight.jsonl") + " --out-dir " +
                    path("straight"))
                  .exit_code,
              0);
    ASSERT_EQ(train("--max-steps 10 --stop-at-step 5 --out-dir " + path("out")).exit_code, 0);
    const auto longer = train("--resume auto --max-steps 20 --metrics-file " +
                              path("longer.jsonl") + " --out-dir " + path("out"));
    ASSERT_EQ(longer.exit_code, 0) << longer.output;
    const auto straight = test::metrics_records(path("straight.jsonl"), "train");
    const auto resumed = test::metrics_records(path("longer.jsonl"), "train");
    ASSERT_EQ(straight.size(), 10u);
    ASSERT_EQ(resumed.size(), 15u);
    EXPECT_EQ(resumed[0]["step"], 6);
    for (int i = 0; i < 5; ++i)  // steps 6..10 as the 10-step schedule had them
        EXPECT_EQ(resumed[i]["lr"], straight[5 + i]["lr"]) << "step " << 6 + i;
    // Asked for explicitly, a new schedule length is honoured.
    ASSERT_EQ(train("--max-steps 10 --stop-at-step 5 --out-dir " + path("out2")).exit_code, 0);
    ASSERT_EQ(train("--resume auto --max-steps 20 --lr-decay-steps 20 --metrics-file " +
                    path("explicit.jsonl") + " --out-dir " + path("out2"))
                  .exit_code,
              0);
    const auto explicit_length = test::metrics_records(path("explicit.jsonl"), "train");
    ASSERT_FALSE(explicit_length.empty());
    EXPECT_GT(explicit_length[0]["lr"].get<double>(), straight[5]["lr"].get<double>());
}

}  // namespace
}  // namespace gpt2
