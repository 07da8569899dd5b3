// The programs' command lines as a user meets them: config files are strict (anything unknown or
// repeated refused with file, line and key), a mistyped flag gets a suggestion and a repeated one
// is refused, every mistake the flags show is reported with exit code 2 before the corpus is read,
// errors are one line with the documented exit code, also under mpiexec, and --version and --help
// say what they should.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "process_support.hpp"
#include "train_run_fixture.hpp"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;
using test::run_command;
using test::ScratchDir;
using test::TrainRun;

const fs::path kGpt2Dir = fs::path(GPT2_SHARED_DATA_DIR) / "gpt2";

// train_gpt2 with only the flags a test gives (TrainRun's command adds a model shape and
// --seq-len, which some tests must choose themselves), on the fixture's corpus.
class TrainFlags : public TrainRun {
  protected:
    [[nodiscard]] test::ProcessResult bare(const std::string& flags) const {
        // Shards replace the text corpus (both at once are refused).
        const std::string data = flags.find("--train-data") == std::string::npos
                                     ? " --data " + path("corpus.txt")
                                     : std::string();
        return run_command(
            test::build_path("train_gpt2") +
            test::without_given(data + " --batch-size 2 --threads 1 --val-every 0 --sample-every 0",
                                flags) +
            " " + flags);
    }
};

// How many lines of `output` start with "error".
std::size_t error_lines(const std::string& output) {
    std::size_t n = output.starts_with("error") ? 1 : 0;
    return n + test::count_of(output, "\nerror");
}

// ---- config files ----

struct ConfigCase {
    const char* name;
    const char* text;
    const char* expected;  // in the error
};

class ConfigFile : public TrainRun, public ::testing::WithParamInterface<ConfigCase> {};

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

TEST_F(TrainRun, ConfigFilesAcceptUnderscoresAndSayTheyWereApplied) {
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

// ---- one voice: exit codes, error lines, version, help ----

TEST_F(TrainRun, AOneRankErrorUnderMpiexecIsOneLineAndExitCodeOne) {
    const auto result = run_command(test::mpiexec(1) + test::build_path("train_gpt2") + " --data " +
                                    path("missing.txt"));
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_EQ(test::count_of(result.output, "error: "), 1u) << result.output;
    EXPECT_NE(result.output.find(path("missing.txt")), std::string::npos) << result.output;
}

TEST_F(TrainRun, ExitCodesErrorLinesAndVersion) {
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

TEST_F(TrainRun, UnderMpiexecAFlagErrorIsPrintedOnce) {
    const auto result = train("--lr nope --out-dir " + path("out"), 2);
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_EQ(test::count_of(result.output, "error: --lr"), 1u) << result.output;
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

TEST_F(TrainRun, ConfigKeyGivenTwiceIsRefusedWithBothLines) {
    std::ofstream(path("run.toml")) << "max-steps = 2\nlr = 0.01\n# again\nmax_steps = 3\n";
    const auto result = train("--config " + path("run.toml") + " --out-dir " + path("out"));
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find("--config " + path("run.toml") +
                                 ":4: 'max-steps' is already set on line 1"),
              std::string::npos)
        << result.output;
    EXPECT_EQ(error_lines(result.output), 1u) << result.output;
    EXPECT_FALSE(fs::exists(path("out"))) << "the run went ahead";
    // Two spellings of one flag are one flag.
    std::ofstream(path("alias.toml")) << "max-new-tokens = 5\nsample_tokens = 6\n";
    const auto alias = train("--config " + path("alias.toml") + " --out-dir " + path("out"));
    EXPECT_EQ(alias.exit_code, 2) << alias.output;
    EXPECT_NE(alias.output.find(":2: 'sample-tokens' is already set on line 1 (as "
                                "'max-new-tokens', the same flag)"),
              std::string::npos)
        << alias.output;
}

TEST_F(TrainRun, AConfigPathThatIsNoFileIsNamedWithWhatIsWrong) {
    fs::create_directories(path("configs"));
    const auto directory = train("--config " + path("configs") + " --out-dir " + path("out"));
    EXPECT_EQ(directory.exit_code, 2) << directory.output;
    EXPECT_NE(directory.output.find("error: --config " + path("configs") + " is a directory"),
              std::string::npos)
        << directory.output;
    const auto missing = train("--config " + path("none.toml") + " --out-dir " + path("out"));
    EXPECT_EQ(missing.exit_code, 2) << missing.output;
    EXPECT_NE(missing.output.find("error: --config " + path("none.toml") +
                                  ": cannot open (No such file or directory)"),
              std::string::npos)
        << missing.output;
}

TEST_F(TrainRun, AFlagInTheConfigFileAndOnTheCommandLineIsNoRepetition) {
    std::ofstream(path("run.toml")) << "max-steps = 3\n";
    const auto result =
        train("--config " + path("run.toml") + " --max-steps 2 --out-dir " + path("out"));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("step 2/2 |"), std::string::npos) << result.output;
}

// ---- mistyped and repeated flags, in all four programs ----

struct FlagCase {
    const char* name;
    const char* program;
    const char* args;
    const char* expected;  // the whole error line
};

class FlagMistake : public ::testing::TestWithParam<FlagCase> {};

TEST_P(FlagMistake, IsOneLineNamingTheFlagWithExitCodeTwo) {
    const FlagCase& c = GetParam();
    const ScratchDir dir(std::string("gpt2-flag-") + c.name);
    // Anything the programs would write goes to the scratch directory.
    const auto result = run_command("cd " + dir.path().string() + " && " +
                                    test::build_path(c.program) + " " + c.args);
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_EQ(result.output.substr(0, result.output.find('\n')), c.expected) << result.output;
    EXPECT_EQ(error_lines(result.output), 1u) << result.output;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, FlagMistake,
    ::testing::Values(
        FlagCase{"train_typo", "train_gpt2", "--max-step 10",
                 "error: unknown flag --max-step (did you mean --max-steps?)"},
        FlagCase{"train_underscore", "train_gpt2", "--max_steps=10",
                 "error: unknown flag --max_steps (did you mean --max-steps?)"},
        FlagCase{"train_unknown", "train_gpt2", "--colour blue", "error: unknown flag --colour"},
        FlagCase{"inference_typo", "inference", "model.bin --temprature 0.5",
                 "error: unknown flag --temprature (did you mean --temperature?)"},
        FlagCase{"prepare_typo", "prepare_data", "--dat a.txt --tokenizer char --out-dir o",
                 "error: unknown flag --dat (did you mean --data?)"},
        FlagCase{"prepare_before_required", "prepare_data", "--data a.txt --tokenizr char",
                 "error: unknown flag --tokenizr (did you mean --tokenizer?)"},
        FlagCase{"convert_typo", "convert_model", "a.bin b.gguf --dtyp f16",
                 "error: unknown flag --dtyp (did you mean --dtype?)"},
        FlagCase{"train_twice", "train_gpt2", "--max-steps 10 --max-steps 20",
                 "error: --max-steps given twice (10, then 20): give it once"},
        FlagCase{"train_alias_twice", "train_gpt2", "-b 4 --batch-size 8",
                 "error: -b and --batch-size given twice (4, then 8): give it once"},
        FlagCase{"train_switch_twice", "train_gpt2", "--no-shuffle --no-shuffle",
                 "error: --no-shuffle given twice: give it once"},
        FlagCase{"inference_twice", "inference", "model.bin --seed 1 --seed=2",
                 "error: --seed given twice (1, then 2): give it once"},
        FlagCase{"prepare_twice", "prepare_data",
                 "--data a.txt --tokenizer char --tokenizer bpe --out-dir o",
                 "error: --tokenizer given twice (char, then bpe): give it once"},
        FlagCase{"convert_twice", "convert_model", "a.bin b.gguf --dtype f16 --dtype q8_0",
                 "error: --dtype given twice (f16, then q8_0): give it once"},
        FlagCase{"prepare_tokenizer_value", "prepare_data",
                 "--data a.txt --tokenizer gtp2 --out-dir o",
                 "error: --tokenizer: unknown tokenizer 'gtp2' (did you mean gpt2?); known: bpe, "
                 "char, gpt2"},
        FlagCase{"train_tokenizer_value", "train_gpt2", "--tokenizer chr",
                 "error: --tokenizer: unknown tokenizer 'chr' (did you mean char?); known: bpe, "
                 "char, gpt2"},
        FlagCase{"train_schedule_value", "train_gpt2", "--schedule cosin",
                 "error: --schedule: unknown schedule 'cosin' (did you mean cosine?); known: "
                 "cosine, linear, constant"},
        FlagCase{"train_zero_value", "train_gpt2", "--zero 2",
                 "error: --zero: unknown ZeRO stage '2'; known: 0, 1"},
        FlagCase{"train_negative_seed", "train_gpt2", "--seed -1",
                 "error: --seed: must be a whole number from 0 to 18446744073709551615 (got -1)"},
        FlagCase{"inference_weights_value", "inference", "model.bin --weights int4",
                 "error: --weights: unknown weight format 'int4' (did you mean int8?); known: "
                 "fp32, bf16, int8"},
        FlagCase{"convert_dtype_value", "convert_model", "a.bin b.gguf --dtype q8",
                 "error: --dtype: unknown GGUF type 'q8' (did you mean q8_0?); known: f32, f16, "
                 "bf16, q8_0"},
        FlagCase{"log_level_value", "train_gpt2", "--log-level warning",
                 "error: --log-level: unknown log level 'warning' (did you mean warn?); known: "
                 "trace, debug, info, warn, error"},
        FlagCase{"arch_bad_value", "train_gpt2", "--arch qk-norm=yes",
                 "error: --arch: 'qk-norm=yes' takes on or off (keys: norm=layernorm|rmsnorm, "
                 "norm-gains=on|off, norm-eps=E, positions=learned|rotary, rope-theta=T, "
                 "mlp=gelu|swiglu|relu2, mlp-hidden=N (0: 4C), biases=on|off, head=tied|untied, "
                 "kv-heads=N (0: all), qk-norm=on|off, embedding-norm=on|off, zero-init=on|off)"},
        FlagCase{
            "train_unknown_preset", "train_gpt2", "--model gpt2-125M",
            "error: --model: unknown preset 'gpt2-125M' (did you mean gpt2-124M?); known: "
            "gpt2-124M, gpt2-350M, gpt2-774M, gpt2-1558M, d6, char-small, llama-135M, llama-tiny, "
            "speedrun"}),
    [](const ::testing::TestParamInfo<FlagCase>& info) { return std::string(info.param.name); });

// --help shows no default for a required flag ("--tokenizer NAME= REQUIRED" before).
TEST(PrepareDataFlags, HelpShowsNoDefaultForARequiredFlag) {
    const auto help = run_command(test::build_path("prepare_data") + " --help");
    EXPECT_NE(help.output.find("--tokenizer NAME REQUIRED"), std::string::npos) << help.output;
    EXPECT_EQ(help.output.find("NAME= "), std::string::npos) << help.output;
}

// A binary --config (a model, the program itself) is named as such; its bytes are never printed.
TEST(ConfigFlags, ABinaryConfigFileIsNamedNotPrinted) {
    const ScratchDir dir("gpt2-flag-binary-config");
    test::write_bytes(dir.path() / "model.bin", std::string("GPT2\0\x01\x7f\xff binary", 16));
    const auto result =
        run_command(test::build_path("train_gpt2") + " --config " + (dir / "model.bin"));
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_EQ(result.output, "error: --config " + (dir / "model.bin") +
                                 " is not a text file (a NUL byte at byte 4): give a file of "
                                 "'flag = value' lines\n");
}

// Flags this run cannot use are said to be ignored, one warning each, and the run goes on.
TEST_F(TrainFlags, FlagsThatDoNothingHereAreSaidToBeIgnored) {
    const auto result = bare(
        "--max-steps 1 --eval-every 5 --sample-every 0 --max-new-tokens 50 "
        "--bucket-mb 4 --share-memory off --vocab-size 300 --out-dir " +
        path("out"));
    EXPECT_EQ(result.exit_code, 0) << result.output;
    for (const char* expected :
         {"warning: --eval-every only applies with --hellaswag (HellaSwag's evaluations); ignored",
          "warning: --max-new-tokens only applies to the samples, and --sample-every 0 prints "
          "none; ignored",
          "warning: --bucket-mb only applies with several ranks; ignored",
          "warning: --share-memory only applies with several ranks; ignored",
          "warning: --vocab-size only applies to --tokenizer bpe, trained on --data; ignored"}) {
        EXPECT_NE(result.output.find(expected), std::string::npos) << expected << "\n"
                                                                   << result.output;
    }
    const auto quiet = bare("--max-steps 1 --out-dir " + path("quiet"));
    EXPECT_EQ(quiet.output.find("ignored"), std::string::npos) << quiet.output;
}

TEST(PrepareDataFlags, SeveralDataFlagsAreAListNotARepetition) {
    const ScratchDir dir("gpt2-flag-data-list");
    test::write_corpus(dir.path() / "a.txt", 3000);
    test::write_corpus(dir.path() / "b.txt", 3000);
    const auto result =
        run_command(test::build_path("prepare_data") + " --data " + (dir / "a.txt") + " --data " +
                    (dir / "b.txt") + " --tokenizer char --threads 1 --out-dir " + (dir / "out"));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("2 files"), std::string::npos) << result.output;
}

// ---- what the flags show is wrong is reported first, with exit code 2 ----

struct EarlyCase {
    const char* name;
    const char* flags;
    const char* expected;  // in the one error line
};

class EarlyMistake : public TrainFlags, public ::testing::WithParamInterface<EarlyCase> {};

TEST_P(EarlyMistake, IsRefusedWithExitCodeTwoBeforeTheCorpusIsRead) {
    const EarlyCase& c = GetParam();
    const auto result = bare(std::string(c.flags) + " --max-steps 1 --tokenizer-dir " +
                             kGpt2Dir.string() + " --out-dir " + path("out"));
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find(c.expected), std::string::npos) << result.output;
    EXPECT_EQ(error_lines(result.output), 1u) << result.output;
    EXPECT_EQ(result.output.find("corpus "), std::string::npos) << "the corpus was read first";
    EXPECT_FALSE(fs::exists(path("out"))) << "the run went ahead";
}

INSTANTIATE_TEST_SUITE_P(
    Cases, EarlyMistake,
    ::testing::Values(
        EarlyCase{"preset_tokenizer_char", "--model gpt2-124M --tokenizer char --seq-len 16",
                  "error: --tokenizer char contradicts --model gpt2-124M"},
        EarlyCase{"preset_tokenizer_bpe", "--model gpt2-350M --tokenizer bpe --seq-len 16",
                  "error: --tokenizer bpe contradicts --model gpt2-350M"},
        EarlyCase{"preset_block_size", "--model gpt2-124M --seq-len 2048",
                  "error: --seq-len 2048 exceeds the block size 1024 of --model gpt2-124M"},
        EarlyCase{"small_preset_block_size", "--model d6 --seq-len 512",
                  "error: --seq-len 512 exceeds the block size 256 of --model d6"},
        EarlyCase{"preset_heads", "--model gpt2-124M --n-head 5 --seq-len 16",
                  "error: --n-embd 768 is not divisible by --n-head 5 (--model gpt2-124M)"},
        EarlyCase{"huge_shape", "--n-layer 5000 --n-head 1 --n-embd 65536 --seq-len 16",
                  "a model dimension is implausibly large"},
        EarlyCase{"resume_name", "--resume weights.bin --seq-len 16",
                  "error: --resume weights.bin: expected 'auto' or a state_NNNNNN.bin file"},
        EarlyCase{"data_and_shards", "--data x.txt --train-data 'a_*.bin' --val-data 'b_*.bin'",
                  "error: --data and --train-data both name the training text: give one"},
        EarlyCase{"min_lr_above_lr", "--lr 1e-4 --min-lr 3e-4 --seq-len 16",
                  "error: --min-lr 0.0003 is above --lr 0.0001: the schedule decays from --lr "
                  "down to --min-lr (default --lr / 10)"},
        EarlyCase{"resume_model_file", "--resume run/model_000100.bin --seq-len 16",
                  "error: --resume run/model_000100.bin is a model file: name its state file, "
                  "run/state_000100.bin"},
        EarlyCase{"val_fraction_with_shards",
                  "--train-data 'a_*.bin' --val-data 'b_*.bin' --val-fraction 0.2",
                  "error: --val-fraction splits --data; with --train-data"}),
    [](const ::testing::TestParamInfo<EarlyCase>& info) { return std::string(info.param.name); });

// A fine-tuning learning rate below the old absolute default of --min-lr (3e-4) trains, its
// schedule decaying to a tenth of it; an explicit --min-lr stays absolute (also from a config).
TEST_F(TrainFlags, MinLrFollowsLrUnlessGiven) {
    const auto lrs = [&](const std::string& flags, const std::string& name) {
        const auto result =
            bare(flags + " --max-steps 4 --warmup-steps 0 --schedule linear" + " --metrics-file " +
                 path(name + ".jsonl") + " --out-dir " + path(name) + test::small_model(16));
        EXPECT_EQ(result.exit_code, 0) << flags << "\n" << result.output;
        return test::metrics_values(path(name + ".jsonl"), "train", "lr");
    };
    const std::vector<double> relative = lrs("--lr 6e-5", "relative");
    ASSERT_EQ(relative.size(), 4u);
    EXPECT_FLOAT_EQ(relative.front(), 6e-5f);
    EXPECT_FLOAT_EQ(relative.back(), 6e-6f);  // the linear decay ends at --lr / 10
    const std::vector<double> absolute = lrs("--lr 6e-5 --min-lr 0", "absolute");
    ASSERT_EQ(absolute.size(), 4u);
    EXPECT_FLOAT_EQ(absolute.back(), 0.0f);
    std::ofstream(path("config.txt")) << "min-lr = 1e-5\n";
    const std::vector<double> from_config =
        lrs("--lr 6e-5 --config " + path("config.txt"), "config");
    ASSERT_EQ(from_config.size(), 4u);
    EXPECT_FLOAT_EQ(from_config.back(), 1e-5f);
}

// Run outside a checkout (an installed program, another directory), the default corpus is not
// there: the error says it is --data's default and what to do.
TEST_F(TrainFlags, TheMissingDefaultCorpusIsNamedAsDataSDefault) {
    const auto result =
        run_command("cd " + path("") + " && " + test::build_path("train_gpt2") + " --max-steps 1");
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_NE(result.output.find("error: --data data/tinyshakespeare.txt (the default): no such "
                                 "file in "),
              std::string::npos)
        << result.output;
    EXPECT_NE(result.output.find("give --data FILE"), std::string::npos) << result.output;
}

// A corpus byte outside a char model's alphabet: the error names the corpus.
TEST_F(TrainFlags, AByteOutsideTheCharAlphabetNamesTheCorpus) {
    ASSERT_EQ(train("--max-steps 1 --out-dir " + path("a")).exit_code, 0);
    std::ofstream(path("other.txt")) << "the king shall speak of love ~ and war\n";
    const auto result =
        bare("--init-from " + path("a/model_000001.bin") + " --data " + path("other.txt") +
             " --seq-len 16 --max-steps 1 --out-dir " + path("b"));
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_NE(result.output.find("error: --data " + path("other.txt") + ": char tokenizer: byte"),
              std::string::npos)
        << result.output;
}

TEST_F(TrainFlags, FlagsThatContradictTheWeightsAreRefusedBeforeTheCorpusIsRead) {
    ASSERT_EQ(train("--max-steps 1 --out-dir " + path("a")).exit_code, 0);  // block size 16
    const std::string weights = path("a/model_000001.bin");
    const std::string state = path("a/state_000001.bin");
    const auto check = [&](const std::string& flags, const std::string& expected) {
        const auto result = bare(flags + " --max-steps 2");
        EXPECT_EQ(result.exit_code, 2) << flags << "\n" << result.output;
        EXPECT_NE(result.output.find(expected), std::string::npos) << flags << "\n"
                                                                   << result.output;
        EXPECT_EQ(error_lines(result.output), 1u) << result.output;
        EXPECT_EQ(result.output.find("corpus "), std::string::npos)
            << flags << ": the corpus was read first\n"
            << result.output;
    };
    check("--init-from " + weights + " --seq-len 32 --out-dir " + path("b"),
          "error: --seq-len 32 exceeds the block size 16 of --init-from " + weights);
    check("--init-from " + weights + " --n-layer 3 --seq-len 16 --out-dir " + path("b"),
          "error: --n-layer 3 contradicts --init-from " + weights);
    check("--resume " + state + " --seq-len 32 --out-dir " + path("a"),
          "error: --seq-len 32 exceeds the block size 16 of --resume " + state);
    check("--resume " + state + " --seq-len 8 --out-dir " + path("a"),
          "error: --seq-len 8 differs from the sequence length 16 of --resume " + state);
    check("--resume auto --seq-len 8 --out-dir " + path("a"),
          "error: --seq-len 8 differs from the sequence length 16 of --resume " + state);
    EXPECT_TRUE(fs::exists(weights) && fs::exists(state)) << "the checkpoint was touched";
}

// ---- GPT-2's presets come with GPT-2's tokenizer ----

TEST_F(TrainFlags, AGpt2PresetTrainsWithGpt2sTokenizerAndSaysSo) {
    if (!fs::exists(kGpt2Dir / "encoder.json")) GTEST_SKIP() << "no GPT-2 tokenizer files";
    // The preset's shape, shrunk by explicit dimensions: only the vocabulary is at stake.
    const auto result = bare(
        "--model gpt2-124M --n-layer 1 --n-head 2 --n-embd 32 --seq-len 16 --max-steps 1 "
        "--checkpoint-every 0 --tokenizer-dir " +
        kGpt2Dir.string() + " --out-dir " + path("out"));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("tokenizer: gpt2 from " + kGpt2Dir.string() +
                                 ", as --model gpt2-124M implies"),
              std::string::npos)
        << result.output;
    EXPECT_NE(result.output.find("(gpt2 tokenizer, vocab 50257)"), std::string::npos)
        << result.output;
    EXPECT_NE(result.output.find("model L=1 H=2 C=32 V=50257 "), std::string::npos)
        << result.output;
}

TEST_F(TrainFlags, AGpt2PresetRefusesShardsOfAnotherTokenizer) {
    ASSERT_EQ(run_command(test::build_path("prepare_data") + " --data " + path("corpus.txt") +
                          " --tokenizer char --threads 1 --out-dir " + path("shards"))
                  .exit_code,
              0);
    const auto result = bare(
        "--model gpt2-124M --n-layer 1 --n-head 2 --n-embd 32 --seq-len 16 "
        "--max-steps 1 --train-data '" +
        path("shards") + "/*_train_*.bin' --val-data '" + path("shards") +
        "/*_val_*.bin' --out-dir " + path("out"));
    EXPECT_EQ(result.exit_code, 2) << result.output;
    EXPECT_NE(result.output.find("error: --model gpt2-124M is a GPT-2 shape for GPT-2's tokenizer, "
                                 "but the shards' " +
                                 path("shards") + "/tokenizer.bin is char"),
              std::string::npos)
        << result.output;
    EXPECT_FALSE(fs::exists(path("out"))) << "the run went ahead";
}

TEST_F(TrainFlags, SmallPresetsKeepTheDefaultTokenizer) {
    const auto result =
        bare("--model char-small --n-layer 1 --seq-len 16 --max-steps 1 --out-dir " + path("out"));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("(char tokenizer, vocab "), std::string::npos) << result.output;
    EXPECT_EQ(result.output.find("implies"), std::string::npos) << result.output;
}

TEST(TrainHelp, ShowsTheDefaultsThatApply) {
    const auto help = run_command(test::build_path("train_gpt2") + " --help");
    EXPECT_EQ(help.exit_code, 0);
    // The tokenizer's default depends on --model: no fixed "=char".
    EXPECT_EQ(help.output.find("--tokenizer NAME="), std::string::npos) << help.output;
    EXPECT_NE(help.output.find("default: gpt2 with a gpt2-* --model, else char"), std::string::npos)
        << help.output;
    EXPECT_NE(help.output.find("0: the preset's with --model, else --seq-len"), std::string::npos)
        << help.output;
}

}  // namespace
}  // namespace gpt2
