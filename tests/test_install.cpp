// Installed like other HPC tools: `cmake --install` puts the programs, the scripts users run and
// the README under a prefix, and the installed programs and scripts work from any directory; the
// example Slurm job file is valid bash and the command it submits runs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "process_support.hpp"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;
using test::run_command;
using test::ScratchDir;

const std::string kSource = GPT2_SOURCE_DIR;
const std::string kTiny = test::small_model(16) +
                          " --batch-size 2 --threads 1 --val-every 0"
                          " --sample-every 0 --val-tokens 32";

TEST(Install, TheInstalledProgramsAndScriptsWorkFromAnyDirectory) {
    const ScratchDir dir("gpt2-install");
    const fs::path prefix = dir.path() / "prefix";
    const auto install = run_command("cmake --install " + std::string(GPT2_BUILD_DIR) +
                                     " --prefix " + prefix.string());
    ASSERT_EQ(install.exit_code, 0) << install.output;
    for (const char* file :
         {"bin/train_gpt2", "bin/inference", "bin/prepare_data", "share/doc/gpt2-mpi/README.md",
          "share/gpt2-mpi/scripts/mpirun.sh", "share/gpt2-mpi/scripts/train_resilient.sh",
          "share/gpt2-mpi/scripts/plot_metrics.py", "share/gpt2-mpi/scripts/get_gpt2_tokenizer.sh",
          "share/gpt2-mpi/scripts/get_gpt2_weights.sh", "share/gpt2-mpi/scripts/llama_generate.sh",
          "share/gpt2-mpi/scripts/llama_generate.mjs",
          "share/gpt2-mpi/scripts/make_dialogue_jsonl.py",
          "share/gpt2-mpi/scripts/slurm/train_gpt2.sbatch"}) {
        EXPECT_TRUE(fs::exists(prefix / file)) << file;
    }
    // The manual: README.md's docs/ beside it, every page.
    int pages = 0;
    for (const auto& page : fs::directory_iterator(fs::path(GPT2_SOURCE_DIR) / "docs")) {
        ++pages;
        EXPECT_TRUE(fs::exists(prefix / "share/doc/gpt2-mpi/docs" / page.path().filename()))
            << page.path();
    }
    EXPECT_GE(pages, 5);
    // Everything runs in a directory that has nothing to do with the checkout or the build.
    fs::create_directories(dir.path() / "work");
    test::write_corpus(dir.path() / "work/corpus.txt", 20000);
    const std::string in_work = "cd " + (dir / "work") + " && ";
    const std::string bin = (prefix / "bin/").string();
    const auto prepare = run_command(in_work + bin +
                                     "prepare_data --data corpus.txt --tokenizer char "
                                     "--out-dir shards");
    ASSERT_EQ(prepare.exit_code, 0) << prepare.output;
    const auto train = run_command(
        in_work + prefix.string() +
        "/share/gpt2-mpi/scripts/train_resilient.sh --max-restarts 0 -- " + bin + "train_gpt2" +
        kTiny +
        " --train-data 'shards/*_train_*.bin' --val-data 'shards/*_val_*.bin' --max-steps 3"
        " --out-dir out --resume auto");
    ASSERT_EQ(train.exit_code, 0) << train.output;
    const auto generate = run_command(in_work + bin +
                                      "inference out/model_000003.bin --prompt 'the ' "
                                      "--max-new-tokens 8 --seed 1");
    ASSERT_EQ(generate.exit_code, 0) << generate.output;
    EXPECT_NE(generate.output.find("the "), std::string::npos) << generate.output;
    EXPECT_EQ(run_command(bin + "train_gpt2 --version").output.rfind("train_gpt2 (gpt2-mpi) ", 0),
              0u);

    // The model to llama.cpp with what was installed: convert_model, then llama_generate.sh with
    // the copy of node-llama-cpp the install made (where the checkout has one to copy).
    const auto converted = run_command(in_work + bin + "convert_model out/model_000003.bin m.gguf");
    ASSERT_EQ(converted.exit_code, 0) << converted.output;
    if (!fs::exists(kSource + "/.deps/llama-cpp/node_modules/node-llama-cpp")) {
        GTEST_SKIP() << "node-llama-cpp is not installed in " << kSource
                     << "/.deps (GPT2_WITH_LLAMA_CPP=1 scripts/setup.sh installs it)";
    }
    EXPECT_TRUE(fs::exists(prefix / "share/gpt2-mpi/llama-cpp/node_modules/node-llama-cpp"));
    const auto llama = run_command(in_work + prefix.string() +
                                   "/share/gpt2-mpi/scripts/llama_generate.sh m.gguf --prompt "
                                   "'the ' --max-new-tokens 8 --temperature 0");
    ASSERT_EQ(llama.exit_code, 0) << llama.output;
    EXPECT_EQ(llama.output.rfind("the ", 0), 0u) << llama.output;
}

TEST(SlurmJob, TheExampleIsValidBashAndTheCommandItSubmitsRuns) {
    const std::string job = kSource + "/scripts/slurm/train_gpt2.sbatch";
    const auto syntax = run_command("bash -n " + job);
    EXPECT_EQ(syntax.exit_code, 0) << syntax.output;
    std::ifstream file(job);
    std::stringstream buffer;
    buffer << file.rdbuf();
    const std::string text = buffer.str();
    // sbatch reads only the #SBATCH lines before the first command.
    const std::string header = text.substr(0, text.find("\nset -euo"));
    EXPECT_NE(header.find("#SBATCH --nodes="), std::string::npos);
    EXPECT_NE(header.find("#SBATCH --signal=TERM@"), std::string::npos);

    // The default model flags are train_gpt2's.
    const auto help = run_command(test::build_path("train_gpt2") + " --help");
    std::smatch defaults;
    static const std::regex pattern(R"(MODEL_FLAGS:-([^}]*)\})");
    ASSERT_TRUE(std::regex_search(text, defaults, pattern));
    std::istringstream flags(defaults[1].str());
    for (std::string word; flags >> word;) {
        if (word.starts_with("--")) {
            EXPECT_NE(help.output.find(word + " "), std::string::npos) << word;
        }
    }

    const ScratchDir dir("gpt2-slurm");
    test::write_corpus(dir.path() / "corpus.txt", 20000);
    ASSERT_EQ(run_command(test::build_path("prepare_data") + " --data " + (dir / "corpus.txt") +
                          " --tokenizer char --out-dir " + (dir / "shards"))
                  .exit_code,
              0);
    const auto dry =
        run_command("DRY_RUN=1 SLURM_CPUS_PER_TASK=1 TRAIN=" + test::build_path("train_gpt2") +
                    " DATA=" + (dir / "shards") + " OUT=" + (dir / "out") + " MODEL_FLAGS='" +
                    test::without_given(kTiny, "--threads") + " --max-steps 2' bash " + job);
    ASSERT_EQ(dry.exit_code, 0) << dry.output;
    ASSERT_EQ(dry.output.rfind("srun --mpi=pmix --cpu-bind=none ", 0), 0u) << dry.output;
    // What srun would start on each node: run it as one rank here.
    const std::string command =
        dry.output.substr(std::string("srun --mpi=pmix --cpu-bind=none ").size());
    fs::create_directories(dir.path() / "out");
    const auto ran = run_command(test::mpiexec(1) + command);
    ASSERT_EQ(ran.exit_code, 0) << command << "\n" << ran.output;
    EXPECT_TRUE(fs::exists(dir.path() / "out/model_000002.bin")) << ran.output;
    EXPECT_TRUE(fs::exists(dir.path() / "out/metrics.jsonl")) << ran.output;
}

}  // namespace
}  // namespace gpt2
