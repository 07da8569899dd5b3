// The server's generation engine: one thread owns the model's decoding sessions (one KV cache
// per sequence slot, `parallel` of them) and advances every active sequence a token per round,
// their steps taken together (KvCacheSession::step_together: each chunk of weights read once for
// all of them); a new request's prompt is prefilled as matrix products and it joins at the next
// round; a finished, cancelled or abandoned one leaves at once. HTTP threads submit and read a
// Job's events; nothing else touches the sessions.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "model/decode_weights.hpp"
#include "model/kv_cache.hpp"
#include "model/model.hpp"
#include "serve/requests.hpp"
#include "threads/thread_pool.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2::serve {

// One token as the client sees it: its bytes (raw; the text of a completion is made valid UTF-8
// separately), its log-probability under the model (no temperature) and the top alternatives.
struct TopToken {
    std::int32_t id = 0;
    std::string bytes;
    float logprob = 0.0f;
};
struct TokenInfo {
    std::int32_t id = 0;
    std::string bytes;
    std::optional<float> logprob;  // none for a prompt's first token
    std::vector<TopToken> top;     // the likeliest first
};

// What a Job has produced so far; the engine appends, the reader takes.
struct JobEvents {
    std::string text;               // new completion text (valid UTF-8, stop strings held back)
    std::vector<TokenInfo> tokens;  // new tokens (echoed prompt tokens first), with logprobs
    bool done = false;
    std::string finish_reason;  // "stop" or "length", once done
    std::string error;          // set when the engine failed the job
    int prompt_tokens = 0;
    int completion_tokens = 0;
};

class Job {
  public:
    explicit Job(Generation g) : generation(std::move(g)) {}
    const Generation generation;
    // Waits until there is something new or the job is done, and takes it (blocking reader).
    [[nodiscard]] JobEvents take();
    // The client is gone or the server stops: the engine drops the job at its next round.
    void cancel() { cancelled_.store(true); }
    [[nodiscard]] bool cancelled() const { return cancelled_.load(); }

  private:
    friend class Engine;
    void publish(const JobEvents& more);
    std::mutex mutex_;
    std::condition_variable changed_;
    JobEvents pending_;
    bool finished_ = false;
    std::atomic<bool> cancelled_{false};
};

struct EngineOptions {
    int threads = 1;
    int parallel = 4;  // sequences decoded at once
    int context = 0;   // positions per sequence (0: the model's maxT)
    WeightFormat weights = WeightFormat::Fp32;
};

// Counters for /metrics.
struct EngineStats {
    std::uint64_t prompt_tokens = 0;
    std::uint64_t generated_tokens = 0;
    std::uint64_t jobs_done = 0;
    std::size_t queued = 0;
    std::size_t active = 0;
    double decode_seconds = 0.0;  // time spent in rounds that decoded tokens
};

class Engine {
  public:
    Engine(const Model& model, const Tokenizer& tokenizer, const EngineOptions& options);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // Queues a sequence; its events come through the returned Job. Throws std::runtime_error
    // once the engine stops accepting.
    [[nodiscard]] std::shared_ptr<Job> submit(Generation generation);
    // Stops accepting; the jobs in flight run to their end until `grace_seconds` have passed,
    // then the rest are cancelled. Returns once the engine's thread has ended.
    void drain(double grace_seconds);
    [[nodiscard]] EngineStats stats() const;
    [[nodiscard]] int context() const { return context_; }
    [[nodiscard]] int threads() const { return static_cast<int>(pool_.size()); }
    [[nodiscard]] std::size_t memory_bytes() const;

  private:
    struct Active;  // a job in a slot, with its session and sampling state
    void loop();
    void start(Active& a);
    void advance(Active& a);
    void finish(Active& a, const std::string& reason);

    const Model& model_;
    const Tokenizer& tokenizer_;
    int context_;
    ThreadPool pool_;
    std::unique_ptr<DecodeWeights> compact_;
    // One prompt scratch and pool for every slot; a slot's sequence is its session (its cache).
    std::unique_ptr<Generator> generator_;
    std::vector<std::unique_ptr<KvCacheSession>> sessions_;
    std::vector<std::unique_ptr<Active>> slots_;  // null: free

    mutable std::mutex mutex_;
    std::condition_variable wake_;
    std::deque<std::shared_ptr<Job>> queue_;
    bool accepting_ = true;
    bool stopping_ = false;
    EngineStats stats_;
    std::thread thread_;
};

}  // namespace gpt2::serve
