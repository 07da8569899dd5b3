#include "gpt2/training_run.hpp"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gpt2/checkpoint.hpp"
#include "gpt2/data.hpp"
#include "gpt2/error.hpp"
#include "gpt2/gemm.hpp"
#include "gpt2/generate.hpp"
#include "gpt2/shard.hpp"
#include "gpt2/thread_pool.hpp"
#include "gpt2/tokenizer.hpp"
#include "gpt2/trainer.hpp"
#include "gpt2/training_state.hpp"

namespace gpt2 {

namespace {

using Clock = std::chrono::steady_clock;

// One core's fp32 GEMM rate on the development machine (README, "Why OpenBLAS"): the MFU yardstick.
constexpr double kDefaultPeakGflopsPerCore = 200.0;

// Set by SIGINT/SIGTERM; a signal handler can only reach static storage.
std::atomic<int>& stop_signal() {
    static std::atomic<int> signal{0};
    return signal;
}

extern "C" void on_stop_signal(int signum) {
    stop_signal().store(signum);
}

double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string with_commas(double value) {
    const std::string digits = std::to_string(static_cast<long long>(value + 0.5));
    std::string out;
    for (std::size_t i = 0; i < digits.size(); ++i) {
        if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
        out += digits[i];
    }
    return out;
}

std::string format_duration(double seconds) {
    const auto s = static_cast<long long>(seconds + 0.5);
    if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
    if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
    return fmt::format("{}s", s);
}

std::string human_bytes(double bytes) {
    if (bytes >= 1 << 30) return fmt::format("{:.2f} GiB", bytes / (1 << 30));
    if (bytes >= 1 << 20) return fmt::format("{:.1f} MiB", bytes / (1 << 20));
    return fmt::format("{:.1f} KiB", bytes / 1024);
}

double peak_rss_bytes() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_maxrss) * 1024.0;
}

void setup_logging(const TrainOptions& o, const Communicator& comm) {
    auto logger = spdlog::stdout_logger_mt("train");
    const auto level = spdlog::level::from_str(o.log_level);
    if (comm.is_root()) {
        logger->set_pattern(comm.size() > 1 && level <= spdlog::level::debug
                                ? "[%H:%M:%S rank 0] %v"
                                : "[%H:%M:%S] %v");
        logger->set_level(level);
    } else {
        // Other ranks stay quiet unless diagnostics are asked for.
        logger->set_pattern(fmt::format("[%H:%M:%S rank {}] %v", comm.rank()));
        logger->set_level(level <= spdlog::level::debug ? level : spdlog::level::warn);
    }
    logger->flush_on(spdlog::level::info);
    spdlog::set_default_logger(logger);
}

// Tokenizer and tokens, identical on every rank.
struct Corpus {
    std::unique_ptr<Tokenizer> tokenizer;
    std::vector<std::int32_t> train;  // text mode: the tokens themselves
    std::vector<std::int32_t> val;
    std::vector<MappedShard> train_shards;  // shard mode: memory-mapped by every rank
    std::vector<MappedShard> val_shards;
    TokenStore train_store;
    TokenStore val_store;
};

std::unique_ptr<Tokenizer> build_tokenizer(const TrainOptions& o, std::string_view text) {
    if (o.tokenizer == "gpt2") return load_gpt2_tokenizer(o.tokenizer_dir);
    if (o.tokenizer == "bpe") return train_bpe_tokenizer(text, o.vocab_size);
    return make_char_tokenizer(text);
}

std::string read_text_file(const std::string& path) {
    const std::vector<std::uint8_t> bytes = read_file_bytes(path);
    if (bytes.empty()) throw InputError("--data " + path + ": the corpus is empty");
    return std::string(bytes.begin(), bytes.end());
}

// Rank 0 reads and tokenizes; the others receive the tokenizer and the tokens.
void prepare_text_corpus(const TrainOptions& o, const Communicator& comm,
                         const std::vector<std::uint8_t>& checkpoint_tokenizer, Corpus& corpus) {
    std::vector<std::uint8_t> tokenizer_bytes;
    std::vector<std::int32_t> counts(2, 0);
    if (comm.is_root()) {
        const auto start = Clock::now();
        const std::string text = read_text_file(o.data);
        corpus.tokenizer = checkpoint_tokenizer.empty()
                               ? build_tokenizer(o, text)
                               : deserialize_tokenizer(checkpoint_tokenizer);
        TokenSplit split = split_tokens(corpus.tokenizer->encode(text), o.val_fraction);
        corpus.train = std::move(split.train);
        corpus.val = std::move(split.val);
        tokenizer_bytes = corpus.tokenizer->serialize();
        spdlog::info(
            "corpus {}: {} bytes -> {} train + {} val tokens ({} tokenizer, vocab {}) in {:.2f} s",
            o.data, with_commas(static_cast<double>(text.size())),
            with_commas(static_cast<double>(corpus.train.size())),
            with_commas(static_cast<double>(corpus.val.size())),
            tokenizer_kind_name(corpus.tokenizer->kind()), corpus.tokenizer->vocab_size(),
            seconds_since(start));
        if (corpus.train.size() <= static_cast<std::size_t>(o.seq_len) ||
            corpus.val.size() <= static_cast<std::size_t>(o.seq_len)) {
            throw InputError("--data " + o.data +
                             ": too short: " + std::to_string(corpus.train.size()) + " train and " +
                             std::to_string(corpus.val.size()) +
                             " validation tokens, each split needs more than --seq-len " +
                             std::to_string(o.seq_len));
        }
        counts = {static_cast<std::int32_t>(corpus.train.size()),
                  static_cast<std::int32_t>(corpus.val.size())};
    }
    comm.broadcast_vector(tokenizer_bytes);
    comm.broadcast(std::span<std::int32_t>(counts));
    if (!comm.is_root()) {
        corpus.tokenizer = deserialize_tokenizer(tokenizer_bytes);
        corpus.train.resize(static_cast<std::size_t>(counts[0]));
        corpus.val.resize(static_cast<std::size_t>(counts[1]));
    }
    comm.broadcast(std::span<std::int32_t>(corpus.train));
    comm.broadcast(std::span<std::int32_t>(corpus.val));
    const auto as_bytes = [](std::span<const std::int32_t> v) {
        return std::span(reinterpret_cast<const std::uint8_t*>(v.data()), v.size_bytes());
    };
    spdlog::debug("rank {}: tokenizer {:016x} ({} bytes), train tokens {:016x}, val tokens {:016x}",
                  comm.rank(), checksum64(corpus.tokenizer->serialize()), tokenizer_bytes.size(),
                  checksum64(as_bytes(corpus.train)), checksum64(as_bytes(corpus.val)));
    corpus.train_store.add(std::span<const std::int32_t>(corpus.train));
    corpus.val_store.add(std::span<const std::int32_t>(corpus.val));
}

// Every rank maps the shards itself; rank 0 still decides the tokenizer.
void prepare_shard_corpus(const TrainOptions& o, const Communicator& comm,
                          const std::vector<std::uint8_t>& checkpoint_tokenizer, Corpus& corpus) {
    std::vector<std::uint8_t> tokenizer_bytes;
    if (comm.is_root()) {
        // The shards' own tokenizer (prepare_data writes tokenizer.bin beside them) unless a
        // checkpoint brings one; GPT-2's tokenizer needs no corpus, so --tokenizer gpt2 also works.
        const std::filesystem::path beside =
            expand_shard_pattern(o.train_data).front().parent_path() / "tokenizer.bin";
        if (!checkpoint_tokenizer.empty()) {
            corpus.tokenizer = deserialize_tokenizer(checkpoint_tokenizer);
        } else if (std::filesystem::exists(beside)) {
            corpus.tokenizer = deserialize_tokenizer(read_file_bytes(beside));
        } else if (o.tokenizer == "gpt2") {
            corpus.tokenizer = load_gpt2_tokenizer(o.tokenizer_dir);
        } else {
            throw InputError("--train-data " + o.train_data + ": no " + beside.string() +
                             " (prepare_data writes it) and --tokenizer is not gpt2");
        }
        tokenizer_bytes = corpus.tokenizer->serialize();
    }
    comm.broadcast_vector(tokenizer_bytes);
    if (!comm.is_root()) corpus.tokenizer = deserialize_tokenizer(tokenizer_bytes);
    for (const auto& path : expand_shard_pattern(o.train_data))
        corpus.train_shards.emplace_back(path);
    for (const auto& path : expand_shard_pattern(o.val_data))
        corpus.val_shards.emplace_back(path);
    const int vocab = corpus.tokenizer->vocab_size();
    for (auto* shards : {&corpus.train_shards, &corpus.val_shards}) {
        for (const MappedShard& shard : *shards) {
            validate_token_range(shard.tokens(), vocab, shard.path());
            (shards == &corpus.train_shards ? corpus.train_store : corpus.val_store)
                .add(shard.tokens());
        }
    }
    const auto T = static_cast<std::uint64_t>(o.seq_len);
    if (corpus.train_store.num_windows(o.seq_len) == 0 ||
        corpus.val_store.num_windows(o.seq_len) == 0) {
        throw InputError("--train-data/--val-data: shards hold fewer than --seq-len+1 = " +
                         std::to_string(T + 1) + " tokens");
    }
}

ModelConfig configured_model(const TrainOptions& o, int vocab_size) {
    const int maxT = o.block_size > 0 ? o.block_size : o.seq_len;
    if (!o.model.empty()) {
        ModelConfig c = preset_config(o.model, vocab_size);
        if (o.block_size > 0) c.max_seq_len = o.block_size;
        return c;
    }
    return ModelConfig{maxT, vocab_size, pad_vocab(vocab_size), o.n_layer, o.n_head, o.n_embd};
}

std::array<std::int32_t, 6> to_ints(const ModelConfig& c) {
    return {c.max_seq_len, c.vocab_size, c.padded_vocab_size,
            c.num_layers,  c.num_heads,  c.channels};
}

ModelConfig from_ints(const std::array<std::int32_t, 6>& v) {
    return ModelConfig{v[0], v[1], v[2], v[3], v[4], v[5]};
}

std::string config_json(const TrainOptions& o, const ModelConfig& c, int world, int workers) {
    nlohmann::json j;
    j["model"] = {{"max_seq_len", c.max_seq_len},
                  {"vocab_size", c.vocab_size},
                  {"padded_vocab_size", c.padded_vocab_size},
                  {"num_layers", c.num_layers},
                  {"num_heads", c.num_heads},
                  {"channels", c.channels}};
    j["training"] = {{"data", o.train_data.empty() ? o.data : o.train_data},
                     {"tokenizer", o.tokenizer},
                     {"batch_size", o.batch_size},
                     {"seq_len", o.seq_len},
                     {"lr", o.lr},
                     {"min_lr", o.min_lr},
                     {"warmup_steps", o.warmup_steps},
                     {"weight_decay", o.weight_decay},
                     {"grad_clip", o.grad_clip},
                     {"max_steps", o.max_steps},
                     {"seed", o.seed},
                     {"ranks", world},
                     {"threads", workers}};
    return j.dump(2);
}

// Where the run starts: fresh, from weights (--init-from), or from a checkpoint (--resume).
struct StartPoint {
    std::optional<LoadedModel> model;
    std::filesystem::path state_file;
};

StartPoint find_start(const TrainOptions& o) {
    StartPoint start;
    if (o.resume == "auto") {
        for (const std::int64_t step : list_checkpoints(o.out_dir)) {
            try {
                start.model = load_checkpoint(model_path(o.out_dir, step));
                start.state_file = state_path(o.out_dir, step);
                return start;
            } catch (const InputError& e) {
                spdlog::warn("skipping checkpoint at step {}: {}", step, e.what());
            }
        }
        spdlog::info("--resume auto: no checkpoint in {}, starting fresh", o.out_dir);
        return start;
    }
    if (!o.resume.empty()) {
        const auto step = checkpoint_step(o.resume);
        if (!step) {
            throw InputError("--resume " + o.resume +
                             ": expected 'auto' or a state_NNNNNN.bin file");
        }
        const std::filesystem::path dir = std::filesystem::path(o.resume).parent_path();
        start.model = load_checkpoint(model_path(dir, *step));
        start.state_file = state_path(dir, *step);
        return start;
    }
    if (!o.init_from.empty()) start.model = load_checkpoint(o.init_from);
    return start;
}

class MetricsFile {
  public:
    explicit MetricsFile(const std::string& path) {
        if (path.empty()) return;
        const std::filesystem::path parent = std::filesystem::path(path).parent_path();
        std::error_code ec;
        if (!parent.empty()) std::filesystem::create_directories(parent, ec);
        out_.open(path, std::ios::app);
        if (!out_) throw InputError("--metrics-file " + path + ": cannot open for writing");
    }
    void write(const nlohmann::json& record) {
        if (out_.is_open()) out_ << record.dump() << '\n' << std::flush;
    }

  private:
    std::ofstream out_;
};

}  // namespace

int run_training(const TrainOptions& o, const Communicator& comm) {
    const auto program_start = Clock::now();
    setup_logging(o, comm);
    validate_train_options(o, comm.size());
    std::signal(SIGINT, on_stop_signal);
    std::signal(SIGTERM, on_stop_signal);
    // Past a file-size limit, a write should fail with EFBIG (reported, previous checkpoint
    // kept) rather than kill the process.
    std::signal(SIGXFSZ, SIG_IGN);

    // Rank 0 decides where we start and loads any weights; shapes and bytes are broadcast.
    StartPoint start;
    std::vector<std::uint8_t> checkpoint_tokenizer;
    if (comm.is_root()) {
        start = find_start(o);
        if (start.model && start.model->extras)
            checkpoint_tokenizer = start.model->extras->tokenizer;
        if (!o.resume.empty() || !o.init_from.empty()) {
            if (start.model && start.model->extras && checkpoint_tokenizer.empty()) {
                throw InputError("checkpoint has no tokenizer");
            }
        }
    }
    comm.broadcast_vector(checkpoint_tokenizer);

    Corpus corpus;
    if (o.train_data.empty()) {
        prepare_text_corpus(o, comm, checkpoint_tokenizer, corpus);
    } else {
        prepare_shard_corpus(o, comm, checkpoint_tokenizer, corpus);
    }
    const int vocab = corpus.tokenizer->vocab_size();

    std::array<std::int32_t, 6> shape = to_ints(configured_model(o, vocab));
    std::int32_t have_weights = 0;
    if (comm.is_root() && start.model) {
        const ModelConfig& loaded = start.model->model.config;
        const std::string source = o.resume.empty() ? "--init-from " + o.init_from : "--resume";
        if (!o.resume.empty() && loaded != from_ints(shape)) {
            throw InputError(source + ": checkpoint model " + describe(loaded) +
                             " differs from the requested " + describe(from_ints(shape)));
        }
        if (loaded.vocab_size < vocab) {
            throw InputError(source + ": model vocabulary " + std::to_string(loaded.vocab_size) +
                             " is smaller than the tokenizer's " + std::to_string(vocab));
        }
        if (loaded.max_seq_len < o.seq_len) {
            throw InputError("--seq-len " + std::to_string(o.seq_len) + " exceeds the block size " +
                             std::to_string(loaded.max_seq_len) + " of " + source);
        }
        shape = to_ints(loaded);
        have_weights = 1;
    }
    comm.broadcast(std::span<std::int32_t>(shape));
    comm.broadcast(std::span<std::int32_t>(&have_weights, 1));
    const ModelConfig config = from_ints(shape);
    validate_config(config, "model");
    if (config.max_seq_len < o.seq_len) {
        throw InputError("--seq-len " + std::to_string(o.seq_len) + " exceeds --block-size " +
                         std::to_string(config.max_seq_len));
    }
    if (corpus.train_store.max_token() >= config.vocab_size) {
        throw InputError("token id " + std::to_string(corpus.train_store.max_token()) +
                         " is out of range for the model's vocabulary of " +
                         std::to_string(config.vocab_size));
    }

    const auto build_start = Clock::now();
    const int workers_wanted = o.threads > 0 ? o.threads : std::min(available_cpus(), o.batch_size);
    WorkerGroup workers(config, workers_wanted, o.batch_size, o.seq_len, o.pin_threads);
    Model model(config);
    AdamWState optimizer(model.layout.total());
    if (have_weights) {
        if (comm.is_root()) {
            std::copy(start.model->model.params.span().begin(),
                      start.model->model.params.span().end(), model.params.data());
            start.model.reset();
        }
        comm.broadcast(model.params.span());
    } else {
        init_parameters(model, o.seed, &workers.pool());
    }

    ResumeState resume;
    std::int64_t first_step = 0;
    std::int32_t resuming = comm.is_root() && !start.state_file.empty() ? 1 : 0;
    comm.broadcast(std::span<std::int32_t>(&resuming, 1));
    const int grad_accum =
        o.grad_accum > 0 ? o.grad_accum
        : o.total_batch_tokens > 0
            ? static_cast<int>(o.total_batch_tokens /
                               (static_cast<std::int64_t>(o.batch_size) * o.seq_len * comm.size()))
            : 1;
    const std::int64_t global_sequences =
        static_cast<std::int64_t>(o.batch_size) * comm.size() * grad_accum;
    Rng sample_rng = Rng::derived(o.seed, 0x5a3e);
    if (resuming) {
        std::array<std::int64_t, 3> header{};
        if (comm.is_root()) {
            resume = load_resume_state(start.state_file, config, optimizer);
            if (resume.sequences_per_step != global_sequences || resume.seq_len != o.seq_len) {
                throw InputError(
                    "--resume " + start.state_file.string() + ": the checkpoint used " +
                    std::to_string(resume.sequences_per_step) + " sequences of " +
                    std::to_string(resume.seq_len) + " tokens per step; this run uses " +
                    std::to_string(global_sequences) + " of " + std::to_string(o.seq_len) +
                    " (keep the global batch to resume)");
            }
            header = {resume.step, optimizer.step, static_cast<std::int64_t>(resume.seed)};
            sample_rng.set_state(resume.sample_rng);
            spdlog::info("resuming from {} at step {}", start.state_file.string(), resume.step);
        }
        comm.broadcast(std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(header.data()),
                                               sizeof(header)));
        comm.broadcast(optimizer.m.span());
        comm.broadcast(optimizer.v.span());
        first_step = header[0];
        optimizer.step = header[1];
    }

    const double startup_seconds = seconds_since(build_start);

    const int B = o.batch_size, T = o.seq_len, W = workers.size();
    const std::int64_t tokens_per_step = global_sequences * T;
    const double flops_per_step =
        training_flops_per_token(config, T) * static_cast<double>(tokens_per_step);
    const double peak_gflops =
        (o.peak_gflops > 0 ? o.peak_gflops : kDefaultPeakGflopsPerCore) * W * comm.size();
    const bool benchmark = o.benchmark > 0;
    constexpr int kBenchmarkWarmup = 2;
    const std::int64_t last_step =
        benchmark ? first_step + o.benchmark + kBenchmarkWarmup : o.max_steps;

    spdlog::info("model {} | {} parameters ({})", describe(config),
                 with_commas(static_cast<double>(model.layout.total())),
                 human_bytes(static_cast<double>(model.layout.total()) * 4));
    spdlog::info("ranks x workers {} x {} | batch {} x {} per rank, grad accum {} | {} tokens/step",
                 comm.size(), W, B, T, grad_accum,
                 with_commas(static_cast<double>(tokens_per_step)));
    spdlog::info("thread context {} each ({} activations + {} gradients) | startup {:.0f} ms",
                 human_bytes(static_cast<double>(workers.context(0).total_bytes())),
                 human_bytes(static_cast<double>(workers.context(0).activation_bytes())),
                 human_bytes(static_cast<double>(workers.context(0).grads.size() * 4)),
                 startup_seconds * 1e3);
    spdlog::info(
        "data: {} train windows, {} val windows of {} tokens | GEMM kernels {} | MFU peak {:.0f} "
        "GFLOP/s",
        with_commas(static_cast<double>(corpus.train_store.num_windows(T))),
        with_commas(static_cast<double>(corpus.val_store.num_windows(T))), T, gemm_kernel_name(),
        peak_gflops);
    for (int w = 0; w < W; ++w) {
        spdlog::debug("rank {} worker {}: {} sequences, context {}", comm.rank(), w,
                      split_range(static_cast<std::size_t>(B), w, W).end -
                          split_range(static_cast<std::size_t>(B), w, W).begin,
                      human_bytes(static_cast<double>(workers.context(w).total_bytes())));
    }

    // Buffers for a step and for the fixed validation set, allocated once.
    const std::size_t step_tokens = static_cast<std::size_t>(grad_accum) * B * T;
    std::vector<std::int32_t> inputs(step_tokens), targets(step_tokens);
    WindowSampler train_sampler(corpus.train_store, T, o.seed, !o.no_shuffle);
    WindowSampler val_sampler(corpus.val_store, T, o.seed, false);
    const std::size_t val_tokens = static_cast<std::size_t>(o.val_batches) * B * T;
    std::vector<std::int32_t> val_inputs(val_tokens), val_targets(val_tokens);
    val_sampler.fill_step(0, comm.rank(), comm.size(), B, o.val_batches, val_inputs, val_targets);

    const ScheduleConfig schedule{o.schedule, o.lr, o.min_lr, o.warmup_steps, o.max_steps};
    MetricsFile metrics_file(comm.is_root() ? o.metrics_file : "");
    const std::filesystem::path out_dir = o.out_dir;
    if (comm.is_root() && !benchmark) {
        std::error_code ec;
        std::filesystem::create_directories(out_dir, ec);
        if (ec || !std::filesystem::is_directory(out_dir)) {
            throw InputError("--out-dir " + o.out_dir + ": cannot create directory (" +
                             ec.message() + ")");
        }
    }
    const std::string run_config = config_json(o, config, comm.size(), W);

    const auto save = [&](std::int64_t completed) {
        if (!comm.is_root()) return;
        const auto t0 = Clock::now();
        const auto path =
            save_checkpoint(model_path(out_dir, completed), model,
                            CheckpointExtras{corpus.tokenizer->serialize(), run_config});
        const ResumeState state{completed, o.seed, global_sequences, T, sample_rng.state()};
        save_resume_state(state_path(out_dir, completed), state, config, optimizer);
        prune_checkpoints(out_dir, o.keep_checkpoints);
        spdlog::info("checkpoint {} ({:.2f} s)", path.string(), seconds_since(t0));
    };
    const auto validate = [&](std::int64_t completed) {
        const auto t0 = Clock::now();
        const double val_loss =
            evaluate(model, workers, comm, val_inputs, val_targets, o.val_batches);
        spdlog::info("step {}/{} | val loss {:.4f} | {:.0f} ms", completed, o.max_steps, val_loss,
                     seconds_since(t0) * 1e3);
        metrics_file.write({{"type", "val"}, {"step", completed}, {"val_loss", val_loss}});
    };
    const auto sample = [&]() {
        if (!comm.is_root() || o.sample_tokens == 0) return;
        std::vector<std::int32_t> tokens;
        if (const auto eot = corpus.tokenizer->eot_id()) {
            tokens.push_back(*eot);
        } else {
            tokens.push_back(val_inputs[0]);
        }
        const std::size_t prompt = tokens.size();
        generate_recompute(model, tokens, o.sample_tokens, SamplingParams{}, sample_rng);
        const std::string text =
            corpus.tokenizer->decode(std::span<const std::int32_t>(tokens).subspan(prompt));
        spdlog::info("sample:\n{}\n---", text);
    };

    if (first_step == 0 && !benchmark && o.val_every > 0) validate(0);
    std::vector<double> step_ms;
    double ema_seconds = 0.0;
    int bad_steps = 0;
    for (std::int64_t step = first_step; step < last_step; ++step) {
        const auto t0 = Clock::now();
        train_sampler.fill_step(static_cast<std::uint64_t>(step), comm.rank(), comm.size(), B,
                                grad_accum, inputs, targets);
        StepHyper hyper{
            AdamWHyper{learning_rate(schedule, step), o.beta1, o.beta2, o.eps, o.weight_decay},
            o.grad_clip};
        const StepMetrics m = train_step(model, optimizer, workers, comm,
                                         StepBatch{inputs, targets, grad_accum, global_sequences},
                                         hyper, step == o.inject_nan_step);
        const double seconds = seconds_since(t0);
        const std::int64_t completed = step + 1;
        if (m.skipped) {
            ++bad_steps;
            spdlog::warn(
                "step {}: non-finite loss {} or gradient norm {}: update skipped ({} in a row)",
                completed, m.loss, m.grad_norm, bad_steps);
            if (bad_steps >= o.max_bad_steps) {
                throw InputError(
                    "stopping: " + std::to_string(bad_steps) +
                    " non-finite steps in a row (--max-bad-steps); the last good checkpoint in " +
                    o.out_dir + " is kept");
            }
        } else {
            bad_steps = 0;
        }
        ema_seconds = step == first_step ? seconds : 0.9 * ema_seconds + 0.1 * seconds;
        if (benchmark && step >= first_step + kBenchmarkWarmup) step_ms.push_back(seconds * 1e3);
        const double tok_s = static_cast<double>(tokens_per_step) / seconds;
        const double mfu = flops_per_step / seconds / (peak_gflops * 1e9);
        spdlog::info(
            "step {}/{} | loss {:.4f} | lr {:.1e} | norm {:.2f} | {:.0f} ms | {} tok/s | MFU "
            "{:.0f}% | ETA {}",
            completed, last_step, m.loss, hyper.adamw.lr, m.grad_norm, seconds * 1e3,
            with_commas(tok_s), mfu * 100,
            format_duration(ema_seconds * static_cast<double>(last_step - completed)));
        metrics_file.write({{"type", "train"},
                            {"step", completed},
                            {"loss", m.loss},
                            {"lr", hyper.adamw.lr},
                            {"grad_norm", m.grad_norm},
                            {"ms", seconds * 1e3},
                            {"tokens_per_s", tok_s},
                            {"mfu", mfu},
                            {"skipped", m.skipped}});

        if (o.check_replicas > 0 && completed % o.check_replicas == 0) {
            const std::uint64_t sum =
                checksum64(std::span(reinterpret_cast<const std::uint8_t*>(model.params.data()),
                                     model.params.size() * 4));
            const auto all = comm.allgather(sum);
            for (std::size_t r = 0; r < all.size(); ++r) {
                if (all[r] != all[0]) {
                    comm.abort(
                        fmt::format("step {}: parameters of rank {} differ from rank 0 "
                                    "(replicas diverged; checksums {:016x} vs {:016x})",
                                    completed, r, all[r], all[0]));
                }
            }
            spdlog::debug("step {}: replicas identical (checksum {:016x})", completed, sum);
        }
        const bool stop =
            comm.allreduce_max(stop_signal().load()) != 0 || completed == o.stop_at_step;
        if (benchmark) {
            if (stop) return 130;  // interrupted: no figures, nothing saved
            continue;
        }
        const bool last = completed == last_step;
        if ((o.val_every > 0 && completed % o.val_every == 0) || last) validate(completed);
        if (o.sample_every > 0 && (completed % o.sample_every == 0 || last)) sample();
        if ((o.checkpoint_every > 0 && completed % o.checkpoint_every == 0) || last || stop) {
            save(completed);
        }
        if (stop) {
            spdlog::info("stopped by signal at step {}; resume with --resume auto", completed);
            return 0;
        }
    }

    if (benchmark && comm.is_root()) {
        std::sort(step_ms.begin(), step_ms.end());
        const double median_ms = step_ms[step_ms.size() / 2];
        const double tok_s = static_cast<double>(tokens_per_step) / (median_ms / 1e3);
        const double gflops = flops_per_step / (median_ms / 1e3) / 1e9;
        fmt::print(
            "benchmark: median {:.1f} ms/step | {:.1f} tok/s | {:.1f} GFLOP/s | MFU {:.1f}% "
            "| peak RSS {} | startup {:.0f} ms | {} steps, ranks {} x workers {}\n",
            median_ms, tok_s, gflops, 100.0 * gflops / peak_gflops, human_bytes(peak_rss_bytes()),
            startup_seconds * 1e3, step_ms.size(), comm.size(), W);
        std::fflush(stdout);
    }
    spdlog::debug("rank {} done after {:.1f} s", comm.rank(), seconds_since(program_start));
    return 0;
}

}  // namespace gpt2
