// The loss on the response only: the masked loss and gradient against PyTorch's cross_entropy with
// ignore_index (tests/data/gpt2_masked_reference.bin, dev/make_reference.py); the mask files
// prepare_data writes for JSON Lines prompt/response, multi-turn chat and Parquet records, and
// their refusals; train_gpt2 with masks: an all-prompt step, 1 and 2 workers and ranks alike,
// resume bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "data/shard.hpp"
#include "data/windows.hpp"
#include "formats/checkpoint.hpp"
#include "model/forward_backward.hpp"
#include "ops/kernels.hpp"
#include "process_support.hpp"
#include "reference_fixture.hpp"
#include "test_support.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;
using test::mpiexec;
using test::ReferenceFixture;
using test::run_command;
using test::ScratchDir;

// ---- the loss -------------------------------------------------------------------------------

// PyTorch's F.cross_entropy(ignore_index=-100) on the fixture's model and batch (a prompt, a
// sequence with no trained target, every other target): the mean loss over the trained targets and
// its gradient, at the tolerances of the unmasked reference test (test_model_reference.cpp).
TEST(MaskedLoss, LossAndGradientMatchPyTorchIgnoreIndex) {
    const ReferenceFixture fixture =
        ReferenceFixture::load(std::string(GPT2_TEST_DATA_DIR) + "/gpt2_masked_reference.bin");
    const auto& cfg = fixture.at("config").i32;
    const int B = cfg[6], T = cfg[7];
    const Model model = test::fixture_model(fixture);
    const std::vector<std::int32_t>& targets = fixture.at("targets").i32;
    const auto trained = std::count_if(targets.begin(), targets.end(),
                                       [](std::int32_t t) { return t != kIgnoredTarget; });
    ASSERT_EQ(trained, fixture.at("trained").i32[0]);
    ASSERT_LT(trained, B * T);  // the mask leaves some out
    ThreadLocalTrainingContext ctx(model.config, B, T);
    std::vector<float> gradient(model.layout.total(), 0.0f);
    const TokenBatch batch{fixture.at("inputs").i32, targets, B, T};
    const double loss_sum =
        forward_backward(model, ctx, batch, 1.0f / static_cast<float>(trained), gradient);
    const float expected = fixture.at("loss").f32[0];
    EXPECT_NEAR(loss_sum / static_cast<double>(trained), expected, 1e-5);
    EXPECT_TRUE(test::all_close(gradient, fixture.at("grads").f32, 1e-3, 2e-6));
    // Evaluation's forward sums the same losses.
    EXPECT_NEAR(forward_loss(model, ctx, batch) / static_cast<double>(trained), expected, 1e-5);
}

// An ignored target adds no loss and leaves a zero gradient row, whatever the logits; the rows
// around it are the unmasked kernel's.
TEST(MaskedLoss, IgnoredTargetHasNoLossAndNoGradient) {
    const int V = 5, Vp = 8;
    std::vector<float> logits = {0.1f, 2.0f, -1.0f, 0.5f, 0.3f, 9.f, 9.f, 9.f,   // row 0
                                 1.0f, 0.2f, 0.7f,  -2.f, 3.0f, 9.f, 9.f, 9.f,   // row 1: ignored
                                 0.4f, 0.4f, 0.1f,  0.2f, 1.5f, 9.f, 9.f, 9.f};  // row 2
    const std::vector<std::int32_t> masked = {1, kIgnoredTarget, 4};
    const std::vector<std::int32_t> plain = {1, 2, 4};
    std::vector<float> losses(3), plain_losses(3), forward_losses(3);
    std::vector<float> dlogits = logits, plain_dlogits = logits;
    cross_entropy_forward(forward_losses.data(), logits.data(), masked.data(), 3, V, Vp);
    cross_entropy_forward_backward(losses.data(), dlogits.data(), masked.data(), 3, V, Vp, 0.5f);
    cross_entropy_forward_backward(plain_losses.data(), plain_dlogits.data(), plain.data(), 3, V,
                                   Vp, 0.5f);
    EXPECT_EQ(losses[1], 0.0f);
    EXPECT_EQ(forward_losses[1], 0.0f);
    for (int j = 0; j < Vp; ++j)
        EXPECT_EQ(dlogits[static_cast<std::size_t>(Vp + j)], 0.0f) << j;
    for (const int r : {0, 2}) {
        EXPECT_EQ(losses[static_cast<std::size_t>(r)], plain_losses[static_cast<std::size_t>(r)]);
        EXPECT_EQ(forward_losses[static_cast<std::size_t>(r)],
                  plain_losses[static_cast<std::size_t>(r)]);
        for (int j = 0; j < Vp; ++j) {
            const auto k = static_cast<std::size_t>(r * Vp + j);
            EXPECT_EQ(dlogits[k], plain_dlogits[k]);
        }
    }
}

// ---- windows and the step's count -------------------------------------------------------------

// A masked store gives ignored targets where the mask is 0 (the target's own byte), counts a
// window's trained targets, and a step's count over every rank's slots is the sum of what the
// ranks' windows hold.
TEST(MaskedWindows, TargetsAndCountsFollowTheMask) {
    const int T = 4;
    std::vector<std::uint16_t> tokens(41);
    std::vector<std::uint8_t> mask(41);
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = static_cast<std::uint16_t>(i);
        mask[i] = (i % 3 == 0 || i >= 33) ? 1 : 0;  // window 8 (targets 33..36): all trained
    }
    TokenStore store;
    store.add(tokens, mask);
    EXPECT_TRUE(store.masked());
    std::vector<std::int32_t> inputs(T), targets(T);
    store.copy_window(1, T, inputs, targets);  // tokens 4..8, targets 5..8
    EXPECT_EQ(inputs, (std::vector<std::int32_t>{4, 5, 6, 7}));
    EXPECT_EQ(targets,
              (std::vector<std::int32_t>{kIgnoredTarget, 6, kIgnoredTarget, kIgnoredTarget}));
    EXPECT_EQ(store.trained_targets(1, T), 1);
    EXPECT_EQ(store.trained_targets(8, T), 4);

    WindowSampler sampler(store, T, 7, true);
    const int world = 2, B = 2, accum = 2;
    for (std::uint64_t step = 0; step < 5; ++step) {
        std::int64_t counted = 0;
        for (int rank = 0; rank < world; ++rank) {
            std::vector<std::int32_t> in(static_cast<std::size_t>(B * accum * T)), tg(in.size());
            sampler.fill_step(step, rank, world, B, accum, in, tg);
            counted += std::count_if(tg.begin(), tg.end(), [](std::int32_t t) { return t >= 0; });
        }
        EXPECT_EQ(sampler.step_trained_targets(step, B * world * accum), counted) << step;
    }
}

// ---- the mask file ----------------------------------------------------------------------------

void write_bytes(const fs::path& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary) << bytes;
}

std::string error_of(const fs::path& path, std::size_t tokens) {
    try {
        const MappedShardMask mask(path, tokens);
    } catch (const InputError& e) {
        return e.what();
    }
    return "";
}

TEST(MaskFile, RoundTripsAndRefusesWhatIsNotAMaskOfItsShard) {
    const ScratchDir dir("gpt2-mask-file");
    const fs::path path = dir.path() / "a.bin.mask";
    const std::vector<std::uint8_t> mask = {0, 1, 1, 0, 1};
    write_shard_mask(path, mask);
    EXPECT_EQ(mask_path(dir.path() / "a.bin"), path);
    const MappedShardMask mapped(path, mask.size());
    EXPECT_TRUE(std::equal(mask.begin(), mask.end(), mapped.mask().begin(), mapped.mask().end()));
    const std::vector<std::uint8_t> bytes = read_file_bytes(path);
    ASSERT_EQ(bytes.size(), kMaskHeaderBytes + mask.size());
    EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 8), "GPT2MASK");

    EXPECT_EQ(error_of(path, 6), path.string() + ": the mask has 5 tokens but its shard has 6");
    EXPECT_EQ(error_of(dir.path() / "none.mask", 5),
              (dir.path() / "none.mask").string() + ": mask file does not exist");
    std::string text(bytes.begin(), bytes.end());
    write_bytes(dir.path() / "magic.mask", "GPT2MASX" + text.substr(8));
    EXPECT_NE(error_of(dir.path() / "magic.mask", 5).find("wrong magic"), std::string::npos);
    write_bytes(dir.path() / "short.mask", text.substr(0, text.size() - 1));
    EXPECT_NE(error_of(dir.path() / "short.mask", 5).find("size mismatch"), std::string::npos);
    write_bytes(dir.path() / "byte.mask", text.substr(0, text.size() - 1) + "\x02");
    EXPECT_EQ(
        error_of(dir.path() / "byte.mask", 5),
        (dir.path() / "byte.mask").string() + ": mask byte 2 at position 4 is neither 0 nor 1");
    EXPECT_THROW(write_shard_mask(dir.path() / "w.mask", std::vector<std::uint8_t>{0, 3}),
                 InputError);
}

// ---- prepare_data -----------------------------------------------------------------------------

const fs::path kGpt2Dir = fs::path(GPT2_SOURCE_DIR) / "data" / "gpt2";

// A prepared train shard and its mask (one shard: the default shard size).
struct Prepared {
    std::vector<std::int32_t> tokens;
    std::vector<std::uint8_t> mask;
    bool has_mask = false;
};

Prepared read_prepared(const fs::path& dir, const std::string& name) {
    const fs::path shard = dir / (name + "_train_000000.bin");
    Prepared out;
    const MappedShard mapped(shard);
    out.tokens.assign(mapped.tokens().begin(), mapped.tokens().end());
    out.has_mask = fs::exists(mask_path(shard));
    if (out.has_mask) {
        const MappedShardMask mask(mask_path(shard), out.tokens.size());
        out.mask.assign(mask.mask().begin(), mask.mask().end());
    }
    EXPECT_FALSE(fs::exists(dir / (name + "_train_000001.bin")));
    return out;
}

// The stream a record adds: its end-of-text token (trained: it ends the example before), then
// each stretch of its text encoded on its own, trained or not.
struct Expected {
    const Tokenizer& tokenizer;
    Prepared stream{{}, {}, true};
    void document() {
        stream.tokens.push_back(*tokenizer.eot_id());
        stream.mask.push_back(1);
    }
    void add(const std::string& text, bool trained) {
        for (const std::int32_t t : tokenizer.encode(text, EotInText::Token)) {
            stream.tokens.push_back(t);
            stream.mask.push_back(trained ? 1 : 0);
        }
    }
    void prompt_response(const std::string& prompt, const std::string& response) {
        document();
        add(prompt + "\n\n", false);
        add(response, true);
    }
    // OpenAI's messages: "role: content" joined by blank lines; the assistants' content trained.
    void chat(const nlohmann::json& messages) {
        document();
        std::string untrained;
        for (std::size_t i = 0; i < messages.size(); ++i) {
            const std::string role = messages[i]["role"];
            untrained += (i > 0 ? "\n\n" : "") + role + ": ";
            if (role == "assistant") {
                add(untrained, false);
                untrained.clear();
                add(messages[i]["content"].get<std::string>(), true);
            } else {
                untrained += messages[i]["content"].get<std::string>();
            }
        }
        if (!untrained.empty()) add(untrained, false);
    }
};

std::string prepare(const ScratchDir& dir, const std::string& data, const std::string& name,
                    const std::string& extra = "") {
    return test::build_path("prepare_data") + " --data " + data +
           " --tokenizer gpt2 --tokenizer-dir " + kGpt2Dir.string() +
           " --val-fraction 0 --out-dir " + (dir / "out") + " --name " + name + extra + " 2>&1";
}

void expect_stream(const Prepared& actual, const Prepared& expected) {
    ASSERT_TRUE(actual.has_mask);
    EXPECT_EQ(actual.tokens, expected.tokens);
    ASSERT_EQ(actual.mask.size(), expected.mask.size());
    for (std::size_t i = 0; i < actual.mask.size(); ++i)
        ASSERT_EQ(actual.mask[i], expected.mask[i]) << "token " << i;
}

TEST(PrepareLossMask, JsonLinesPromptResponseAndMultiTurnChat) {
    const ScratchDir dir("gpt2-mask-jsonl");
    const auto tokenizer = load_gpt2_tokenizer(kGpt2Dir);
    const std::vector<std::pair<std::string, std::string>> pairs = {
        {"What is 2 plus 3?", "2 plus 3 is 5."}, {"Name a colour.", " Blue <|endoftext|> green"}};
    std::string jsonl;
    for (const auto& [p, r] : pairs)
        jsonl += nlohmann::json{{"prompt", p}, {"response", r}}.dump() + "\n";
    write_bytes(dir.path() / "qa.jsonl", jsonl);
    const auto qa = run_command(prepare(dir, dir / "qa.jsonl", "qa"));
    ASSERT_EQ(qa.exit_code, 0) << qa.output;
    EXPECT_NE(qa.output.find("the loss is on the responses only"), std::string::npos) << qa.output;
    Expected expected{*tokenizer};
    for (const auto& [p, r] : pairs)
        expected.prompt_response(p, r);
    expect_stream(read_prepared(dir.path() / "out", "qa"), expected.stream);

    // Multi-turn: every assistant turn trained; system and user turns, roles and separators not.
    const nlohmann::json chats = nlohmann::json::array(
        {nlohmann::json::array({{{"role", "system"}, {"content", "Be brief."}},
                                {{"role", "user"}, {"content", "Hi"}},
                                {{"role", "assistant"}, {"content", "Hello!"}},
                                {{"role", "user"}, {"content", "Bye"}},
                                {{"role", "assistant"}, {"content", "Goodbye."}}}),
         nlohmann::json::array({{{"role", "user"}, {"content", "One more?"}},
                                {{"role", "assistant"}, {"content", "Sure: one."}}})});
    std::string chat_lines;
    for (const nlohmann::json& messages : chats)
        chat_lines += nlohmann::json{{"messages", messages}}.dump() + "\n";
    write_bytes(dir.path() / "chat.jsonl", chat_lines);
    const auto chat = run_command(prepare(dir, dir / "chat.jsonl", "chat"));
    ASSERT_EQ(chat.exit_code, 0) << chat.output;
    Expected expected_chat{*tokenizer};
    for (const nlohmann::json& messages : chats)
        expected_chat.chat(messages);
    expect_stream(read_prepared(dir.path() / "out", "chat"), expected_chat.stream);

    // --loss-on all: no mask, the record's text joined as one document (as Parquet's always was).
    const auto all = run_command(prepare(dir, dir / "qa.jsonl", "all", " --loss-on all"));
    ASSERT_EQ(all.exit_code, 0) << all.output;
    const Prepared joined = read_prepared(dir.path() / "out", "all");
    EXPECT_FALSE(joined.has_mask);
    std::vector<std::int32_t> whole;
    for (const auto& [p, r] : pairs) {
        whole.push_back(*tokenizer->eot_id());
        const auto ids = tokenizer->encode(p + "\n\n" + r, EotInText::Token);
        whole.insert(whole.end(), ids.begin(), ids.end());
    }
    EXPECT_EQ(joined.tokens, whole);
}

TEST(PrepareLossMask, ParquetPromptResponseAndChat) {
    const ScratchDir dir("gpt2-mask-parquet");
    const auto tokenizer = load_gpt2_tokenizer(kGpt2Dir);
    const fs::path data = fs::path(GPT2_TEST_DATA_DIR) / "parquet";
    for (const std::string name : {"duckdb_prompt_response", "duckdb_chat"}) {
        const auto result = run_command(prepare(dir, (data / (name + ".parquet")).string(), name));
        ASSERT_EQ(result.exit_code, 0) << result.output;
        Expected expected{*tokenizer};
        std::ifstream rows(data / (name + ".expected.jsonl"));
        int count = 0;
        for (std::string line; std::getline(rows, line); ++count) {
            const nlohmann::json row = nlohmann::json::parse(line);
            if (row.contains("messages")) {
                expected.chat(row["messages"]);
            } else {
                expected.prompt_response(row["prompt"], row["response"]);
            }
        }
        ASSERT_GT(count, 1) << name;
        expect_stream(read_prepared(dir.path() / "out", name), expected.stream);
    }
}

TEST(PrepareLossMask, RefusesPlainTextForTheResponseOnly) {
    const ScratchDir dir("gpt2-mask-refuse");
    write_bytes(dir.path() / "plain.txt", "Just some text.\n");
    const auto text = run_command(prepare(dir, dir / "plain.txt", "plain", " --loss-on response"));
    EXPECT_EQ(text.exit_code, 2) << text.output;
    EXPECT_EQ(text.output, "error: --loss-on response: " + (dir / "plain.txt") +
                               " is plain text, which has no response to train (prompt/response "
                               "and chat records come in .jsonl and .parquet files); --loss-on "
                               "all trains on every token\n");
    // A text record among prompt/response ones.
    write_bytes(dir.path() / "mixed.jsonl",
                "{\"prompt\": \"a\", \"response\": \"b\"}\n{\"text\": \"plain\"}\n");
    const auto mixed = run_command(prepare(dir, dir / "mixed.jsonl", "mixed"));
    EXPECT_EQ(mixed.exit_code, 1) << mixed.output;
    EXPECT_NE(mixed.output.find("\nerror: " + (dir / "mixed.jsonl") + ":2: a plain text document"),
              std::string::npos)
        << mixed.output;
    EXPECT_EQ(mixed.output.find("error:"), mixed.output.rfind("error:")) << mixed.output;
    // Plain text alone keeps its default: every token, no mask.
    const auto plain = run_command(prepare(dir, dir / "plain.txt", "plain"));
    ASSERT_EQ(plain.exit_code, 0) << plain.output;
    EXPECT_FALSE(read_prepared(dir.path() / "out", "plain").has_mask);
}

// ---- train_gpt2 -------------------------------------------------------------------------------

const std::string kTrainFlags = test::small_model(16) +
                                " --lr 1e-3 --warmup-steps 2 --eps 1e-5 --val-every 3"
                                " --sample-every 0 --seed 5 --val-tokens 64";

// prompt/response JSON Lines prepared with the char tokenizer into dir/out (masked shards).
void prepare_char_corpus(const ScratchDir& dir) {
    std::string jsonl;
    for (int i = 0; i < 120; ++i) {
        const int a = (i * 7) % 50, b = (i * 13) % 40;
        jsonl += nlohmann::json{{"prompt", "What is " + std::to_string(a) + " plus " +
                                               std::to_string(b) + "?"},
                                {"response", std::to_string(a + b) + "."}}
                     .dump() +
                 "\n";
    }
    write_bytes(dir.path() / "qa.jsonl", jsonl);
    const auto result =
        run_command(test::build_path("prepare_data") + " --data " + (dir / "qa.jsonl") +
                    " --tokenizer char --out-dir " + (dir / "out") + " --name qa 2>&1");
    ASSERT_EQ(result.exit_code, 0) << result.output;
    ASSERT_TRUE(fs::exists(dir.path() / "out" / "qa_train_000000.bin.mask"));
    ASSERT_TRUE(fs::exists(dir.path() / "out" / "qa_val_000000.bin.mask"));
}

std::string train_command(const ScratchDir& dir, int ranks, const std::string& name,
                          const std::string& extra) {
    return mpiexec(ranks) + test::build_path("train_gpt2") + kTrainFlags + " --train-data " +
           (dir / "out/qa_train_*.bin") + " --val-data " + (dir / "out/qa_val_*.bin") +
           " --out-dir " + (dir / name) + " --metrics-file " + (dir / (name + ".jsonl")) + " " +
           extra + " 2>&1";
}

std::string train(const ScratchDir& dir, int ranks, const std::string& name,
                  const std::string& extra) {
    const auto result = run_command(train_command(dir, ranks, name, extra));
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return result.output;
}

std::vector<float> params_of(const ScratchDir& dir, const std::string& name, int step) {
    char file[32];
    std::snprintf(file, sizeof(file), "model_%06d.bin", step);
    const LoadedModel loaded = load_checkpoint(dir.path() / name / file);
    return {loaded.model.params.span().begin(), loaded.model.params.span().end()};
}

// 1 and 2 workers, 1 and 2 ranks train alike on masked shards (at the tolerance the unmasked
// split tests use), the loss covers only the trained targets (unlike the same shards without their
// masks), each step logs its trained tokens, and a run stopped at step 3 resumes bitwise.
TEST(TrainLossMask, SameTrainingForWorkersAndRanksAndResumesBitwise) {
    const ScratchDir dir("gpt2-mask-train");
    prepare_char_corpus(dir);
    const std::string six = "--max-steps 6 --batch-size 4 --checkpoint-every 3";
    const std::string one = train(dir, 1, "w1", six + " --threads 1");
    train(dir, 1, "w2", six + " --threads 2");
    train(dir, 2, "np2", "--max-steps 6 --batch-size 2 --checkpoint-every 3 --threads 1");
    EXPECT_NE(one.find("loss mask: 2 .mask files beside the shards"), std::string::npos) << one;
    const std::vector<nlohmann::json> steps = test::metrics_records(dir / "w1.jsonl", "train");
    ASSERT_EQ(steps.size(), 6u);
    for (const nlohmann::json& step : steps) {
        const std::int64_t trained = step["trained_tokens"];
        EXPECT_GT(trained, 0);
        EXPECT_LT(trained, 4 * 16);  // the prompts are left out
        EXPECT_NE(one.find("step " + std::to_string(step["step"].get<int>()) + "/6 | loss "),
                  std::string::npos);
        EXPECT_NE(one.find(" | trained " + std::to_string(trained) + " of 64 tok | "),
                  std::string::npos)
            << one;
    }
    EXPECT_NE(one.find("trained tokens) |"), std::string::npos) << one;  // the val line
    const std::vector<double> a = test::metrics_values(dir / "w1.jsonl", "train", "loss");
    const std::vector<float> reference = params_of(dir, "w1", 6);
    const LoadedModel config = load_checkpoint(dir.path() / "w1" / "model_000006.bin");
    for (const std::string name : {"w2", "np2"}) {
        const std::vector<double> b =
            test::metrics_values(dir / (name + ".jsonl"), "train", "loss");
        ASSERT_EQ(b.size(), a.size()) << name;
        for (std::size_t s = 0; s < a.size(); ++s)
            EXPECT_NEAR(b[s], a[s], 1e-5 * a[s]) << name << " step " << s + 1;
        EXPECT_TRUE(test::same_training(config.model.config, params_of(dir, name, 6), reference,
                                        1e-5, 1e-2))
            << name;
    }
    // Without the masks the same shards train on every token: other losses.
    fs::create_directories(dir.path() / "bare");
    for (const char* file : {"qa_train_000000.bin", "qa_val_000000.bin", "tokenizer.bin"})
        fs::copy_file(dir.path() / "out" / file, dir.path() / "bare" / file);
    const auto bare =
        run_command(mpiexec(1) + test::build_path("train_gpt2") + kTrainFlags + " --train-data " +
                    (dir / "bare/qa_train_*.bin") + " --val-data " + (dir / "bare/qa_val_*.bin") +
                    " --out-dir " + (dir / "bare_run") + " --metrics-file " + (dir / "bare.jsonl") +
                    " --max-steps 1 --batch-size 4 --threads 1 2>&1");
    ASSERT_EQ(bare.exit_code, 0) << bare.output;
    EXPECT_GT(std::abs(test::metrics_values(dir / "bare.jsonl", "train", "loss")[0] - a[0]), 1e-3);
    // Stopped at step 3 and resumed: bitwise the straight run.
    train(dir, 1, "resumed", "--max-steps 3 --lr-decay-steps 6 --batch-size 4 --threads 2");
    train(dir, 1, "resumed", six + " --threads 2 --resume auto");
    EXPECT_EQ(params_of(dir, "resumed", 6), params_of(dir, "w2", 6));
}

// A step whose windows hold no trained target is skipped, saying why, on every rank alike; the run
// goes on, its weights finite; the skipped step is not a fault (--max-bad-steps 1 still runs).
TEST(TrainLossMask, AStepWithNoTrainedTargetIsSkippedAndBreaksNothing) {
    const ScratchDir dir("gpt2-mask-empty");
    prepare_char_corpus(dir);
    // Step 1's windows (unshuffled: windows 0..3, tokens 0..64) trained nowhere.
    const fs::path shard = dir.path() / "out" / "qa_train_000000.bin";
    const MappedShard tokens(shard);
    std::vector<std::uint8_t> mask;
    {
        const MappedShardMask mapped(mask_path(shard), tokens.tokens().size());
        mask.assign(mapped.mask().begin(), mapped.mask().end());
    }
    std::fill(mask.begin(), mask.begin() + 4 * 16 + 1, std::uint8_t{0});
    write_shard_mask(mask_path(shard), mask);
    for (const int ranks : {1, 2}) {
        const std::string name = "np" + std::to_string(ranks);
        const std::string output =
            train(dir, ranks, name,
                  "--max-steps 3 --no-shuffle --max-bad-steps 1 --threads 1 --batch-size " +
                      std::to_string(4 / ranks));
        EXPECT_NE(output.find("step 1: the loss mask trains no target in the step's 4 sequences "
                              "(all prompt): nothing to learn, update skipped"),
                  std::string::npos)
            << output;
        const std::vector<nlohmann::json> steps =
            test::metrics_records(dir / (name + ".jsonl"), "train");
        ASSERT_EQ(steps.size(), 3u);
        EXPECT_EQ(steps[0]["skipped"], true);
        EXPECT_EQ(steps[0]["trained_tokens"], 0);
        EXPECT_EQ(steps[1]["skipped"], false);
        EXPECT_TRUE(std::isfinite(steps[2]["loss"].get<double>()));
        const std::vector<float> params = params_of(dir, name, 3);
        EXPECT_TRUE(
            std::all_of(params.begin(), params.end(), [](float p) { return std::isfinite(p); }));
    }
    EXPECT_EQ(params_of(dir, "np1", 3).size(), params_of(dir, "np2", 3).size());
}

// Masks on some shards only, or a mask whose count is not its shard's: one error naming the file.
TEST(TrainLossMask, RefusesMissingAndMismatchedMasks) {
    const ScratchDir dir("gpt2-mask-mismatch");
    prepare_char_corpus(dir);
    const fs::path val_mask = dir.path() / "out" / "qa_val_000000.bin.mask";
    fs::remove(val_mask);
    const auto missing = run_command(train_command(dir, 1, "missing", "--max-steps 1"));
    EXPECT_EQ(missing.exit_code, 1) << missing.output;
    EXPECT_NE(missing.output.find("error: " + val_mask.string() +
                                  ": missing, but other shards have a loss mask"),
              std::string::npos)
        << missing.output;
    // One mask byte short of its shard.
    const MappedShard val(dir.path() / "out" / "qa_val_000000.bin");
    write_shard_mask(val_mask, std::vector<std::uint8_t>(val.tokens().size() - 1, 1));
    const auto mismatch = run_command(train_command(dir, 1, "mismatch", "--max-steps 1"));
    EXPECT_EQ(mismatch.exit_code, 1) << mismatch.output;
    EXPECT_NE(
        mismatch.output.find("error: " + val_mask.string() + ": the mask has " +
                             std::to_string(val.tokens().size() - 1) +
                             " tokens but its shard has " + std::to_string(val.tokens().size())),
        std::string::npos)
        << mismatch.output;
}

}  // namespace
}  // namespace gpt2
