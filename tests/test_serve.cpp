// build/serve as a client sees it, over loopback: completions equal to the library's generation
// (greedy and seeded, streamed or not), echoed prompts' log-probabilities equal to the training
// forward's, chat laid out with the training chat template, errors as OpenAI's error object naming
// the field, the API key, many clients at once with disconnects among them, metrics, and SIGTERM
// finishing what is in flight and exiting 0.
#include <gtest/gtest.h>
#include <httplib.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/file_io.hpp"
#include "core/random.hpp"
#include "data/chat_template.hpp"
#include "data/multiple_choice.hpp"
#include "formats/checkpoint.hpp"
#include "model/forward_backward.hpp"
#include "model/kv_cache.hpp"
#include "model/training_context.hpp"
#include "process_support.hpp"
#include "random_model.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const std::string kCorpus = "To be, or not to be: that is the question.\nuser: assistant:\n";

// A running build/serve: started by the constructor (port chosen by the system, read from its
// log), SIGTERM and waited for by the destructor unless a test did that itself.
class ServeProcess {
  public:
    ServeProcess(const fs::path& dir, const std::string& name, const std::string& flags)
        : log_(dir / (name + ".log")),
          exit_(dir / (name + ".exit")),
          pid_file_(dir / (name + ".pid")) {
        const std::string command = test::build_path("serve") + " " + flags + " --port 0";
        const auto started =
            test::run_command("sh -c '" + command + " > " + log_.string() +
                              " 2>&1 & pid=$!; echo $pid > " + pid_file_.string() +
                              "; wait $pid; echo $? > " + exit_.string() + "' > /dev/null 2>&1 &");
        EXPECT_EQ(started.exit_code, 0);
        for (int i = 0; i < 1200 && port_ == 0; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            const std::string text = read_log();
            const auto at = text.find("on http://127.0.0.1:");
            if (at != std::string::npos) port_ = std::stoi(text.substr(at + 20));
            if (fs::exists(exit_)) break;
        }
        std::ifstream(pid_file_) >> pid_;
    }
    ~ServeProcess() {
        if (!stopped_) (void)stop();
    }
    // SIGTERM, then the exit code (-1 if it did not end within a minute).
    int stop() {
        stopped_ = true;
        if (pid_ > 0) ::kill(pid_, SIGTERM);
        for (int i = 0; i < 1200; ++i) {
            if (fs::exists(exit_) && fs::file_size(exit_) > 0) {
                int code = -1;
                std::ifstream(exit_) >> code;
                return code;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        return -1;
    }
    [[nodiscard]] int port() const { return port_; }
    // The server's resident set in KiB (/proc), 0 if unknown.
    [[nodiscard]] long rss_kib() const {
        std::ifstream status("/proc/" + std::to_string(pid_) + "/status");
        for (std::string line; std::getline(status, line);) {
            if (line.starts_with("VmRSS:")) return std::stol(line.substr(6));
        }
        return 0;
    }
    [[nodiscard]] std::string read_log() const {
        std::ifstream in(log_);
        return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    }
    [[nodiscard]] httplib::Client client() const {
        httplib::Client c("127.0.0.1", port_);
        c.set_read_timeout(60, 0);
        return c;
    }

  private:
    fs::path log_, exit_, pid_file_;
    int port_ = 0;
    pid_t pid_ = 0;
    bool stopped_ = false;
};

class Serve : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = std::make_unique<test::ScratchDir>("gpt2-test-serve");
        tokenizer_ = make_char_tokenizer(kCorpus);
        ModelConfig c = test::small_config(64);
        c.vocab_size = tokenizer_->vocab_size();
        c.padded_vocab_size = pad_vocab(c.vocab_size);
        model_ = test::random_model(c, 77, 1.0f);
        save_checkpoint(model_file(), *model_, CheckpointExtras{tokenizer_->serialize(), "{}"});
        server_ = std::make_unique<ServeProcess>(dir_->path(), "main",
                                                 model_file() + " --threads 1 --parallel 4");
        ASSERT_GT(server_->port(), 0) << server_->read_log();
    }
    static void TearDownTestSuite() {
        if (server_) {
            EXPECT_EQ(server_->stop(), 0) << server_->read_log();
        }
        server_.reset();
        dir_.reset();
    }
    static std::string model_file() { return (dir_->path() / "model.bin").string(); }

    static httplib::Result post(const std::string& route, const json& body) {
        static thread_local std::unique_ptr<httplib::Client> client;
        client = std::make_unique<httplib::Client>(server_->client());
        return client->Post(route, body.dump(), "application/json");
    }
    // The completion text the library makes: generate_kv from the prompt, with the seed's stream.
    static std::string library_text(const std::string& prompt, int count, float temperature,
                                    std::uint64_t seed) {
        ThreadPool pool(1);
        KvCacheSession session(*model_, pool);
        std::vector<std::int32_t> tokens = tokenizer_->encode(prompt);
        const std::size_t n = tokens.size();
        Rng rng = Rng::derived(seed, 0, 0);
        (void)generate_kv(session, tokens, count, SamplingParams{temperature, 0, 1.0f, 1.0f}, rng,
                          {}, tokenizer_->vocab_size());
        return tokenizer_->decode(std::span(tokens).subspan(n));
    }

    static inline std::unique_ptr<test::ScratchDir> dir_;
    static inline std::unique_ptr<Tokenizer> tokenizer_;
    static inline std::unique_ptr<Model> model_;
    static inline std::unique_ptr<ServeProcess> server_;
};

// The text of a streamed completion, from its server-sent events, with its finish reason.
std::pair<std::string, std::string> streamed_text(const std::string& body, bool chat) {
    std::string text, reason;
    std::size_t at = 0;
    bool done = false;
    while ((at = body.find("data: ", at)) != std::string::npos) {
        const std::size_t end = body.find("\n\n", at);
        const std::string data = body.substr(at + 6, end - at - 6);
        at = end;
        if (data == "[DONE]") {
            done = true;
            continue;
        }
        const json chunk = json::parse(data);
        if (chunk["choices"].empty()) continue;
        const json& c = chunk["choices"][0];
        if (chat) {
            if (c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
        } else {
            text += c["text"].get<std::string>();
        }
        if (!c["finish_reason"].is_null()) reason = c["finish_reason"];
    }
    EXPECT_TRUE(done) << body;
    return {text, reason};
}

// POSTs `body` to /v1/completions, handing what arrives to `receiver` as it comes (which may
// return false to hang up).
void post_streaming(httplib::Client& client, const json& body,
                    httplib::ContentReceiverWithProgress receiver) {
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = std::move(receiver);
    httplib::Response res;
    httplib::Error error = httplib::Error::Success;
    (void)client.send(req, res, error);
}

// Reads the first chunk of a streamed completion and hangs up.
void hang_up_after_first_chunk(httplib::Client& client, const json& body) {
    post_streaming(client, body,
                   [](const char*, std::size_t, std::uint64_t, std::uint64_t) { return false; });
}

TEST_F(Serve, ACompletionIsTheLibrarysGenerationStreamedOrNot) {
    for (const float temperature : {0.0f, 0.9f}) {
        const std::string expected = library_text("To be", 20, temperature, 1234);
        const json request{
            {"prompt", "To be"}, {"max_tokens", 20}, {"temperature", temperature}, {"seed", 1234}};
        const auto whole = post("/v1/completions", request);
        ASSERT_TRUE(whole);
        ASSERT_EQ(whole->status, 200) << whole->body;
        const json body = json::parse(whole->body);
        EXPECT_EQ(body["object"], "text_completion");
        EXPECT_EQ(body["choices"][0]["text"], expected) << temperature;
        EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
        EXPECT_EQ(body["usage"]["prompt_tokens"], 5);
        EXPECT_EQ(body["usage"]["completion_tokens"], 20);
        json streaming = request;
        streaming["stream"] = true;
        const auto stream = post("/v1/completions", streaming);
        ASSERT_TRUE(stream);
        ASSERT_EQ(stream->status, 200) << stream->body;
        EXPECT_EQ(stream->get_header_value("Content-Type"), "text/event-stream");
        EXPECT_EQ(streamed_text(stream->body, false),
                  std::make_pair(expected, std::string("length")));
    }
}

// lm-evaluation-harness's loglikelihood request: token ids, echo, max_tokens 0, logprobs. Each
// prompt token's log-probability is the training forward's -loss for it. The decode path sums
// the same C = 64 products per logit in another order (matrix-vector against GEMM): fp32 rounding
// of |logit| <= ~10 over a few hundred operations in each of 2 layers bounds the difference by
// about 64 * 2^-24 * 10 * (a few) ~ 1e-4; the log-sum-exp adds no more than the largest logit's
// (measured: 2.4e-7, one ulp at 3).
TEST_F(Serve, EchoedLogprobsAreTheTrainingForwardsPerTokenLosses) {
    const std::vector<std::int32_t> ids = tokenizer_->encode("To be, or not to be: that is");
    const auto result = post("/v1/completions", json{{"prompt", ids},
                                                     {"max_tokens", 0},
                                                     {"echo", true},
                                                     {"logprobs", 1},
                                                     {"temperature", 0}});
    ASSERT_TRUE(result);
    ASSERT_EQ(result->status, 200) << result->body;
    const json lp = json::parse(result->body)["choices"][0]["logprobs"];
    ASSERT_EQ(lp["token_logprobs"].size(), ids.size());
    EXPECT_TRUE(lp["token_logprobs"][0].is_null());

    const int T = static_cast<int>(ids.size()) - 1;
    ThreadLocalTrainingContext ctx(model_->config, 1, T);
    const std::vector<std::int32_t> inputs(ids.begin(), ids.end() - 1);
    const std::vector<std::int32_t> targets(ids.begin() + 1, ids.end());
    (void)forward_loss(*model_, ctx, TokenBatch{inputs, targets, 1, T});
    for (int t = 0; t < T; ++t) {
        const double expected = -static_cast<double>(ctx.acts.losses[static_cast<std::size_t>(t)]);
        EXPECT_NEAR(lp["token_logprobs"][t + 1].get<double>(), expected, 1e-4) << t;
        // The top alternative is at least as likely as the token itself.
        ASSERT_EQ(lp["top_logprobs"][t + 1].size(), 1u);
        EXPECT_GE(lp["top_logprobs"][t + 1].begin().value().get<double>() + 1e-6,
                  lp["token_logprobs"][t + 1].get<double>());
    }
    EXPECT_EQ(lp["tokens"][0], "T");
    EXPECT_EQ(lp["text_offset"][1], 1);
    EXPECT_EQ(json::parse(result->body)["choices"][0]["text"], "To be, or not to be: that is");
}

TEST_F(Serve, ChatIsLaidOutWithTheTrainingTemplateAndEndsAtTheTurn) {
    const std::vector<ChatMessage> conversation{{"user", "To be"}};
    const auto result =
        post("/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "To be"}}}},
                                          {"max_tokens", 30},
                                          {"temperature", 0}});
    ASSERT_TRUE(result);
    ASSERT_EQ(result->status, 200) << result->body;
    const json body = json::parse(result->body);
    EXPECT_EQ(body["object"], "chat.completion");
    EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
    // The greedy continuation of the template's text, cut at the first turn end.
    std::string expected = library_text(chat_prompt(conversation), 30, 0.0f, 0);
    std::string reason = "length";
    for (const std::string& end : chat_turn_ends()) {
        if (const auto at = expected.find(end); at != std::string::npos) {
            expected = expected.substr(0, at);
            reason = "stop";
        }
    }
    EXPECT_EQ(body["choices"][0]["message"]["content"], expected);
    EXPECT_EQ(body["choices"][0]["finish_reason"], reason);
    const auto stream =
        post("/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "To be"}}}},
                                          {"max_tokens", 30},
                                          {"temperature", 0},
                                          {"stream", true}});
    ASSERT_TRUE(stream);
    EXPECT_EQ(streamed_text(stream->body, true).first, expected);
}

TEST_F(Serve, BadRequestsAreA400NamingTheFieldAndNeverACrash) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"{\"prompt\": ", ""},
        {"[1, 2]", ""},
        {R"({"prompt": "To", "max_tokens": "ten"})", "max_tokens"},
        {R"({"prompt": "To", "temperature": -1})", "temperature"},
        {R"({"prompt": 7})", "prompt"},
        {R"({"prompt": [1, 2, 100000]})", "prompt"},
        {R"({"prompt": "To", "n": 2})", "n"},
        {R"({"prompt": "To", "stop": ["a", "b", "c", "d", "e"]})", "stop"},
        {R"({"prompt": "To", "bogus": 1})", "bogus"},
        {R"({"prompt": "To", "max_tokens": 0})", "max_tokens"},
        {R"({"max_tokens": 3})", "prompt"},
        {std::string(R"({"prompt": ")") + std::string(100, 'o') + "\"}", "prompt"},
        {std::string(40, '[') + std::string(40, ']'), ""},
    };
    httplib::Client client = server_->client();
    for (const auto& [body, field] : cases) {
        const auto r = client.Post("/v1/completions", body, "application/json");
        ASSERT_TRUE(r) << body;
        EXPECT_EQ(r->status, 400) << body << "\n" << r->body;
        const json error = json::parse(r->body)["error"];
        EXPECT_EQ(error["type"], "invalid_request_error") << body;
        EXPECT_EQ(error["param"], field.empty() ? json(nullptr) : json(field)) << body;
        EXPECT_FALSE(error["message"].get<std::string>().empty());
    }
    const auto chat =
        client.Post("/v1/chat/completions", R"({"messages": [{"role": "robot", "content": "hi"}]})",
                    "application/json");
    ASSERT_TRUE(chat);
    EXPECT_EQ(chat->status, 400);
    EXPECT_EQ(json::parse(chat->body)["error"]["param"], "messages.role");
    const auto health = client.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);
    EXPECT_EQ(client.Get("/nowhere")->status, 404);
}

// Sixteen clients at once on four slots, a third of them hanging up mid-stream: every finished
// one gets the library's text, the hung-up ones free their slots, and the counters add up.
TEST_F(Serve, ManyClientsAtOnceWithDisconnectsAmongThem) {
    const std::string expected = library_text("To be", 40, 0.0f, 0);
    std::vector<std::thread> clients;
    std::vector<std::string> texts(16);
    for (int i = 0; i < 16; ++i) {
        clients.emplace_back([&, i] {
            httplib::Client client = server_->client();
            const json request{
                {"prompt", "To be"}, {"max_tokens", 40}, {"temperature", 0}, {"stream", true}};
            if (i % 3 == 2) {
                hang_up_after_first_chunk(client, request);
                return;
            }
            const auto r = client.Post("/v1/completions", request.dump(), "application/json");
            if (r && r->status == 200) texts[i] = streamed_text(r->body, false).first;
        });
    }
    for (auto& t : clients)
        t.join();
    for (int i = 0; i < 16; ++i) {
        if (i % 3 != 2) {
            EXPECT_EQ(texts[i], expected) << i;
        }
    }
    // Every sequence leaves its slot: none active, none queued, once the engine has noticed.
    std::string metrics;
    for (int i = 0; i < 200; ++i) {
        metrics = server_->client().Get("/metrics")->body;
        if (metrics.find("gpt2_active_sequences 0\n") != std::string::npos &&
            metrics.find("gpt2_queue_length 0\n") != std::string::npos)
            break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_NE(metrics.find("gpt2_active_sequences 0\n"), std::string::npos) << metrics;
    EXPECT_NE(metrics.find("# TYPE gpt2_generated_tokens_total counter"), std::string::npos);
    const auto after =
        post("/v1/completions", json{{"prompt", "To be"}, {"max_tokens", 40}, {"temperature", 0}});
    ASSERT_TRUE(after);
    EXPECT_EQ(json::parse(after->body)["choices"][0]["text"], expected);
}

// Hundreds of requests from a dozen clients at once, malformed ones and hang-ups mixed in: every
// valid request succeeds with the library's text, every malformed one is a 400, and the resident
// set stays flat (a leak of a few KiB a request would show over 300).
TEST_F(Serve, ABoundedLoadTestWithBadRequestsAndHangUpsLosesNothing) {
    const std::string expected = library_text("To be", 12, 0.0f, 0);
    const json valid{{"prompt", "To be"}, {"max_tokens", 12}, {"temperature", 0}};
    const auto one = [&](int i, int& ok, int& refused, int& failed) {
        httplib::Client client = server_->client();
        if (i % 5 == 0) {
            const auto r = client.Post("/v1/completions", R"({"prompt": "To", "max_tokens": -3})",
                                       "application/json");
            (r && r->status == 400 ? refused : failed) += 1;
        } else if (i % 5 == 1) {
            json streaming = valid;
            streaming["stream"] = true;
            hang_up_after_first_chunk(client, streaming);
        } else {
            json request = valid;
            if (i % 2 == 0) request["stream"] = true;
            const auto r = client.Post("/v1/completions", request.dump(), "application/json");
            const bool good =
                r && r->status == 200 &&
                (i % 2 == 0
                     ? streamed_text(r->body, false).first
                     : json::parse(r->body)["choices"][0]["text"].get<std::string>()) == expected;
            (good ? ok : failed) += 1;
        }
    };
    const auto round = [&](int requests) {
        std::vector<std::thread> clients;
        std::vector<std::array<int, 3>> counts(12);
        for (int c = 0; c < 12; ++c) {
            clients.emplace_back([&, c] {
                for (int i = c; i < requests; i += 12)
                    one(i, counts[c][0], counts[c][1], counts[c][2]);
            });
        }
        for (auto& t : clients)
            t.join();
        std::array<int, 3> total{};
        for (const auto& c : counts) {
            for (int k = 0; k < 3; ++k)
                total[k] += c[k];
        }
        return total;
    };
    (void)round(60);  // warm-up: the server's pools and caches reach their size
    const long before = server_->rss_kib();
    const std::array<int, 3> total = round(300);
    const long after = server_->rss_kib();
    EXPECT_EQ(total[2], 0) << "failed requests";
    EXPECT_EQ(total[0], 180);
    EXPECT_EQ(total[1], 60);
#ifndef GPT2_SANITIZER_BUILD  // a sanitizer's quarantine grows the resident set by design
    EXPECT_LT(after - before, 4096) << before << " KiB before, " << after << " KiB after";
#endif
    EXPECT_GT(before, 0);
}

// lm-evaluation-harness's way through the API (dev/hellaswag_over_api.py: ids, echo, max_tokens 0,
// logprobs) scores a multiple-choice file as train_gpt2 --hellaswag scores it.
TEST_F(Serve, HellaSwagOverTheApiScoresAsTrainGpt2Does) {
    std::vector<MultipleChoiceExample> examples;
    Rng rng(5);
    const auto next = [&](int n) { return static_cast<std::int32_t>(rng.next_u64() % n); };
    const int V = tokenizer_->vocab_size();
    for (int i = 0; i < 30; ++i) {
        MultipleChoiceExample e;
        e.index = i;
        e.label = next(4);
        e.context.resize(static_cast<std::size_t>(3 + next(8)));
        for (auto& t : e.context)
            t = next(V);
        for (int k = 0; k < 4; ++k) {
            e.endings.emplace_back(static_cast<std::size_t>(1 + next(6)));
            for (auto& t : e.endings.back())
                t = next(V);
        }
        examples.push_back(std::move(e));
    }
    const fs::path file = dir_->path() / "eval.bin";
    write_multiple_choice_file(file, examples);
    std::string corpus;
    for (int i = 0; i < 300; ++i)
        corpus += kCorpus;
    std::ofstream(dir_->path() / "corpus.txt") << corpus;
    const auto trained = test::run_command(
        test::build_path("train_gpt2") + " --init-from " + model_file() +
        " --eval-only --seq-len 64 --batch-size 4 --threads 1 --val-tokens 256 --data " +
        (dir_->path() / "corpus.txt").string() + " --hellaswag " + file.string());
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
    const auto at = trained.output.find("hellaswag acc_norm ");
    ASSERT_NE(at, std::string::npos) << trained.output;
    const std::string expected = trained.output.substr(at, trained.output.find(')', at) - at + 1);
    const auto served = test::run_command(
        "/usr/bin/python3 " + std::string(GPT2_SOURCE_DIR) + "/dev/hellaswag_over_api.py --url " +
        "http://127.0.0.1:" + std::to_string(server_->port()) + " " + file.string());
    ASSERT_EQ(served.exit_code, 0) << served.output;
    EXPECT_EQ(served.output, expected + "\n") << trained.output;
    EXPECT_EQ(expected.find("(30/"), std::string::npos) << "a random model gets some wrong";
}

// The official `openai` npm client (GPT2_WITH_OPENAI_CLIENT=1 scripts/setup.sh installs it into
// .deps/openai): completion and chat, streamed and not, the model list, and a refusal it reads as
// an API error naming the field.
TEST_F(Serve, TheOpenaiNpmClientCompletesChatsAndStreams) {
    const fs::path module = fs::path(GPT2_SOURCE_DIR) / ".deps/openai/node_modules/openai";
    if (!fs::exists(module / "index.mjs") || test::run_command("command -v node").exit_code != 0) {
        GTEST_SKIP() << "the openai npm client is not installed (GPT2_WITH_OPENAI_CLIENT=1 "
                        "scripts/setup.sh)";
    }
    const auto run = test::run_command("node " + std::string(GPT2_SOURCE_DIR) +
                                       "/tests/clients/openai_client.mjs http://127.0.0.1:" +
                                       std::to_string(server_->port()) + " " + module.string());
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const json got = json::parse(run.output);
    const std::string completion = library_text("To be", 20, 0.0f, 0);
    EXPECT_EQ(got["model"], "model.bin");
    EXPECT_EQ(got["completion"], completion);
    EXPECT_EQ(got["streamedCompletion"], completion);
    EXPECT_EQ(got["chat"], got["streamedChat"]);
    EXPECT_FALSE(got["chat"].get<std::string>().empty());
    EXPECT_EQ(got["refused"], "400 n");
}

// The page at / in a real browser (headless Chromium, driven by dev/page_in_chromium.py through
// the DevTools protocol): the test types a prompt and clicks Generate, and the text the page
// streams is the API's greedy text.
TEST_F(Serve, ThePageInABrowserStreamsTheApisGreedyText) {
    if (test::run_command("command -v chromium").exit_code != 0 ||
        test::run_command("command -v /usr/bin/python3").exit_code != 0) {
        GTEST_SKIP() << "no chromium (apt-get install chromium) or /usr/bin/python3";
    }
    const auto run = test::run_command(
        "/usr/bin/python3 " + std::string(GPT2_SOURCE_DIR) + "/dev/page_in_chromium.py " +
        "http://127.0.0.1:" + std::to_string(server_->port()) + "/ 'To be' --max-tokens 30");
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const json page = json::parse(run.output.substr(run.output.find('{')));
    EXPECT_EQ(page["out"], "To be" + library_text("To be", 30, 0.0f, 0)) << run.output;
    EXPECT_TRUE(page["status"].get<std::string>().starts_with("done:")) << run.output;
}

// A client that stops reading mid-stream holds up no one: while it waits (its first chunk read,
// the rest left in the socket) another request runs to its end, then the slow one reads on and
// gets all of its text.
TEST_F(Serve, ASlowReaderDoesNotStallTheOthers) {
    const std::string expected = library_text("To be", 50, 0.0f, 0);
    std::atomic<bool> first_chunk{false}, other_done{false}, gave_up{false};
    std::string slow_body;
    std::thread slow([&] {
        httplib::Client client = server_->client();
        post_streaming(
            client,
            json{{"prompt", "To be"}, {"max_tokens", 50}, {"temperature", 0}, {"stream", true}},
            [&](const char* data, std::size_t size, std::uint64_t, std::uint64_t) {
                slow_body.append(data, size);
                if (!first_chunk.exchange(true)) {
                    // Stops reading until the other request is done (a minute at most).
                    for (int i = 0; i < 1200 && !other_done.load(); ++i)
                        std::this_thread::sleep_for(std::chrono::milliseconds(50));
                    gave_up = !other_done.load();
                }
                return true;
            });
    });
    for (int i = 0; i < 1200 && !first_chunk.load(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_TRUE(first_chunk.load());
    const auto other =
        post("/v1/completions", json{{"prompt", "To be"}, {"max_tokens", 50}, {"temperature", 0}});
    other_done = true;
    slow.join();
    ASSERT_TRUE(other);
    EXPECT_EQ(json::parse(other->body)["choices"][0]["text"], expected);
    EXPECT_FALSE(gave_up.load()) << "the other request waited for the slow reader";
    EXPECT_EQ(streamed_text(slow_body, false).first, expected);
}

TEST_F(Serve, TheApiKeyGuardsEveryRouteButHealth) {
    ServeProcess keyed(dir_->path(), "keyed", model_file() + " --threads 1 --api-key s3cret");
    ASSERT_GT(keyed.port(), 0) << keyed.read_log();
    httplib::Client client = keyed.client();
    const std::string request = R"({"prompt": "To", "max_tokens": 2})";
    const auto refused = client.Post("/v1/completions", request, "application/json");
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->status, 401);
    EXPECT_EQ(json::parse(refused->body)["error"]["code"], "invalid_api_key");
    EXPECT_EQ(client.Get("/v1/models")->status, 401);
    EXPECT_EQ(client.Get("/metrics")->status, 401);
    EXPECT_EQ(client.Get("/health")->status, 200);
    const auto allowed =
        client.Post("/v1/completions", httplib::Headers{{"Authorization", "Bearer s3cret"}},
                    request, "application/json");
    ASSERT_TRUE(allowed);
    EXPECT_EQ(allowed->status, 200) << allowed->body;
    EXPECT_EQ(keyed.stop(), 0) << keyed.read_log();
}

// SIGTERM with a long generation in flight: it finishes (within the grace period), the server
// takes no new request, and exits 0.
TEST_F(Serve, SigtermFinishesWhatIsInFlightAndExitsZero) {
    ServeProcess server(dir_->path(), "term", model_file() + " --threads 1 --ctx 64");
    ASSERT_GT(server.port(), 0) << server.read_log();
    std::string text;
    std::thread client([&] {
        httplib::Client c = server.client();
        const auto r = c.Post("/v1/completions",
                              json{{"prompt", "To"}, {"max_tokens", 60}, {"temperature", 0}}.dump(),
                              "application/json");
        if (r && r->status == 200) text = json::parse(r->body)["choices"][0]["text"];
    });
    for (int i = 0; i < 200; ++i) {
        const auto m = server.client().Get("/metrics");
        if (m && m->body.find("gpt2_active_sequences 1\n") != std::string::npos) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(server.stop(), 0) << server.read_log();
    client.join();
    EXPECT_EQ(text, library_text("To", 60, 0.0f, 0).substr(0, 62));
    EXPECT_NE(server.read_log().find("SIGTERM: finishing the requests in flight"),
              std::string::npos)
        << server.read_log();
}

}  // namespace
}  // namespace gpt2
