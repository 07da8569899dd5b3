// The scripts users run: plot_metrics.py reads train_gpt2's metrics files (runs marked, the last
// run's whole curve with the starts it resumed plotted by default, one clear error for anything
// else), setup.sh installs only what is missing, judging Node and Python modules by the commands
// and modules present, get_gpt2_weights.sh fetches a Hub model and writes llm.c's file (against
// a local fake hub), and llama_generate.sh refuses a bad command line or a missing Node or package
// in one line (its generation is checked against inference in test_gguf); dev/bench_scaling.sh
// refuses a bad command line in one line and builds its table from recorded runs;
// dev/device_bundle.sh refuses before it unpacks or links anything;
// make_dialogue_jsonl.py turns a play into prompt/response records prepare_data masks.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "core/file_io.hpp"
#include "formats/checkpoint.hpp"
#include "formats/hugging_face.hpp"
#include "formats/model_file.hpp"
#include "formats_support.hpp"
#include "process_support.hpp"
#include "test_support.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;
using test::run_command;
using test::ScratchDir;

const std::string kSource = GPT2_SOURCE_DIR;

std::string plot(const std::string& args) {
    return "/usr/bin/python3 " + kSource + "/scripts/plot_metrics.py " + args;
}

TEST(PlotMetrics, ANonJsonLinesFileIsOneClearErrorWithItsLine) {
    if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
    const ScratchDir dir("gpt2-plot-bad");
    std::ofstream(dir.path() / "log.txt") << "{\"type\": \"train\", \"step\": 1, \"loss\": 2}\n"
                                          << "[12:00:00] step 2/600 | loss 1.9\n";
    const auto result = run_command(plot(dir / "log.txt"));
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_NE(result.output.find("plot_metrics: " + (dir / "log.txt") + ":2: not a JSON object"),
              std::string::npos)
        << result.output;
    EXPECT_EQ(result.output.find("Traceback"), std::string::npos) << result.output;
    const auto missing = run_command(plot(dir / "missing.jsonl"));
    EXPECT_EQ(missing.exit_code, 1) << missing.output;
    EXPECT_EQ(missing.output.find("Traceback"), std::string::npos) << missing.output;
}

// The default plot is the last run's whole training curve: its start and the starts it resumed
// (the same run id, skipping an unrelated run in the same file), each cut where the next resumed,
// so that steps done again after a crash appear once; --last-segment plots the last start only,
// --all-runs every start.
TEST(PlotMetrics, TheLastRunsWholeCurveIsPlottedWithTheStartsItResumed) {
    if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
    const ScratchDir dir("gpt2-plot-runs");
    test::write_corpus(dir.path() / "corpus.txt", 30000);
    // `extra`'s flags replace the defaults they give (a flag given twice is refused).
    const auto train = [&](const std::string& extra) {
        return test::build_path("train_gpt2") +
               test::without_given(
                   " --n-layer 1 --n-head 2 --n-embd 16 --seq-len 16 --batch-size 2"
                   " --val-every 2 --val-tokens 64 --sample-every 0 --max-steps 6"
                   " --checkpoint-every 2 --data " +
                       (dir / "corpus.txt") + " --metrics-file " + (dir / "m.jsonl"),
                   extra) +
               " " + extra;
    };
    // Run 1 fails at step 4 (a NaN gradient, --max-bad-steps 1) after its checkpoint at step 2
    // and its step 3; run 2 is another run in the same file; run 3 resumes run 1 from step 2.
    const auto crashed =
        run_command(train("--out-dir " + (dir / "a") + " --inject-nan-step 3 --max-bad-steps 1"));
    ASSERT_EQ(crashed.exit_code, 1) << crashed.output;
    ASSERT_EQ(run_command(train("--out-dir " + (dir / "b") + " --max-steps 2")).exit_code, 0);
    ASSERT_EQ(run_command(train("--out-dir " + (dir / "a") + " --resume auto")).exit_code, 0);
    const auto whole = run_command(plot(dir / "m.jsonl") + " --summary");
    ASSERT_EQ(whole.exit_code, 0) << whole.output;
    EXPECT_NE(whole.output.find("run 1: steps 1-3, 2 validations"), std::string::npos)
        << whole.output;
    EXPECT_NE(whole.output.find("run 2: steps 1-2"), std::string::npos) << whole.output;
    EXPECT_NE(whole.output.find("run 3: steps 3-6, 2 validations"), std::string::npos)
        << whole.output;
    EXPECT_NE(whole.output.find("at step 2 (resumed)"), std::string::npos) << whole.output;
    EXPECT_NE(whole.output.find("plotted: run 1, run 3\n"
                                "curve: steps 1-6, 6 train records, 4 validations\n"),
              std::string::npos)
        << whole.output;
    const auto last = run_command(plot(dir / "m.jsonl") + " --summary --last-segment");
    EXPECT_NE(last.output.find("plotted: run 3\ncurve: steps 3-6, 4 train records"),
              std::string::npos)
        << last.output;
    const auto all = run_command(plot(dir / "m.jsonl") + " --summary --all-runs");
    EXPECT_NE(all.output.find("plotted: run 1, run 2, run 3\n"), std::string::npos) << all.output;

    // Files of older versions have no run ids: a resumed start continues the one before it.
    std::ofstream(dir.path() / "old.jsonl") << R"({"type": "run", "start_step": 0, "resumed": false}
{"type": "train", "step": 1, "loss": 3.0}
{"type": "run", "start_step": 0, "resumed": false}
{"type": "train", "step": 1, "loss": 3.1}
{"type": "train", "step": 2, "loss": 3.0}
{"type": "run", "start_step": 2, "resumed": true}
{"type": "train", "step": 3, "loss": 2.9}
)";
    const auto old = run_command(plot(dir / "old.jsonl") + " --summary");
    EXPECT_NE(old.output.find("plotted: run 2, run 3\ncurve: steps 1-3, 3 train records"),
              std::string::npos)
        << old.output;

    if (run_command("/usr/bin/python3 -c 'import matplotlib'").exit_code != 0) {
        GTEST_SKIP() << "no matplotlib for /usr/bin/python3: the plot itself is not drawn";
    }
    const auto png = run_command(plot(dir / "m.jsonl") + " -o " + (dir / "m.png"));
    EXPECT_EQ(png.exit_code, 0) << png.output;
    EXPECT_GT(fs::file_size(dir.path() / "m.png"), 1000u);
}

// Node from elsewhere (nodesource, nvm) conflicts with Debian's npm package: setup.sh must look
// for the commands, not the packages.
TEST(Setup, NodeAndNpmAreJudgedByTheCommandsPresent) {
    const ScratchDir dir("gpt2-setup-node");
    // A PATH with only what setup.sh needs before it installs anything, plus fake node/npm.
    fs::create_directories(dir.path() / "bin");
    for (const char* tool : {"dirname", "dpkg-query", "grep"}) {
        const auto found = run_command(std::string("command -v ") + tool);
        ASSERT_EQ(found.exit_code, 0) << tool;
        fs::create_symlink(found.output.substr(0, found.output.find('\n')),
                           dir.path() / "bin" / tool);
    }
    const std::string run = "env GPT2_WITH_PYTHON=1 GPT2_SETUP_DRY_RUN=1 PATH=" + (dir / "bin") +
                            " /bin/bash " + kSource + "/scripts/setup.sh";
    const auto without = run_command(run);
    ASSERT_EQ(without.exit_code, 0) << without.output;
    // Without the commands, the Debian packages are wanted (unless dpkg already has them).
    for (const std::string package : {"nodejs", "npm"}) {
        const bool installed = run_command("dpkg-query -W -f='${Status}' " + package +
                                           " 2>/dev/null | grep -q 'ok installed'")
                                   .exit_code == 0;
        EXPECT_EQ(without.output.find(" " + package) != std::string::npos, !installed)
            << package << "\n"
            << without.output;
    }
    for (const char* tool : {"node", "npm"}) {
        std::ofstream(dir.path() / "bin" / tool) << "#!/bin/sh\nexit 0\n";
        fs::permissions(dir.path() / "bin" / tool, fs::perms::owner_all);
    }
    const auto with = run_command(run);
    ASSERT_EQ(with.exit_code, 0) << with.output;
    EXPECT_EQ(with.output.find(" nodejs"), std::string::npos) << with.output;
    EXPECT_EQ(with.output.find(" npm"), std::string::npos) << with.output;
}

// A PATH of links to the tools a script needs (and nothing else), for the missing-Node cases.
fs::path tools_only(const fs::path& dir, std::initializer_list<const char*> tools) {
    fs::create_directories(dir);
    for (const char* tool : tools) {
        const auto found = run_command(std::string("command -v ") + tool);
        EXPECT_EQ(found.exit_code, 0) << tool;
        fs::create_symlink(found.output.substr(0, found.output.find('\n')), dir / tool);
    }
    return dir;
}

TEST(LlamaGenerate, ABadCommandLineOrAMissingPieceIsOneErrorLine) {
    const ScratchDir dir("gpt2-llama-generate");
    const std::string script = kSource + "/scripts/llama_generate.sh";
    std::ofstream(dir.path() / "m.gguf") << "GGUF and not much else";
    std::ofstream(dir.path() / "text.gguf") << "not a model";
    const auto fails = [&](const std::string& command, int code, const std::string& message) {
        const auto r = run_command(command);
        EXPECT_EQ(r.exit_code, code) << command << "\n" << r.output;
        EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
        EXPECT_EQ(r.output.rfind("llama_generate.sh: ", 0), 0u) << r.output;
        EXPECT_NE(r.output.find(message), std::string::npos) << command << "\n" << r.output;
    };
    const std::string model = " " + (dir / "m.gguf");
    fails(script, 2, "no model file");
    fails(script + model + " --prompt hi --bogus", 2, "unknown flag --bogus");
    fails(script + model + " --prompt", 2, "--prompt needs a value");
    fails(script + model + " --prompt hi --max-new-tokens ten", 2,
          "--max-new-tokens must be a whole number >= 0, not 'ten'");
    fails(script + model + " --temperature -1", 2, "--temperature must be a number >= 0");
    fails(script + model + " --top-p 0", 2, "--top-p must be in (0, 1], not '0'");
    fails(script + model + " --seed 4294967296", 2,
          "--seed must be a whole number in 0..4294967295");
    fails(script + model + model, 2, "one model file only");
    fails(script + " " + (dir / "missing.gguf") + " --prompt hi", 1, "missing.gguf: no such file");
    fails(script + " " + (dir / "text.gguf") + " --prompt hi", 1, "text.gguf: not a GGUF file");
    // Without Node, or without the package where the script looks: what is missing and the fix.
    const fs::path bin = tools_only(dir.path() / "bin", {"dirname", "head"});
    fails("PATH=" + bin.string() + " /bin/bash " + script + model + " --prompt hi", 1,
          "node (Node.js) not found; GPT2_WITH_LLAMA_CPP=1 scripts/setup.sh installs it");
    if (run_command("command -v node").exit_code == 0) {
        fs::create_directories(dir.path() / "copy" / "scripts");
        for (const char* file : {"llama_generate.sh", "llama_generate.mjs"})
            fs::copy_file(kSource + "/scripts/" + file, dir.path() / "copy" / "scripts" / file);
        fails("GPT2_LLAMA_CPP_DIR=" + (dir / "nowhere") + " /bin/bash " +
                  (dir / "copy/scripts/llama_generate.sh") + model + " --prompt hi",
              1,
              "node-llama-cpp not found in $GPT2_LLAMA_CPP_DIR (" + (dir / "nowhere") + "), " +
                  (dir / "copy/.deps/llama-cpp"));
    }
}

// dev/bench_scaling.sh: a bad command line is one line with the usage and exit 2, before anything
// runs; a missing program is one line and exit 1; the table is the medians over rounds, with the
// speedup and efficiency against 1 worker and threads against ranks (from recorded runs, not
// timed here: --plot-only).
TEST(BenchScaling, ABadCommandLineIsOneUsageLineAndTheTableIsTheRoundsMedians) {
    const ScratchDir dir("gpt2-bench-scaling");
    const std::string script = kSource + "/dev/bench_scaling.sh";
    const std::string out = " --out-dir " + (dir / "out");
    const auto help = run_command(script + " --help");
    EXPECT_EQ(help.exit_code, 0) << help.output;
    EXPECT_NE(help.output.find("Usage: dev/bench_scaling.sh"), std::string::npos) << help.output;
    EXPECT_NE(help.output.find("Needs, and builds nothing: build/train_gpt2"), std::string::npos);
    const auto fails = [&](const std::string& args, int code, const std::string& message) {
        const auto r = run_command(script + args);
        EXPECT_EQ(r.exit_code, code) << args << "\n" << r.output;
        EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
        EXPECT_EQ(r.output.rfind("bench_scaling.sh: ", 0), 0u) << r.output;
        EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
        if (code == 2) {
            EXPECT_NE(r.output.find("usage: dev/bench_scaling.sh"), std::string::npos);
        }
    };
    fails(" --bogus" + out, 2, "unknown flag --bogus");
    fails(" --repeats 0" + out, 2, "--repeats must be a positive whole number, not '0'");
    fails(" --steps" + out, 2, "--steps needs a value");
    fails(" --configs 124M,70B" + out, 2,
          "--configs takes 124M and/or d6 (each with -bf16 or not), not '70B'");
    fails(" --configs d6-fp16" + out, 2, "not 'd6-fp16'");
    fails(" --workers 1,two" + out, 2, "--workers takes positive whole numbers, not 'two'");
    fails(" --workers 100000" + out, 2, "--workers 100000 exceeds the ");
    fails(" --oversubscribe --workers 1,3 --batch 16" + out, 2,
          "--batch 16 is not a multiple of worker count 3");
    EXPECT_FALSE(fs::exists(dir.path() / "out")) << "a bad command line writes nothing";

    // A copy of the script where there is no build/train_gpt2.
    fs::create_directories(dir.path() / "copy" / "dev");
    fs::copy_file(script, dir.path() / "copy/dev/bench_scaling.sh");
    const auto missing = run_command("/bin/bash " + (dir / "copy/dev/bench_scaling.sh") +
                                     " --workers 1 --configs d6" + out);
    EXPECT_EQ(missing.exit_code, 1) << missing.output;
    EXPECT_NE(
        missing.output.find("bench_scaling.sh: " + (dir / "copy/build/train_gpt2") + " is missing"),
        std::string::npos)
        << missing.output;
    EXPECT_FALSE(fs::exists(dir.path() / "out")) << "nothing written before the check";

    fails(" --plot-only" + out, 1, "no runs recorded yet");
    fs::create_directories(dir.path() / "out");

    // Three rounds of 1 worker and of 2 workers both ways, recorded by an earlier call elsewhere.
    std::ofstream(dir.path() / "out" / "machine.txt")
        << "Some CPU, 16 CPUs (1 socket(s) x 16 cores x 1 thread(s)), nproc 16\n";
    std::ofstream runs(dir.path() / "out" / "runs.csv");
    runs << "config,seq_len,batch,steps,layout,workers,round,tok_s,peak_rss_mib,"
            "forward_backward_ms,thread_reduction_ms,allreduce_ms,optimizer_ms,step_ms,"
            "barrier_mean_ms,barrier_max_ms,reduction_share,log\n";
    const auto row = [&](const std::string& layout, int workers, int round, double tok_s,
                         const std::string& config = "d6") {
        runs << config << ",256,16,5," << layout << ',' << workers << ',' << round << ',' << tok_s
             << ",600,90,4,1,5,100,2,3,0.05,logs/x.log\n";
    };
    for (const auto& [round, one, threads, ranks] : {std::tuple{1, 1000.0, 1900.0, 2000.0},
                                                     {2, 1100.0, 1950.0, 2000.0},
                                                     {3, 900.0, 1800.0, 2000.0}}) {
        row("threads", 1, round, one);
        row("threads", 2, round, threads);
        row("ranks", 2, round, ranks);
    }
    // The same in bf16, one round: a table of its own, against its own 1 worker.
    row("threads", 1, 1, 1500.0, "d6-bf16");
    row("threads", 2, 1, 2700.0, "d6-bf16");
    row("ranks", 2, 1, 3000.0, "d6-bf16");
    runs.close();
    const auto table = run_command(script + " --plot-only" + out);
    ASSERT_EQ(table.exit_code, 0) << table.output;
    const std::string csv = read_text_file(dir.path() / "out/scaling.csv");
    // Medians 1000, 1900 and 2000 tok/s: speedups 1.90 and 2.00, threads at 0.95 x ranks.
    for (const char* line : {"\nd6,256,16,5,threads,1,3,1000.0,1.00,1.00,,600",
                             "\nd6,256,16,5,threads,2,3,1900.0,1.90,0.95,0.95,600",
                             "\nd6,256,16,5,ranks,2,3,2000.0,2.00,1.00,,600",
                             "\nd6-bf16,256,16,5,threads,2,1,2700.0,1.80,0.90,0.90,600"})
        EXPECT_NE(csv.find(line), std::string::npos) << line << " in\n" << csv;
    const std::string markdown = read_text_file(dir.path() / "out/scaling.md");
    EXPECT_NE(markdown.find("Some CPU, 16 CPUs"), std::string::npos) << markdown;
    for (const char* title : {"### d6 (L6 H6 C384, V 65), fp32, T=256, global batch 16",
                              "### d6 (L6 H6 C384, V 65), bf16, T=256, global batch 16"})
        EXPECT_NE(markdown.find(title), std::string::npos) << title << " in\n" << markdown;
    EXPECT_NE(
        markdown.find(
            "| 2 | 1 rank x 2 workers | 1900 | 1.90 | 0.95 | 0.95 | 600.0 | 2.00 / 3.00 | 5.0% | "
            "90.0 | 4.0 | 1.0 | 5.0 |"),
        std::string::npos)
        << markdown;
}

// dev/device_bundle.sh: every refusal is one line and exit 1, made before anything is unpacked
// into /tmp/gpt2-bundle or linked; a build/train_gpt2 of the user's own is never replaced. (Its
// pack and run were checked by hand with the system's Open MPI and libraries hidden; a pack
// builds twice, too long for the suite.)
TEST(DeviceBundle, ARefusalIsOneLineBeforeAnythingIsUnpackedOrLinked) {
    const ScratchDir dir("gpt2-device-bundle");
    fs::create_directories(dir.path() / "copy/dev");
    fs::create_directories(dir.path() / "copy/build");
    fs::copy_file(kSource + "/dev/device_bundle.sh", dir.path() / "copy/dev/device_bundle.sh");
    const std::string script = "/bin/bash " + (dir / "copy/dev/device_bundle.sh");
    const auto help = run_command(script + " --help");
    EXPECT_EQ(help.exit_code, 0) << help.output;
    EXPECT_NE(help.output.find("dev/device_bundle.sh pack [--out FILE]"), std::string::npos);
    const auto fails = [&](const std::string& args, const std::string& message) {
        const auto r = run_command(script + args);
        EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
        EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
        EXPECT_EQ(r.output.rfind("device_bundle.sh: ", 0), 0u) << r.output;
        EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
    };
    fails("", "usage: dev/device_bundle.sh pack");
    fails(" pack --bogus", "pack: unknown argument '--bogus'");
    fails(" run", "run: no command after --");
    fails(" run true", "run: expected -- before the command, not 'true'");
    fails(" run --variant v5 -- true", "--variant is v3 or v4");
    fails(" run -- true", (dir / "copy/.deps/device-bundle.tar.gz") + " is missing");

    // A bundle is there, and so is a train_gpt2 the user built: refused, left as it was.
    const auto bundle = dir.path() / "bundle.tar.gz";
    std::ofstream(bundle) << "not looked at before the refusal";
    std::ofstream(dir.path() / "copy/build/train_gpt2") << "the user's own";
    const auto before = fs::exists("/tmp/gpt2-bundle") ? fs::last_write_time("/tmp/gpt2-bundle")
                                                       : fs::file_time_type{};
    fails(" run --bundle " + bundle.string() + " -- true",
          (dir / "copy/build/train_gpt2") + " exists and is not the bundle's");
    EXPECT_EQ(read_text_file(dir.path() / "copy/build/train_gpt2"), "the user's own");
    const auto after = fs::exists("/tmp/gpt2-bundle") ? fs::last_write_time("/tmp/gpt2-bundle")
                                                      : fs::file_time_type{};
    EXPECT_EQ(before, after) << "nothing unpacked";
}

// get_gpt2_weights.sh against a fake hub (a file:// folder holding a small exported model in the
// Hub's file names): the files land in DIR, llm.c's file beside it holds the same weights, it works
// from any directory, and a second run keeps what is there.
TEST(GetGpt2Weights, DownloadsTheHubsFilesAndWritesLlmcsModelFile) {
    const ScratchDir dir("gpt2-get-weights");
    const auto chars = make_char_tokenizer("the king shall speak of love and war\n");
    Model model(ModelConfig{16, chars->vocab_size(), pad_vocab(chars->vocab_size()), 1, 2, 32});
    init_parameters(model, 27);
    write_hugging_face_model(dir.path() / "hub", model, chars.get(), ElementType::F32);
    fs::create_directories(dir.path() / "work");
    const std::string script = "cd " + (dir / "work") + " && GPT2_HF_BASE_URL=file://" +
                               (dir / "hub") + " " + kSource + "/scripts/get_gpt2_weights.sh";
    const std::string convert = " --convert-model " + test::build_path("convert_model");
    const auto r = run_command(script + convert);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const char* file : {"config.json", "generation_config.json", "model.safetensors",
                             "vocab.json", "merges.txt"}) {
        EXPECT_EQ(read_file_bytes(dir.path() / "work/gpt2-hf" / file),
                  read_file_bytes(dir.path() / "hub" / file))
            << file;
    }
    const LoadedModel llmc = load_model_file(dir.path() / "work/gpt2_124M.bin");
    EXPECT_FALSE(llmc.extras.has_value());  // a plain llm.c model file
    formats_test::expect_bitwise(llmc.model.weights(), model.weights());
    const auto again = run_command(script + convert);
    ASSERT_EQ(again.exit_code, 0) << again.output;
    EXPECT_NE(again.output.find("model.safetensors: already there"), std::string::npos)
        << again.output;

    // Another DIR puts llm.c's file beside it; a missing file on the hub is one error line.
    const auto nested = run_command(script + " models/gpt2 " + convert);
    ASSERT_EQ(nested.exit_code, 0) << nested.output;
    EXPECT_TRUE(fs::exists(dir.path() / "work/models/gpt2_124M.bin"));
    fs::remove(dir.path() / "hub" / "merges.txt");
    const auto missing = run_command(script + " other" + convert);
    EXPECT_EQ(missing.exit_code, 1) << missing.output;
    EXPECT_EQ(missing.output.substr(missing.output.rfind("downloading")).find("\nget_gpt2_weights"),
              missing.output.substr(missing.output.rfind("downloading")).find('\n'))
        << "one error line after the last download: " << missing.output;
    EXPECT_FALSE(fs::exists(dir.path() / "out")) << "nothing written before the check";
    EXPECT_NE(missing.output.find("get_gpt2_weights.sh: file://" + (dir / "hub") +
                                  "/merges.txt: download failed"),
              std::string::npos)
        << missing.output;
    EXPECT_FALSE(fs::exists(dir.path() / "work/other/merges.txt"));
    EXPECT_FALSE(fs::exists(dir.path() / "work/other/merges.txt.part"));
    const auto bad = run_command(script + " --bogus");
    EXPECT_EQ(bad.exit_code, 2) << bad.output;
    EXPECT_NE(bad.output.find("get_gpt2_weights.sh: unknown flag --bogus"), std::string::npos)
        << bad.output;
}

// Each speech of the speaker answers the speech before it: the prompt is that speech with its
// speaker and the speaker's own name line, the response the speech; a speech that opens the text
// has nothing to answer. prepare_data reads the records as prompt/response data and trains on the
// responses' characters only. A speaker who never answers is one line, exit 1.
TEST(MakeDialogueJsonl, EachSpeechOfTheSpeakerAnswersTheOneBeforeIt) {
    if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
    const ScratchDir dir("gpt2-dialogue");
    std::ofstream(dir.path() / "play.txt")
        << "ROMEO:\nHe jests at scars.\n\nJULIET:\nAy me!\n\nROMEO:\nShe speaks:\nO, speak "
           "again.\n\n"
        << "Stage directions without a speaker\n\nJULIET:\nO Romeo, Romeo!\n";
    const std::string script = "/usr/bin/python3 " + kSource + "/scripts/make_dialogue_jsonl.py ";
    const auto made = run_command(script + (dir / "play.txt") + " --speaker ROMEO --out " +
                                  (dir / "romeo.jsonl"));
    ASSERT_EQ(made.exit_code, 0) << made.output;
    std::istringstream lines(read_text_file(dir.path() / "romeo.jsonl"));
    std::vector<nlohmann::json> records;
    for (std::string line; std::getline(lines, line);)
        records.push_back(nlohmann::json::parse(line));
    ASSERT_EQ(records.size(), 1u);
    EXPECT_EQ(records[0]["prompt"], "JULIET:\nAy me!\n\nROMEO:\n");
    EXPECT_EQ(records[0]["response"], "She speaks:\nO, speak again.\n");

    const auto all =
        run_command(script + (dir / "play.txt") + " --speaker ALL --out " + (dir / "all.jsonl"));
    ASSERT_EQ(all.exit_code, 0) << all.output;
    EXPECT_NE(all.output.find("3 records (ALL)"), std::string::npos) << all.output;

    const auto prepared =
        run_command(test::build_path("prepare_data") + " --data " + (dir / "all.jsonl") +
                    " --tokenizer char --out-dir " + (dir / "shards") + " --val-fraction 0");
    ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
    // The responses: "Ay me!\n", "She speaks:\nO, speak again.\n" and "O Romeo, Romeo!\n".
    const std::size_t response_chars = 7 + 28 + 16;
    EXPECT_NE(
        prepared.output.find("loss mask: " + std::to_string(response_chars) + " tokens trained"),
        std::string::npos)
        << prepared.output;

    const auto nobody = run_command(script + (dir / "play.txt") + " --speaker NOBODY");
    EXPECT_EQ(nobody.exit_code, 1) << nobody.output;
    EXPECT_NE(nobody.output.find("--speaker NOBODY: no speech of theirs follows another"),
              std::string::npos)
        << nobody.output;
    EXPECT_EQ(nobody.output.find("Traceback"), std::string::npos) << nobody.output;
}

}  // namespace
}  // namespace gpt2
