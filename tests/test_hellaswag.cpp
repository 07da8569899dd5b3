// HellaSwag as llm.c evaluates it: llm.c's evaluation-file format read and written byte for byte,
// each ending's mean loss and the acc_norm of a tiny model equal to a PyTorch computation of the
// same examples (dev/make_hellaswag_reference.py) however the rows are split over workers, bad
// files refused naming file and example, and train_gpt2 --hellaswag logging the same accuracy
// however the examples are split over ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "data/multiple_choice.hpp"
#include "parallel/comm.hpp"
#include "parallel/worker_group.hpp"
#include "process_support.hpp"
#include "reference_fixture.hpp"
#include "tokenizer/tokenizer.hpp"
#include "train/multiple_choice_eval.hpp"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;
using test::run_command;
using test::ScratchDir;

const fs::path kData = GPT2_TEST_DATA_DIR;

TEST(HellaswagFile, ReadsAndWritesLlmcsFormatByteForByte) {
    const std::vector<MultipleChoiceExample> examples =
        read_multiple_choice_file(kData / "hellaswag_reference.bin");
    ASSERT_EQ(examples.size(), 7u);
    EXPECT_EQ(examples[5].context.size(), 12u);
    EXPECT_EQ(examples[5].endings[0].size(), 6u);
    for (const MultipleChoiceExample& e : examples) {
        EXPECT_EQ(e.endings.size(), 4u);
        EXPECT_LT(e.label, 4);
    }
    const ScratchDir dir("gpt2-hellaswag-file");
    write_multiple_choice_file(dir.path() / "again.bin", examples);
    EXPECT_EQ(read_file_bytes(dir.path() / "again.bin"),
              read_file_bytes(kData / "hellaswag_reference.bin"));
}

TEST(HellaswagFile, BadFilesNameTheFileAndTheExample) {
    const ScratchDir dir("gpt2-hellaswag-bad");
    const std::vector<std::uint8_t> good = read_file_bytes(kData / "hellaswag_reference.bin");
    const auto refused = [&](std::vector<std::uint8_t> bytes, const std::string& expected) {
        const fs::path path = dir.path() / "bad.bin";
        std::ofstream(path, std::ios::binary)
            .write(reinterpret_cast<const char*>(bytes.data()),
                   static_cast<std::streamsize>(bytes.size()));
        try {
            (void)read_multiple_choice_file(path);
            ADD_FAILURE() << "accepted; expected: " << expected;
        } catch (const InputError& e) {
            EXPECT_NE(std::string(e.what()).find(path.string() + ": " + expected),
                      std::string::npos)
                << e.what();
        }
    };
    std::vector<std::uint8_t> bytes = good;
    bytes[0] = 7;
    refused(bytes, "not an llm.c evaluation file");
    refused(std::vector<std::uint8_t>(good.begin(), good.end() - 10), "example 6 ");
    bytes = good;
    bytes[1024 + 6] = 9;  // the first example's label
    refused(bytes, "example 0: label 9 of 4 completions");
    bytes = good;
    bytes[1024] = 0;  // its delimiter
    refused(bytes, "example 0 does not start with 65535");
}

struct Reference {
    ModelConfig config{16, 101, 128, 2, 4, 64};
    test::ReferenceFixture fixture =
        test::ReferenceFixture::load(kData / "hellaswag_reference_expected.bin");
};

// Every ending's mean loss and the accuracy as PyTorch computed them, with rows split over 1, 2
// and 3 workers and 1 to 4 rows per forward pass.
TEST(HellaswagScoring, MatchesPyTorch) {
    const Reference ref;
    Model model(ref.config);
    const auto& params = ref.fixture.at("params").f32;
    ASSERT_EQ(params.size(), model.params.size());
    std::copy(params.begin(), params.end(), model.params.data());
    const std::vector<MultipleChoiceExample> examples =
        read_multiple_choice_file(kData / "hellaswag_reference.bin");
    const auto& expected = ref.fixture.at("mean_losses").f32;
    const Communicator comm = Communicator::single_process();
    for (const auto& [workers, batch] :
         std::vector<std::pair<int, int>>{{1, 1}, {2, 4}, {3, 6}, {2, 8}}) {
        WorkerGroup group(ref.config, workers, batch, 16, false);
        std::vector<std::int32_t> rows;
        std::size_t scored = 0;
        for (const MultipleChoiceExample& example : examples) {
            const std::vector<double> losses =
                ending_losses(model, group.context(0), example, rows);
            if (losses.empty()) continue;  // the one that does not fit T = 16
            ASSERT_EQ(losses.size(), 4u);
            for (std::size_t e = 0; e < 4; ++e) {
                EXPECT_NEAR(losses[e], expected[scored * 4 + e], 1e-5 * expected[scored * 4 + e])
                    << "example " << example.index << " ending " << e << " workers " << workers;
            }
            ++scored;
        }
        EXPECT_EQ(scored, 6u);
        const MultipleChoiceScore score = evaluate_multiple_choice(model, group, comm, examples);
        EXPECT_EQ(score.scored, 6);
        EXPECT_EQ(score.too_long, 1);
        EXPECT_EQ(score.correct, 3);
        EXPECT_DOUBLE_EQ(score.accuracy(), ref.fixture.at("acc_norm").f32[0]);
    }
}

// An example's endings go through one forward when the worker's context holds their rows: every
// context that holds them gives the same bits whatever its batch (the products' row counts are
// the example's; before, rows were grouped by the context's batch and OpenBLAS's results for a row
// depend on a product's row count), and a context too small for them scores them one by one, as
// PyTorch computes (MatchesPyTorch's tolerance).
TEST(HellaswagScoring, EveryContextThatHoldsTheEndingsGivesTheSameBits) {
    const Reference ref;
    Model model(ref.config);
    const auto& params = ref.fixture.at("params").f32;
    std::copy(params.begin(), params.end(), model.params.data());
    const std::vector<MultipleChoiceExample> examples =
        read_multiple_choice_file(kData / "hellaswag_reference.bin");
    constexpr int T = 16;
    std::vector<std::int32_t> rows;
    int compared = 0;
    for (const MultipleChoiceExample& example : examples) {
        int longest = 0;
        for (const auto& ending : example.endings)
            longest =
                std::max(longest, static_cast<int>(example.context.size() + ending.size()) - 1);
        if (longest > T) continue;
        std::vector<std::vector<double>> by_batch;
        for (const int batch : {3, 4, 5, 8}) {
            if (4 * longest > batch * T) continue;
            WorkerGroup group(ref.config, 1, batch, T, false);
            by_batch.push_back(ending_losses(model, group.context(0), example, rows));
        }
        ASSERT_GE(by_batch.size(), 2u) << "example " << example.index;
        for (std::size_t b = 1; b < by_batch.size(); ++b)
            EXPECT_EQ(by_batch[b], by_batch[0]) << "example " << example.index;
        ++compared;
        WorkerGroup one_row(ref.config, 1, 1, T, false);
        const std::vector<double> alone = ending_losses(model, one_row.context(0), example, rows);
        ASSERT_EQ(alone.size(), 4u);
        for (std::size_t e = 0; e < 4; ++e)
            EXPECT_NEAR(alone[e], by_batch[0][e], 1e-5 * by_batch[0][e]);
    }
    EXPECT_EQ(compared, 6);
}

// train_gpt2 --hellaswag: the accuracy at step 0 of the same weights is the same on 1 rank x 2
// workers and on 3 ranks x 1 worker; a file of another vocabulary is refused. The weights are a
// model trained 30 steps first: at initialisation every ending's loss is about ln(vocabulary), so
// acc_norm there hinges on near-ties that the fp32 products' last bits decide, and those depend
// on how many rows a product has (OpenBLAS's kernels: a row of a 2-row and of a 3-row product can
// differ). Both splits' workers hold an example's four rows (4 x 16 tokens), so its products have
// the same rows in both (EveryContextThatHoldsTheEndingsGivesTheSameBits).
TEST(HellaswagTraining, AccNormIsLoggedAndTheSameHoweverTheExamplesAreSplit) {
    const ScratchDir dir("gpt2-hellaswag-train");
    test::write_corpus(dir.path() / "corpus.txt", 30000);
    // 40 examples over the char vocabulary of write_corpus (ids below 20).
    std::vector<MultipleChoiceExample> examples;
    std::uint64_t x = 99;
    const auto next = [&](int n) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        return static_cast<std::int32_t>((x >> 33) % static_cast<std::uint64_t>(n));
    };
    for (int i = 0; i < 40; ++i) {
        MultipleChoiceExample e;
        e.index = i;
        e.label = next(4);
        e.context.resize(static_cast<std::size_t>(3 + next(8)));
        for (auto& t : e.context)
            t = next(15);
        for (int k = 0; k < 4; ++k) {
            e.endings.emplace_back(static_cast<std::size_t>(1 + next(6)));
            for (auto& t : e.endings.back())
                t = next(15);
        }
        examples.push_back(std::move(e));
    }
    write_multiple_choice_file(dir.path() / "eval.bin", examples);
    const std::string data = " --sample-every 0 --data " + (dir / "corpus.txt");
    const auto trained =
        run_command(test::build_path("train_gpt2") + test::small_model(16) + data +
                    " --val-every 0 --max-steps 30 --out-dir " + (dir / "trained"));
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
    const std::string common = test::build_path("train_gpt2") + " --init-from " +
                               (dir / "trained/model_000030.bin") + " --seq-len 16" + data +
                               " --val-every 2 --val-tokens 256 --max-steps 2 --checkpoint-every 0";
    std::vector<double> accuracy;
    for (const std::string split :
         {"--threads 2 --batch-size 8", "np3 --threads 1 --batch-size 4"}) {
        const bool mpi = split.starts_with("np3");
        const std::string name = mpi ? "np3" : "np1";
        const auto result = run_command((mpi ? test::mpiexec(3) : std::string()) + common + " " +
                                        (mpi ? split.substr(4) : split) + " --hellaswag " +
                                        (dir / "eval.bin") + " --out-dir " + (dir / name) +
                                        " --metrics-file " + (dir / (name + ".jsonl")));
        ASSERT_EQ(result.exit_code, 0) << result.output;
        EXPECT_NE(result.output.find("hellaswag: 40 examples from"), std::string::npos)
            << result.output;
        EXPECT_NE(result.output.find("step 0/2 | hellaswag acc_norm "), std::string::npos)
            << result.output;
        std::ifstream metrics(dir.path() / (name + ".jsonl"));
        std::vector<double> evals;
        for (std::string line; std::getline(metrics, line);) {
            const auto record = nlohmann::json::parse(line);
            if (record["type"] == "eval") {
                EXPECT_EQ(record["hellaswag_scored"], 40);
                evals.push_back(record["hellaswag_acc_norm"].get<double>());
            }
        }
        ASSERT_EQ(evals.size(), 2u);  // steps 0 and 2
        accuracy.push_back(evals[0]);
    }
    EXPECT_EQ(accuracy[0], accuracy[1]);

    const auto missing = run_command(common + " --threads 1 --batch-size 2 --hellaswag " +
                                     (dir / "missing.bin") + " --out-dir " + (dir / "missing"));
    EXPECT_EQ(missing.exit_code, 1) << missing.output;
    EXPECT_EQ(
        missing.output.rfind("error: --hellaswag " + (dir / "missing.bin") + ": no such file", 0),
        0u)
        << missing.output;  // first: before the corpus is read

    examples[3].endings[1][0] = 300;  // beyond the char vocabulary
    write_multiple_choice_file(dir.path() / "gpt2.bin", examples);
    const auto foreign = run_command(common + " --threads 1 --batch-size 2 --hellaswag " +
                                     (dir / "gpt2.bin") + " --out-dir " + (dir / "foreign"));
    EXPECT_EQ(foreign.exit_code, 1) << foreign.output;
    EXPECT_NE(foreign.output.find("--hellaswag " + (dir / "gpt2.bin") +
                                  ": token 300 is outside the model's vocabulary"),
              std::string::npos)
        << foreign.output;
}

// A download that fails (offline: here a refused connection on loopback) is one error line with
// curl's reason and what to do, exit 1, and nothing after it (before: prepare_data's second, about
// a missing file); no partial file is left.
TEST(HellaswagBuilder, AFailedDownloadIsOneLineSayingWhatToDo) {
    const ScratchDir dir("gpt2-hellaswag-offline");
    const std::string script = std::string(GPT2_SOURCE_DIR) + "/scripts/get_hellaswag.sh";
    // Its stderr alone (the "downloading" line goes to stdout).
    const auto result = run_command("{ GPT2_HELLASWAG_URL=http://127.0.0.1:9/hellaswag_val.jsonl " +
                                    script + " --out " + (dir / "out") + " --prepare-data " +
                                    test::build_path("prepare_data") + " 2>&1 >/dev/null; }");
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1) << result.output;
    EXPECT_EQ(result.output.rfind("get_hellaswag.sh: cannot download "
                                  "http://127.0.0.1:9/hellaswag_val.jsonl (curl: (7)",
                                  0),
              0u)
        << result.output;
    EXPECT_NE(result.output.find("give it with --jsonl FILE"), std::string::npos) << result.output;
    EXPECT_TRUE(fs::is_empty(dir.path() / "out"));
}

// scripts/get_hellaswag.sh with a local copy of HellaSwag's JSONL (of another name): it writes
// OUT/hellaswag_val.bin, the name train_gpt2 --help gives, holding GPT-2's tokens of each context
// and of each ending after a space (llm.c's dev/data/hellaswag.py); prepare_data --hellaswag
// names the file after the JSONL or --name; a bad line is one error naming it.
TEST(HellaswagBuilder, TokenizesTheJsonlAsLlmcDoes) {
    const fs::path gpt2_dir = fs::path(GPT2_SHARED_DATA_DIR) / "gpt2";
    if (!fs::exists(gpt2_dir / "encoder.json")) GTEST_SKIP() << "no GPT-2 tokenizer files";
    const ScratchDir dir("gpt2-hellaswag-build");
    const std::vector<nlohmann::json> records = {
        {{"ind", 24},
         {"ctx", "A man is sitting on a roof. he"},
         {"label", 3},
         {"endings",
          {"is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
           "is holding a rubik's cube.", "starts pulling up roofing on a roof."}}},
        {{"ctx", "Caf\u00e9 owners <|endoftext|> then"},
         {"label", 0},
         {"endings", {"smile.", "leave", "\u00e9t\u00e9", "x"}}}};
    {
        std::ofstream out(dir.path() / "local_copy.jsonl");
        for (const auto& r : records)
            out << r.dump() << "\n";
    }
    const std::string script = std::string(GPT2_SOURCE_DIR) + "/scripts/get_hellaswag.sh";
    const auto built = run_command(script + " --jsonl " + (dir / "local_copy.jsonl") + " --out " +
                                   (dir / "out") + " --tokenizer-dir " + gpt2_dir.string() +
                                   " --prepare-data " + test::build_path("prepare_data"));
    ASSERT_EQ(built.exit_code, 0) << built.output;
    EXPECT_NE(built.output.find("train_gpt2 --hellaswag " + (dir / "out/hellaswag_val.bin")),
              std::string::npos)
        << built.output;
    const auto help = run_command(test::build_path("train_gpt2") + " --help");
    EXPECT_NE(help.output.find("data/hellaswag/hellaswag_val.bin from scripts/get_hellaswag.sh"),
              std::string::npos)
        << help.output;
    ASSERT_TRUE(fs::exists(dir.path() / "out/hellaswag_val.bin"));
    const auto examples = read_multiple_choice_file(dir.path() / "out/hellaswag_val.bin");
    ASSERT_EQ(examples.size(), 2u);
    const auto tokenizer = load_gpt2_tokenizer(gpt2_dir);
    for (std::size_t i = 0; i < 2; ++i) {
        EXPECT_EQ(examples[i].label, records[i]["label"].get<int>());
        EXPECT_EQ(examples[i].context,
                  tokenizer->encode(records[i]["ctx"].get<std::string>(), EotInText::Text));
        for (std::size_t k = 0; k < 4; ++k) {
            std::string ending = " ";  // as llm.c: the ending after a space
            ending += records[i]["endings"][k].get<std::string>();
            EXPECT_EQ(examples[i].endings[k], tokenizer->encode(ending, EotInText::Text));
        }
    }
    EXPECT_EQ(examples[0].context.front(), 32);  // "A"
    const std::string prepare = test::build_path("prepare_data") + " --hellaswag " +
                                (dir / "local_copy.jsonl") + " --tokenizer gpt2 --tokenizer-dir " +
                                gpt2_dir.string() + " --out-dir ";
    ASSERT_EQ(run_command(prepare + (dir / "plain")).exit_code, 0);
    EXPECT_EQ(read_multiple_choice_file(dir.path() / "plain/local_copy.bin").size(), 2u);
    ASSERT_EQ(run_command(prepare + (dir / "named") + " --name eval").exit_code, 0);
    EXPECT_EQ(read_multiple_choice_file(dir.path() / "named/eval.bin").size(), 2u);
    std::ofstream(dir.path() / "bad.jsonl") << records[0].dump() << "\n{\"ctx\": \"x\"}\n";
    const auto bad = run_command(test::build_path("prepare_data") + " --hellaswag " +
                                 (dir / "bad.jsonl") + " --tokenizer gpt2 --tokenizer-dir " +
                                 gpt2_dir.string() + " --out-dir " + (dir / "bad"));
    EXPECT_EQ(bad.exit_code, 1) << bad.output;
    EXPECT_NE(bad.output.find((dir / "bad.jsonl") + ":2: not a HellaSwag example"),
              std::string::npos)
        << bad.output;
}

}  // namespace
}  // namespace gpt2
