#include "serve/engine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "core/clock.hpp"
#include "core/random.hpp"
#include "core/stop_text.hpp"
#include "core/utf8.hpp"
#include "model/sampling.hpp"

namespace gpt2::serve {

JobEvents Job::take() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock,
                  [&] { return finished_ || !pending_.text.empty() || !pending_.tokens.empty(); });
    JobEvents out = std::move(pending_);
    pending_ = JobEvents{};
    pending_.prompt_tokens = out.prompt_tokens;
    pending_.completion_tokens = out.completion_tokens;
    if (finished_) {
        out.done = true;
        pending_.done = true;
        pending_.finish_reason = out.finish_reason;
        pending_.error = out.error;
    }
    return out;
}

void Job::publish(const JobEvents& more) {
    {
        const std::lock_guard lock(mutex_);
        pending_.text += more.text;
        pending_.tokens.insert(pending_.tokens.end(), more.tokens.begin(), more.tokens.end());
        pending_.prompt_tokens = more.prompt_tokens;
        pending_.completion_tokens = more.completion_tokens;
        if (more.done) {
            finished_ = true;
            pending_.finish_reason = more.finish_reason;
            pending_.error = more.error;
        }
    }
    changed_.notify_all();
}

struct Engine::Active {
    std::shared_ptr<Job> job;
    KvCacheSession* session = nullptr;
    bool started = false;
    std::span<const float> logits;
    std::vector<std::int32_t> context;  // prompt and generated tokens (repetition penalty)
    Rng rng;
    StopText stop_text;
    Utf8Sanitizer utf8;
    int generated = 0;
    int limit = 0;                        // tokens it may generate (max_tokens, within the context)
    std::optional<std::int32_t> to_step;  // the token this round feeds back
    std::vector<std::pair<float, int>> scratch;
    std::vector<float> penalized;
    std::vector<std::int32_t> order;  // fill_logprobs' scratch
    Active(std::shared_ptr<Job> j, KvCacheSession* s)
        : job(std::move(j)),
          session(s),
          rng(Rng::derived(job->generation.seed, 0, 0)),
          stop_text(job->generation.stops) {}
};

namespace {

// The chosen token's log-probability and the top `k` alternatives under softmax(logits).
// `order` is reused scratch (no allocation a token once it has grown to the vocabulary).
void fill_logprobs(std::span<const float> logits, std::int32_t chosen, int k,
                   const Tokenizer& tokenizer, std::vector<std::int32_t>& order, TokenInfo& info) {
    const float max = *std::max_element(logits.begin(), logits.end());
    double sum = 0.0;
    for (const float l : logits)
        sum += std::exp(static_cast<double>(l - max));
    const double log_z = static_cast<double>(max) + std::log(sum);
    info.logprob = static_cast<float>(static_cast<double>(logits[chosen]) - log_z);
    if (k <= 0) return;
    std::vector<std::int32_t>& ids = order;
    ids.resize(logits.size());
    for (std::size_t i = 0; i < ids.size(); ++i)
        ids[i] = static_cast<std::int32_t>(i);
    const auto n = std::min<std::size_t>(static_cast<std::size_t>(k), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end(),
                      [&](std::int32_t a, std::int32_t b) {
                          return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                      });
    for (std::size_t i = 0; i < n; ++i) {
        info.top.push_back(
            TopToken{ids[i], tokenizer.token_bytes(ids[i]),
                     static_cast<float>(static_cast<double>(logits[ids[i]]) - log_z)});
    }
}

}  // namespace

Engine::Engine(const Model& model, const Tokenizer& tokenizer, const EngineOptions& options)
    : model_(model),
      tokenizer_(tokenizer),
      context_(options.context > 0 ? std::min(options.context, model.config.max_seq_len)
                                   : model.config.max_seq_len),
      pool_(std::max(1, options.threads)) {
    if (options.weights != WeightFormat::Fp32) {
        compact_ = std::make_unique<DecodeWeights>(model, options.weights);
    }
    generator_ = std::make_unique<Generator>(model, pool_, compact_.get());
    for (int i = 0; i < std::max(1, options.parallel); ++i) {
        sessions_.push_back(std::make_unique<KvCacheSession>(*generator_));
        slots_.emplace_back();
    }
    thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
    drain(0.0);
}

std::shared_ptr<Job> Engine::submit(Generation generation) {
    auto job = std::make_shared<Job>(std::move(generation));
    {
        const std::lock_guard lock(mutex_);
        if (!accepting_) throw std::runtime_error("the server is shutting down");
        queue_.push_back(job);
    }
    wake_.notify_all();
    return job;
}

void Engine::drain(double grace_seconds) {
    {
        const std::lock_guard lock(mutex_);
        accepting_ = false;
    }
    wake_.notify_all();
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(grace_seconds));
    {
        std::unique_lock lock(mutex_);
        wake_.wait_until(lock, deadline, [&] { return queue_.empty() && stats_.active == 0; });
        stopping_ = true;
        for (const auto& job : queue_)
            job->cancel();
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
}

EngineStats Engine::stats() const {
    const std::lock_guard lock(mutex_);
    EngineStats s = stats_;
    s.queued = queue_.size();
    return s;
}

std::size_t Engine::memory_bytes() const {
    std::size_t bytes = (compact_ ? compact_->bytes() : 0) + generator_->memory_bytes();
    for (const auto& s : sessions_)
        bytes += s->memory_bytes();
    return bytes;
}

void Engine::finish(Active& a, const std::string& reason) {
    JobEvents last;
    // What the stop strings held back is text after all, unless one of them ended it.
    if (!a.stop_text.stopped()) last.text = a.utf8.push(a.stop_text.finish());
    last.text += a.utf8.finish();
    last.done = true;
    last.finish_reason = reason;
    last.prompt_tokens = static_cast<int>(a.job->generation.prompt.size());
    last.completion_tokens = a.generated;
    a.job->publish(last);
}

void Engine::start(Active& a) {
    const Generation& g = a.job->generation;
    const auto n = static_cast<int>(g.prompt.size());
    a.limit = std::min(g.max_tokens, context_ - n);
    a.context.assign(g.prompt.begin(), g.prompt.end());
    JobEvents first;
    first.prompt_tokens = n;
    const int vocab = tokenizer_.vocab_size();
    if (g.echo && g.logprobs) {
        // Every prompt token's log-probability: the prompt advanced a token at a time, each
        // step's logits scoring the next prompt token.
        a.logits = a.session->prefill(std::span(g.prompt).first(1));
        first.tokens.push_back(TokenInfo{g.prompt[0], tokenizer_.token_bytes(g.prompt[0]), {}, {}});
        for (int i = 1; i < n; ++i) {
            TokenInfo info{g.prompt[i], tokenizer_.token_bytes(g.prompt[i]), {}, {}};
            fill_logprobs(a.logits.first(vocab), g.prompt[i], *g.logprobs, tokenizer_, a.order,
                          info);
            first.tokens.push_back(std::move(info));
            a.logits = a.session->step(g.prompt[i]);
        }
    } else {
        a.logits = a.session->prefill(g.prompt);
        if (g.echo) {
            for (const std::int32_t id : g.prompt)
                first.tokens.push_back(TokenInfo{id, tokenizer_.token_bytes(id), {}, {}});
        }
    }
    if (g.echo) first.text = a.utf8.push(g.prompt_text);
    {
        const std::lock_guard lock(mutex_);
        stats_.prompt_tokens += static_cast<std::uint64_t>(n);
    }
    a.started = true;
    a.job->publish(first);
    if (a.limit <= 0) finish(a, "length");
}

void Engine::advance(Active& a) {
    const Generation& g = a.job->generation;
    const int vocab = tokenizer_.vocab_size();
    std::span<const float> logits = a.logits.first(vocab);
    if (g.sampling.repetition_penalty != 1.0f) {
        a.penalized.assign(logits.begin(), logits.end());
        apply_repetition_penalty(a.penalized, a.context, g.sampling.repetition_penalty);
        logits = a.penalized;
    }
    const auto token =
        static_cast<std::int32_t>(sample_token(logits, g.sampling, a.rng, a.scratch));
    ++a.generated;
    a.context.push_back(token);
    if (token == tokenizer_.eot_id()) {
        finish(a, "stop");
        return;
    }
    JobEvents more;
    TokenInfo info{token, tokenizer_.token_bytes(token), {}, {}};
    if (g.logprobs)
        fill_logprobs(a.logits.first(vocab), token, *g.logprobs, tokenizer_, a.order, info);
    more.text = a.utf8.push(a.stop_text.push(info.bytes));
    more.tokens.push_back(std::move(info));
    more.prompt_tokens = static_cast<int>(g.prompt.size());
    more.completion_tokens = a.generated;
    a.job->publish(more);
    if (a.stop_text.stopped()) {
        finish(a, "stop");
    } else if (a.generated >= a.limit) {
        finish(a, "length");
    } else {
        a.to_step = token;  // stepped with the other sequences' tokens (Engine::loop)
    }
}

void Engine::loop() {
    while (true) {
        {
            std::unique_lock lock(mutex_);
            wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || stats_.active > 0; });
            if (stopping_) {
                for (auto& slot : slots_) {
                    if (slot) slot->job->cancel();
                }
            }
            for (std::size_t i = 0; i < slots_.size() && !queue_.empty() && !stopping_; ++i) {
                if (slots_[i]) continue;
                slots_[i] = std::make_unique<Active>(queue_.front(), sessions_[i].get());
                queue_.pop_front();
                ++stats_.active;
            }
            if (stopping_ && stats_.active == 0) return;
        }
        const auto round_start = Clock::now();
        std::uint64_t decoded = 0;
        std::uint64_t done = 0;
        for (auto& slot : slots_) {
            if (!slot) continue;
            Active& a = *slot;
            bool over = a.job->cancelled();
            if (!over) {
                try {
                    if (!a.started) {
                        start(a);
                    } else {
                        advance(a);
                        ++decoded;
                    }
                } catch (const std::exception& e) {
                    JobEvents failed;
                    failed.done = true;
                    failed.error = e.what();
                    a.job->publish(failed);
                }
                const std::lock_guard lock(a.job->mutex_);
                over = a.job->finished_;
            } else {
                JobEvents cancelled;
                cancelled.done = true;
                cancelled.finish_reason = "cancelled";
                a.job->publish(cancelled);
            }
            if (over) {
                slot.reset();
                ++done;
            }
        }
        // Every sequence that goes on takes its token's step together: the weights read once.
        std::vector<KvCacheSession*> stepping;
        std::vector<std::int32_t> tokens;
        std::vector<Active*> stepped;
        for (auto& slot : slots_) {
            if (!slot || !slot->to_step) continue;
            stepping.push_back(slot->session);
            tokens.push_back(*slot->to_step);
            stepped.push_back(slot.get());
            slot->to_step.reset();
        }
        try {
            KvCacheSession::step_together(stepping, tokens);
            for (Active* a : stepped)
                a->logits = a->session->logits();
        } catch (const std::exception& e) {
            for (Active* a : stepped) {
                JobEvents failed;
                failed.done = true;
                failed.error = e.what();
                a->job->publish(failed);
            }
            for (auto& slot : slots_) {
                if (slot &&
                    std::find(stepped.begin(), stepped.end(), slot.get()) != stepped.end()) {
                    slot.reset();
                    ++done;
                }
            }
        }
        const std::lock_guard lock(mutex_);
        stats_.generated_tokens += decoded;
        stats_.jobs_done += done;
        stats_.active -= done;
        if (decoded > 0) stats_.decode_seconds += seconds_since(round_start);
        if (done > 0) wake_.notify_all();
    }
}

}  // namespace gpt2::serve
