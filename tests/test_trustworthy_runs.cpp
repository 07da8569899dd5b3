// train_gpt2 never loses work and never ignores what it was told: checkpoints of another run are
// neither overwritten nor pruned, contradictory flags are refused, config files are strict,
// the schedule survives a longer resume, clean stops exit 0 under mpiexec, and the one voice
// (exit codes, error lines, --version, --help) holds. Each test failed before its fix.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/random.hpp"
#include "core/utf8.hpp"
#include "formats/checkpoint.hpp"
#include "model/model.hpp"
#include "model/spike_guard.hpp"
#include "parallel/comm.hpp"
#include "process_support.hpp"
#include "threads/thread_pool.hpp"
#include "train/resume_state.hpp"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;
using test::run_command;
using test::ScratchDir;

const fs::path kGpt2Dir = fs::path(GPT2_SHARED_DATA_DIR) / "gpt2";

constexpr const char* kSmall =
    " --n-layer 2 --n-head 2 --n-embd 32 --seq-len 16 --batch-size 2 --threads 1"
    " --val-every 0 --sample-every 0 --lr 1e-3 --warmup-steps 2 --seed 5";

// A test's working directory with a corpus; `train(...)` runs one process with the small model.
class Run : public ::testing::Test {
  protected:
    void SetUp() override {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        dir_ = std::make_unique<ScratchDir>(std::string("gpt2-trust-") + info->name());
        test::write_corpus(dir_->path() / "corpus.txt", 30000);
    }
    [[nodiscard]] std::string path(const std::string& name) const { return *dir_ / name; }
    [[nodiscard]] std::string command(const std::string& flags, int ranks = 0) const {
        return (ranks > 0 ? test::mpiexec(ranks) : std::string()) + test::build_path("train_gpt2") +
               kSmall + " --data " + path("corpus.txt") + " " + flags;
    }
    [[nodiscard]] test::ProcessResult train(const std::string& flags, int ranks = 0) const {
        return run_command(command(flags, ranks));
    }
    std::unique_ptr<ScratchDir> dir_;
};

std::size_t count(const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
        ++n;
    return n;
}

// ---- 1. checkpoints of another run ----

TEST_F(Run, AFreshRunRefusesAnOutDirHoldingCheckpoints) {
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

TEST_F(Run, PruningOnlyRemovesCheckpointsOfItsOwnLineage) {
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
    AdamWState optimizer(ParameterLayout(config).total());
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
    AdamWState loaded_optimizer(optimizer.m.size());
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
    AdamWState optimizer(P);
    const ResumeState state = load_resume_state(path, config, optimizer);
    EXPECT_EQ(state.step, 7);
    EXPECT_EQ(state.run_id, 0u);
    EXPECT_EQ(state.sample_rng, (Rng::State{5, 6, 7, 8}));
    EXPECT_EQ(optimizer.v[P - 1], 0.5f);
    EXPECT_FALSE(read_run_id(path).has_value());
}

TEST_F(Run, AStrayFileWithAHugeStepNumberIsSkippedWithAWarning) {
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
    EXPECT_NE(resumed.output.find("resuming from"), std::string::npos) << resumed.output;
}

// ---- 2. config files ----

struct ConfigCase {
    const char* name;
    const char* text;
    const char* expected;  // in the error
};

class ConfigFile : public Run, public ::testing::WithParamInterface<ConfigCase> {};

TEST_P(ConfigFile, AnythingUnknownIsRefusedWithFileLineAndKey) {
    const ConfigCase& c = GetParam();
    std::ofstream(path("run.toml")) << "max-steps = 2\n" << c.text << "\n";
    const auto result = train("--config " + path("run.toml") + " --out-dir " + path("out"));
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find("--config " + path("run.toml") + ":2"), std::string::npos)
        << result.output;
    EXPECT_NE(result.output.find(c.expected), std::string::npos) << result.output;
    EXPECT_FALSE(fs::exists(path("out"))) << "the run went ahead";
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ConfigFile,
    ::testing::Values(
        ConfigCase{"misspelled", "n-layr = 2", "unknown key 'n-layr' (did you mean 'n-layer'?)"},
        ConfigCase{"section", "[train]", "sections such as [train] are not supported"},
        ConfigCase{"yaml_style", "max-steps: 3", "expected 'flag = value'"},
        ConfigCase{"no_such_flag", "colour = \"blue\"", "unknown key 'colour'"},
        ConfigCase{"array", "lr = [0.1, 0.2]", "arrays and tables are not supported"},
        ConfigCase{"switch_value", "no-shuffle = 3", "no-shuffle is a switch"}),
    [](const ::testing::TestParamInfo<ConfigCase>& info) { return std::string(info.param.name); });

TEST_F(Run, ConfigFilesAcceptUnderscoresAndSayTheyWereApplied) {
    std::ofstream(path("run.toml")) << "# both spellings\nmax_steps = 3\ngrad-accum = 2\n"
                                       "out_dir = \""
                                    << path("cfg-out")
                                    << "\"\n"
                                       "no_shuffle = true\n";
    const auto result = train("--config " + path("run.toml"));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("config file " + path("run.toml") + " applied"), std::string::npos)
        << result.output;
    EXPECT_NE(result.output.find("step 3/3 |"), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("grad accum 2"), std::string::npos) << result.output;
    EXPECT_TRUE(fs::exists(path("cfg-out/model_000003.bin")));
}

// ---- 3, 4. weights, tokenizer and shape flags ----

// A plain llm.c model file (no tokenizer) of vocabulary V.
std::string write_llmc_model(const std::string& path, int V) {
    // The shape of kSmall, so that only the vocabulary differs.
    Model model(ModelConfig{16, V, pad_vocab(V), 2, 2, 32});
    init_parameters(model, 3);
    return save_checkpoint(path, model, std::nullopt).string();
}

TEST_F(Run, APlainGpt2ModelFileIsNotTrainedOnCharacterIds) {
    const std::string model = write_llmc_model(path("gpt2_tiny.bin"), 50257);
    const auto refused =
        train("--init-from " + model + " --tokenizer char --max-steps 1 --out-dir " + path("a"));
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_NE(refused.output.find("vocabulary (50257) is not the char tokenizer's"),
              std::string::npos)
        << refused.output;
    if (!fs::exists(kGpt2Dir / "encoder.json")) GTEST_SKIP() << "no GPT-2 tokenizer files";
    // Without --tokenizer, a 50257-token llm.c file gets GPT-2's tokenizer, and says so.
    const auto defaulted = train("--init-from " + model + " --tokenizer-dir " + kGpt2Dir.string() +
                                 " --max-steps 1 --out-dir " + path("b"));
    ASSERT_EQ(defaulted.exit_code, 0) << defaulted.output;
    EXPECT_NE(defaulted.output.find("no tokenizer in the file; using GPT-2's"), std::string::npos)
        << defaulted.output;
    EXPECT_NE(defaulted.output.find("--init-from " + model + ": model L=2"), std::string::npos)
        << defaulted.output;
    EXPECT_NE(defaulted.output.find("tokenizer gpt2 (vocab 50257)"), std::string::npos)
        << defaulted.output;
}

TEST_F(Run, APlainModelFileOfAnotherVocabularyNeedsItsTokenizerNamed) {
    const std::string model = write_llmc_model(path("odd.bin"), 300);
    const auto refused = train("--init-from " + model + " --max-steps 1 --out-dir " + path("a"));
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_NE(refused.output.find("give the --tokenizer it was trained with"), std::string::npos)
        << refused.output;
}

TEST_F(Run, ShapeFlagsThatContradictTheWeightsAreRefused) {
    ASSERT_EQ(train("--max-steps 2 --out-dir " + path("a")).exit_code, 0);
    const auto refused = train("--init-from " + path("a/model_000002.bin") +
                               " --n-layer 3 --max-steps 1 --out-dir " + path("b"));
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_NE(refused.output.find("--n-layer 3 contradicts --init-from"), std::string::npos)
        << refused.output;
    // The same shape given again is no contradiction.
    const auto agreed = train("--init-from " + path("a/model_000002.bin") +
                              " --n-layer 2 --max-steps 1 --out-dir " + path("c"));
    EXPECT_EQ(agreed.exit_code, 0) << agreed.output;
}

TEST_F(Run, ExplicitDimensionsOverrideAPreset) {
    const auto result = run_command(
        test::build_path("train_gpt2") +
        " --model char-small --n-layer 1 --seq-len 16 --batch-size 1 --threads 1 --max-steps 1"
        " --val-every 0 --sample-every 0 --data " +
        path("corpus.txt") + " --out-dir " + path("a"));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("preset char-small with --n-layer"), std::string::npos)
        << result.output;
    EXPECT_NE(result.output.find("L=1 H=4 C=256"), std::string::npos) << result.output;
}

TEST_F(Run, ResumeAutoOnAnEmptyDirectoryStartsFromInitFrom) {
    ASSERT_EQ(train("--max-steps 3 --out-dir " + path("a")).exit_code, 0);
    const std::string weights = path("a/model_000003.bin");
    const auto plain = train("--init-from " + weights + " --max-steps 1 --metrics-file " +
                             path("plain.jsonl") + " --out-dir " + path("b"));
    ASSERT_EQ(plain.exit_code, 0) << plain.output;
    const auto resumed =
        train("--resume auto --init-from " + weights + " --max-steps 1 --metrics-file " +
              path("auto.jsonl") + " --out-dir " + path("c"));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("no checkpoint in " + path("c") + "; starting from --init-from"),
              std::string::npos)
        << resumed.output;
    const auto a = test::metrics_records(path("plain.jsonl"), "train");
    const auto b = test::metrics_records(path("auto.jsonl"), "train");
    ASSERT_EQ(a.size(), 1u);
    ASSERT_EQ(b.size(), 1u);
    EXPECT_EQ(a[0]["loss"], b[0]["loss"]) << "--init-from was not used";
}

// ---- 5, 7. runs with nothing to do, or nothing saved ----

TEST_F(Run, ResumingPastMaxStepsSaysSo) {
    ASSERT_EQ(train("--max-steps 4 --out-dir " + path("out")).exit_code, 0);
    const auto result = train("--resume auto --max-steps 3 --out-dir " + path("out"));
    EXPECT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("nothing to do: the checkpoint is at step 4 and --max-steps is 3"),
              std::string::npos)
        << result.output;
}

TEST_F(Run, TheNonFiniteStopDoesNotClaimACheckpointThatDoesNotExist) {
    const auto result =
        train("--max-steps 5 --inject-nan-step 0 --max-bad-steps 1 --out-dir " + path("out"));
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("this run has written no checkpoint yet"), std::string::npos)
        << result.output;
    EXPECT_EQ(result.output.find("is kept"), std::string::npos) << result.output;
}

// ---- 6. clean stops under mpiexec ----

TEST_F(Run, Sigusr1ToMpiexecStopsTheJobCleanlyWithExitZero) {
    const std::string log = path("log.txt");
    const auto result = run_command(
        "bash -c '" +
        command("--max-steps 1000000 --checkpoint-every 0 --out-dir " + path("out"), 2) + " > " +
        log + " 2>&1 & job=$!; " + test::wait_for_log(log, "step 3/") +
        "kill -USR1 $job; wait $job; echo exit=$?'");
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(test::echoed_exit_code(result.output), 0) << result.output << text;
    EXPECT_NE(text.find("stopped by signal at step"), std::string::npos) << text;
    EXPECT_NE(text.find("(SIGUSR1)"), std::string::npos) << text;
    const auto steps = list_checkpoints(path("out"));
    ASSERT_EQ(steps.size(), 1u) << text;
    const auto resumed = train(
        "--resume auto --max-steps " + std::to_string(steps[0] + 1) + " --out-dir " + path("out"),
        2);
    EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
}

TEST_F(Run, SigtermToOneRankStopsEveryRankWithExitZero) {
    const std::string log = path("log.txt");
    const std::string marker = "GPT2_TRUST_MARKER=" + std::to_string(::getpid());
    const std::string job =
        test::mpiexec(2, "-x GPT2_TRUST_MARKER") +
        command("--max-steps 1000000 --checkpoint-every 0 --out-dir " + path("out"));
    const auto result =
        run_command("bash -c '" + marker + " " + job + " > " + log + " 2>&1 & job=$!; " +
                    test::wait_for_log(log, "step 3/") +
                    test::signal_rank(marker, 1, "TERM", "signalled") + "wait $job; echo exit=$?'");
    EXPECT_NE(result.output.find("signalled"), std::string::npos) << result.output;
    EXPECT_EQ(test::echoed_exit_code(result.output), 0) << result.output;
    EXPECT_EQ(list_checkpoints(path("out")).size(), 1u);
}

// ---- 9. 64-bit sizes ----

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

TEST_F(Run, TheChunkedMpiPathGivesTheSameTrainingAsOneCall) {
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

// ---- 10. MPI and thread start-up ----

TEST_F(Run, AOneRankErrorUnderMpiexecIsOneLineAndExitCodeOne) {
    const auto result = run_command(test::mpiexec(1) + test::build_path("train_gpt2") + " --data " +
                                    path("missing.txt"));
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_EQ(count(result.output, "error: "), 1u) << result.output;
    EXPECT_NE(result.output.find(path("missing.txt")), std::string::npos) << result.output;
}

TEST(ThreadPoolStart, ANegativeWorkerCountIsAClearError) {
    try {
        ThreadPool pool(-1);
        ADD_FAILURE() << "accepted -1 workers";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("at least one worker, got -1"), std::string::npos)
            << e.what();
    }
}

// Virtual memory use of this process, from /proc.
std::size_t virtual_bytes() {
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);) {
        if (line.starts_with("VmSize:")) return std::stoull(line.substr(7)) * 1024;
    }
    return 0;
}

// With the address space capped, thread stacks (8 MiB each) run out after a few dozen. Exits 0
// when the pool reports the failure as an exception naming it (std::terminate would abort).
[[noreturn]] void start_more_threads_than_memory_allows() {
    const rlim_t cap = virtual_bytes() + (std::size_t{256} << 20);
    const rlimit limit{cap, cap};
    ::setrlimit(RLIMIT_AS, &limit);
    try {
        ThreadPool pool(400);
        std::_Exit(3);
    } catch (const std::runtime_error& e) {
        const bool named =
            std::string(e.what()).find("cannot start worker thread") != std::string::npos;
        std::_Exit(named ? 0 : 4);
    }
}

TEST(ThreadPoolStart, AThreadThatCannotStartIsAnErrorNotATerminate) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "sanitizers need more address space than this test leaves";
#endif
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(start_more_threads_than_memory_allows(), ::testing::ExitedWithCode(0), "");
}

// ---- the common voice ----

TEST_F(Run, ExitCodesErrorLinesAndVersion) {
    const auto version = run_command(test::build_path("train_gpt2") + " --version");
    EXPECT_EQ(version.exit_code, 0);
    EXPECT_TRUE(
        std::regex_search(version.output, std::regex(R"(^train_gpt2 \(gpt2-mpi\) \d+\.\d+\.\d+)")))
        << version.output;
    const auto bad_flag = train("--lr nope --out-dir " + path("out"));
    EXPECT_EQ(bad_flag.exit_code, 2) << bad_flag.output;
    EXPECT_NE(bad_flag.output.find("error: --lr"), std::string::npos) << bad_flag.output;
    const auto bad_range = train("--warmup-steps -3 --out-dir " + path("out"));
    EXPECT_EQ(bad_range.exit_code, 2) << bad_range.output;
    EXPECT_NE(bad_range.output.find("error: --warmup-steps: must be >= 0 (got -3)"),
              std::string::npos)
        << bad_range.output;
    const auto runtime = train("--data " + path("missing.txt") + " --out-dir " + path("out"));
    EXPECT_EQ(runtime.exit_code, 1) << runtime.output;
    EXPECT_NE(runtime.output.find("error: "), std::string::npos) << runtime.output;
    EXPECT_NE(runtime.output.find(path("missing.txt")), std::string::npos) << runtime.output;
    EXPECT_EQ(runtime.output.find("rank"), std::string::npos) << "one rank: no rank in the error";
}

TEST_F(Run, UnderMpiexecAFlagErrorIsPrintedOnce) {
    const auto result = train("--lr nope --out-dir " + path("out"), 2);
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_EQ(count(result.output, "error: --lr"), 1u) << result.output;
}

TEST(TrainHelp, ShowsDefaultsAndWordsNotInternalMaps) {
    const auto help = run_command(test::build_path("train_gpt2") + " --help");
    EXPECT_EQ(help.exit_code, 0);
    EXPECT_NE(help.output.find("--schedule NAME=cosine"), std::string::npos) << help.output;
    EXPECT_NE(help.output.find("--peak-gflops FLOAT=0"), std::string::npos) << help.output;
    EXPECT_NE(help.output.find("--log-level LEVEL=info"), std::string::npos) << help.output;
    EXPECT_NE(help.output.find("--version"), std::string::npos) << help.output;
    EXPECT_EQ(help.output.find("->"), std::string::npos) << help.output;
    EXPECT_EQ(help.output.find("1.79769e+308"), std::string::npos) << help.output;
}

// ---- smaller things ----

TEST_F(Run, MfuCountsCoresNotThreadsAndWarnsWhenOversubscribed) {
    const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
    const int threads = static_cast<int>(cpus) + 2;
    const auto result =
        train("--threads " + std::to_string(threads) + " --batch-size " + std::to_string(threads) +
              " --peak-gflops 100 --max-steps 1 "
              "--out-dir " +
              path("out"));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("MFU peak " + std::to_string(100 * cpus) + " GFLOP/s (" +
                                 std::to_string(cpus) + (cpus == 1 ? " core" : " cores") +
                                 " x 100 GFLOP/s, --peak-gflops)"),
              std::string::npos)
        << result.output;
    // Without the flag, one core's peak is measured with the GEMM kernels' instructions.
    const auto measured =
        train("--threads 1 --batch-size 1 --max-steps 1 --out-dir " + path("measured"));
    ASSERT_EQ(measured.exit_code, 0) << measured.output;
    EXPECT_NE(measured.output.find("FMA measured on one core)"), std::string::npos)
        << measured.output;
    EXPECT_NE(result.output.find("oversubscribed"), std::string::npos) << result.output;
}

// A batch that does not divide over the workers leaves some waiting at every layer: said at
// start-up, with the fix; an even split says nothing.
TEST_F(Run, AnUnevenSplitOfTheBatchOverWorkersIsWarnedAbout) {
    const auto result = train("--threads 2 --batch-size 3 --max-steps 2 --out-dir " + path("out"));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("batch 3 per rank does not divide over 2 workers: 1 of them take "
                                 "1 sequences, the others 2"),
              std::string::npos)
        << result.output;
    EXPECT_NE(result.output.find("on 1 of 2 workers"), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("step 2/2 | loss"), std::string::npos) << result.output;
    const auto even = train("--threads 2 --batch-size 4 --max-steps 1 --out-dir " + path("even"));
    ASSERT_EQ(even.exit_code, 0) << even.output;
    EXPECT_EQ(even.output.find("does not divide"), std::string::npos) << even.output;
}

TEST_F(Run, AWarmupLongerThanTheRunIsWarnedAbout) {
    const auto result = train("--warmup-steps 50 --max-steps 3 --out-dir " + path("out"));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("--warmup-steps 50 is not shorter than the run"),
              std::string::npos)
        << result.output;
}

TEST_F(Run, ResumingWithALargerMaxStepsKeepsTheLearningRateSchedule) {
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

// ---- loss-spike skipping (llm.c's -sl / -sg) ----

TEST(SpikeWindow, ScoresLikeLlmcOnceFull) {
    SpikeWindow window;
    for (int i = 0; i < 128; ++i)
        EXPECT_FALSE(window.push(i).has_value());  // the first 128 values only fill the window
    // The 129th replaces the oldest (0) and is scored with itself in the window, as llm.c does.
    double sum = 200.0, squares = 200.0 * 200.0;
    for (int i = 1; i < 128; ++i) {
        sum += i;
        squares += static_cast<double>(i) * i;
    }
    const double mean = sum / 128.0;
    const double sd = std::sqrt(squares / 128.0 - mean * mean);
    const std::optional<double> z = window.push(200.0);
    ASSERT_TRUE(z.has_value());
    EXPECT_NEAR(*z, (200.0 - mean) / sd, 1e-9);
    EXPECT_EQ(window.count, 128u);
    EXPECT_EQ(window.next, 1u);
    SpikeWindow flat;
    for (int i = 0; i < 129; ++i)
        (void)flat.push(2.0);
    EXPECT_EQ(*flat.push(2.0), 0.0);                       // no spread: nothing is an outlier
    EXPECT_LT(*flat.push(1e12), std::sqrt(127.0) + 1e-9);  // z is bounded by sqrt(N - 1)
}

TEST(SpikeGuard, SkipsAboveEitherThreshold) {
    SpikeGuard guard;
    guard.max_loss_z = 3.0;
    guard.max_norm_z = 4.0;
    for (int i = 0; i < 130; ++i)
        EXPECT_FALSE(guard.judge(3.0 + 0.01 * (i % 5), 1.0 + 0.1 * (i % 3)).skip);
    const SpikeGuard::Verdict spike = guard.judge(9.0, 1.1);  // a loss spike
    EXPECT_TRUE(spike.skip);
    EXPECT_GT(*spike.loss_z, 3.0);
    EXPECT_LT(*spike.norm_z, 4.0);
    EXPECT_TRUE(guard.judge(3.02, 50.0).skip);  // a norm spike
    EXPECT_FALSE(guard.judge(3.02, 1.1).skip);
    SpikeGuard off;  // thresholds 0: z-scores, never a skip
    for (int i = 0; i < 129; ++i)
        (void)off.judge(3.0 + 0.01 * (i % 5), 1.0);
    const SpikeGuard::Verdict huge = off.judge(1e9, 1e9);
    EXPECT_FALSE(huge.skip);
    EXPECT_GT(*huge.loss_z, 11.0);
}

// A gradient-norm spike injected at step 151 is skipped (logged, recorded) and the losses go on
// exactly as when that update is skipped for a non-finite gradient; without --skip-norm-z the
// same spike is applied and the training differs.
TEST_F(Run, AnInjectedSpikeIsSkippedAndTrainingContinues) {
    const std::string common = "--max-steps 160 --checkpoint-every 0 --out-dir ";
    const auto skipped = train("--skip-norm-z 6 --inject-spike-step 150 --metrics-file " +
                               path("spike.jsonl") + " " + common + path("spike"));
    ASSERT_EQ(skipped.exit_code, 0) << skipped.output;
    EXPECT_NE(skipped.output.find("step 151: gradient norm z-score +"), std::string::npos)
        << skipped.output;
    EXPECT_NE(skipped.output.find("above --skip-norm-z 6: update skipped (1 in a row)"),
              std::string::npos)
        << skipped.output;
    ASSERT_EQ(train("--skip-norm-z 6 --inject-nan-step 150 --metrics-file " + path("nan.jsonl") +
                    " " + common + path("nan"))
                  .exit_code,
              0);
    ASSERT_EQ(train("--inject-spike-step 150 --metrics-file " + path("applied.jsonl") + " " +
                    common + path("applied"))
                  .exit_code,
              0);
    const auto spike = test::metrics_records(path("spike.jsonl"), "train");
    const auto nan = test::metrics_records(path("nan.jsonl"), "train");
    const auto applied = test::metrics_records(path("applied.jsonl"), "train");
    ASSERT_EQ(spike.size(), 160u);
    EXPECT_EQ(spike[150]["skipped"], true);
    EXPECT_EQ(spike[150]["spike"], true);
    EXPECT_GT(spike[150]["norm_z"].get<double>(), 6.0);
    EXPECT_TRUE(spike[149]["norm_z"].is_number());
    EXPECT_TRUE(spike[100]["norm_z"].is_null());  // fewer than 128 steps before it
    for (std::size_t s = 151; s < 160; ++s)
        EXPECT_EQ(spike[s]["loss"], nan[s]["loss"]) << "step " << s + 1;
    EXPECT_NE(spike[159]["loss"], applied[159]["loss"]);
}

// The windows are part of the resume state: stopped at step 100 (before the window is full) and
// resumed, the run scores and skips exactly as an uninterrupted one.
TEST_F(Run, ResumeAcrossTheSpikeWindowIsBitwiseExact) {
    const std::string common = "--skip-loss-z 2 --skip-norm-z 2 --max-steps 200 --out-dir ";
    ASSERT_EQ(
        train(common + path("straight") + " --metrics-file " + path("straight.jsonl")).exit_code,
        0);
    ASSERT_EQ(train(common + path("out") + " --stop-at-step 100").exit_code, 0);
    const auto resumed =
        train(common + path("out") + " --resume auto --metrics-file " + path("resumed.jsonl"));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    const auto straight = test::metrics_records(path("straight.jsonl"), "train");
    const auto after = test::metrics_records(path("resumed.jsonl"), "train");
    ASSERT_EQ(straight.size(), 200u);
    ASSERT_EQ(after.size(), 100u);
    int scored = 0;
    for (std::size_t s = 0; s < 100; ++s) {
        EXPECT_EQ(after[s]["loss"], straight[100 + s]["loss"]) << "step " << 101 + s;
        EXPECT_EQ(after[s]["loss_z"], straight[100 + s]["loss_z"]) << "step " << 101 + s;
        EXPECT_EQ(after[s]["norm_z"], straight[100 + s]["norm_z"]) << "step " << 101 + s;
        EXPECT_EQ(after[s]["skipped"], straight[100 + s]["skipped"]) << "step " << 101 + s;
        if (straight[100 + s]["loss_z"].is_number()) ++scored;
    }
    EXPECT_GT(scored, 50);
}

TEST_F(Run, TheMetricsFileMarksEachRun) {
    ASSERT_EQ(train("--max-steps 10 --stop-at-step 2 --metrics-file " + path("m.jsonl") +
                    " --out-dir " + path("out"))
                  .exit_code,
              0);
    ASSERT_EQ(train("--resume auto --max-steps 4 --metrics-file " + path("m.jsonl") +
                    " --out-dir " + path("out"))
                  .exit_code,
              0);
    const auto runs = test::metrics_records(path("m.jsonl"), "run");
    ASSERT_EQ(runs.size(), 2u);
    EXPECT_EQ(runs[0]["start_step"], 0);
    EXPECT_EQ(runs[0]["resumed"], false);
    EXPECT_EQ(runs[1]["start_step"], 2);
    EXPECT_EQ(runs[1]["resumed"], true);
}

TEST_F(Run, DebugLogsPerPhaseTimingsAndOnlyRankZeroPrintsStepsOtherwise) {
    const auto quiet = train("--max-steps 2 --out-dir " + path("a"), 2);
    ASSERT_EQ(quiet.exit_code, 0) << quiet.output;
    EXPECT_EQ(count(quiet.output, "step 2/2 | loss"), 1u) << quiet.output;
    const auto debug = train("--max-steps 2 --log-level debug --out-dir " + path("b"), 2);
    ASSERT_EQ(debug.exit_code, 0) << debug.output;
    for (const char* rank : {"rank 0 step 2: forward/backward", "rank 1 step 2: forward/backward"})
        EXPECT_NE(debug.output.find(rank), std::string::npos) << debug.output;
    EXPECT_NE(debug.output.find("| thread reduction "), std::string::npos);
    EXPECT_NE(debug.output.find("| allreduce "), std::string::npos);
    EXPECT_NE(debug.output.find("| optimizer "), std::string::npos);
    // Each worker's wait at the reduction's barriers, so imbalance between workers shows.
    const auto threads =
        train("--max-steps 1 --threads 2 --log-level debug --out-dir " + path("c"), 0);
    ASSERT_EQ(threads.exit_code, 0) << threads.output;
    EXPECT_TRUE(
        std::regex_search(threads.output, std::regex(R"(\| barrier wait per worker \d+/\d+ ms)")))
        << threads.output;
}

TEST_F(Run, SamplesInTheLogAreValidUtf8) {
    // Byte-level tokens of a text full of two- and three-byte characters: an untrained model's
    // samples mix lead and continuation bytes freely.
    std::ofstream corpus(path("unicode.txt"));
    for (int i = 0; i < 2000; ++i)
        corpus << "héllo wörld ünïcødé ñ € ✓ 日本語 ";
    corpus.close();
    const auto result =
        train("--data " + path("unicode.txt") +
              " --max-steps 1 --sample-every 1 --max-new-tokens 200 --out-dir " + path("out"));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const auto at = result.output.find("sample at step 1:");
    ASSERT_NE(at, std::string::npos) << result.output;
    EXPECT_TRUE(is_valid_utf8(result.output.substr(at))) << result.output.substr(at);
}

TEST_F(Run, EotInTextDecidesWhatALiteralEndOfTextBecomes) {
    std::ofstream corpus(path("docs.txt"));
    for (int i = 0; i < 400; ++i)
        corpus << "document number " << i << " is here<|endoftext|>";
    corpus.close();
    std::map<std::string, std::string> counts;
    for (const std::string mode : {"token", "text"}) {
        const auto result = train("--data " + path("docs.txt") +
                                  " --tokenizer bpe --vocab-size 300 --max-steps 1 --eot-in-text " +
                                  mode + " --out-dir " + path(mode));
        ASSERT_EQ(result.exit_code, 0) << result.output;
        const std::regex line(R"(-> ([\d,]+) train \+ ([\d,]+) val tokens)");
        std::smatch match;
        ASSERT_TRUE(std::regex_search(result.output, match, line)) << result.output;
        counts[mode] = match[1].str();
    }
    // One token per separator against several: the text mode holds more tokens.
    EXPECT_NE(counts["token"], counts["text"]);
    // The same choice for inference's prompts.
    std::map<std::string, std::string> prompt_tokens;
    for (const std::string mode : {"token", "text"}) {
        const auto result =
            run_command(test::build_path("inference") + " " + path("token/model_000001.bin") +
                        " --prompt 'is here<|endoftext|>document' "
                        "--max-new-tokens 1 --eot-in-text " +
                        mode);
        ASSERT_EQ(result.exit_code, 0) << result.output;
        const std::regex stats(R"(prompt_tokens=(\d+))");
        std::smatch match;
        ASSERT_TRUE(std::regex_search(result.output, match, stats)) << result.output;
        prompt_tokens[mode] = match[1].str();
    }
    EXPECT_LT(std::stoi(prompt_tokens["token"]), std::stoi(prompt_tokens["text"]));
    EXPECT_LT(std::stoll(std::regex_replace(counts["token"], std::regex(","), "")),
              std::stoll(std::regex_replace(counts["text"], std::regex(","), "")));
}

TEST_F(Run, TheSampleLineNamesItsStep) {
    const auto result =
        train("--max-steps 2 --sample-every 2 --max-new-tokens 8 --out-dir " + path("out"));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("sample at step 2:"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace gpt2
