// inference: text generation from a checkpoint with the KV-cache generator
// (build/inference CHECKPOINT [flags]; --help lists them). Under mpirun rank 0 loads and
// broadcasts the model, the samples are shared between ranks and rank 0 prints them in order.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "gpt2/checkpoint.hpp"
#include "gpt2/comm.hpp"
#include "gpt2/error.hpp"
#include "gpt2/gemm.hpp"
#include "gpt2/inference.hpp"
#include "gpt2/tokenizer.hpp"

namespace {

struct Options {
    std::string checkpoint;
    std::string prompt;
    std::string prompt_file;
    int max_new_tokens = 256;
    float temperature = 1.0f;
    int top_k = 0;
    float top_p = 1.0f;
    std::uint64_t seed = 1337;
    int num_samples = 1;
    bool stream = true;
    bool interactive = false;
    int threads = 0;
    std::string tokenizer;
    std::string tokenizer_dir;
    std::string tokenizer_corpus;
};

void validate(const Options& o) {
    const auto require = [](bool ok, const std::string& message) {
        if (!ok) throw gpt2::InputError(message);
    };
    require(std::isfinite(o.temperature), "--temperature must be a finite number");
    require(o.top_p > 0.0f && o.top_p <= 1.0f, "--top-p must be in (0, 1]");
    require(o.tokenizer != "gpt2" || !o.tokenizer_dir.empty(),
            "--tokenizer gpt2 needs --tokenizer-dir DIR (with encoder.json and vocab.bpe)");
    const bool rebuilt = o.tokenizer == "char" || o.tokenizer == "bpe";
    require(!rebuilt || !o.tokenizer_corpus.empty(),
            "--tokenizer " + o.tokenizer + " needs --tokenizer-corpus FILE (its source text)");
}

// Options, or the exit code when parsing ends the program (--help, bad flags). Only the speaker
// prints, so that N ranks parsing the same command line report a bad flag once (every rank
// reaches the same verdict, so none waits for another).
std::variant<Options, int> parse_options(int argc, char** argv, bool speaker) {
    Options o;
    CLI::App app{"Generate text from a GPT-2 checkpoint (KV cache; MPI shares the samples)",
                 "inference"};
    app.add_option("checkpoint", o.checkpoint, "checkpoint or llm.c model file")->required();
    auto* prompt = app.add_option("--prompt", o.prompt, "prompt text (default: end-of-text)");
    auto* prompt_file = app.add_option("--prompt-file", o.prompt_file, "read the prompt from F");
    prompt->excludes(prompt_file);
    app.add_option("--max-new-tokens", o.max_new_tokens, "tokens to generate per sample")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--temperature", o.temperature, "softmax temperature (0: greedy)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--top-k", o.top_k, "sample among the k most likely tokens (0: all)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--top-p", o.top_p, "nucleus sampling: smallest set with this mass, in (0, 1]");
    app.add_option("--seed", o.seed, "sample m draws from a stream derived from (seed, m)");
    app.add_option("--num-samples", o.num_samples, "samples per prompt (shared between ranks)")
        ->check(CLI::PositiveNumber);
    app.add_flag("--stream,!--no-stream", o.stream, "print each token as it is generated");
    auto* interactive = app.add_flag("--interactive", o.interactive,
                                     "read prompts from stdin, one per line, until end of file");
    interactive->excludes(prompt)->excludes(prompt_file);
    app.add_option(
           "--threads", o.threads,
           "worker threads per rank (0: the CPUs available, 1 for models under 16M parameters)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--tokenizer", o.tokenizer,
                   "tokenizer for a model file without one: gpt2 (with --tokenizer-dir), or char "
                   "| bpe (rebuilt from --tokenizer-corpus)")
        ->check(CLI::IsMember({"char", "bpe", "gpt2"}));
    app.add_option("--tokenizer-dir", o.tokenizer_dir,
                   "directory with GPT-2's encoder.json and vocab.bpe (--tokenizer gpt2)");
    app.add_option("--tokenizer-corpus", o.tokenizer_corpus,
                   "text the char or bpe tokenizer was built from (--tokenizer char|bpe)");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int code = speaker ? app.exit(e) : e.get_exit_code();
        return code == 0 ? 0 : 2;
    }
    try {
        validate(o);
    } catch (const gpt2::InputError& e) {
        if (speaker) std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
    return o;
}

std::string_view as_text(const std::vector<std::uint8_t>& bytes) {
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

// Rank 0's view of the checkpoint before it is shared: model and serialized tokenizer.
struct Loaded {
    std::optional<gpt2::Model> model;
    std::vector<std::uint8_t> tokenizer;
};

Loaded load(const Options& o) {
    gpt2::LoadedModel file = gpt2::load_checkpoint(o.checkpoint);
    Loaded out;
    const int V = file.model.config.vocab_size;
    std::unique_ptr<gpt2::Tokenizer> tokenizer;
    if (o.tokenizer == "gpt2") {
        tokenizer = gpt2::load_gpt2_tokenizer(o.tokenizer_dir);
    } else if (o.tokenizer == "char" || o.tokenizer == "bpe") {
        const std::vector<std::uint8_t> corpus = gpt2::read_file_bytes(o.tokenizer_corpus);
        tokenizer = o.tokenizer == "char" ? gpt2::make_char_tokenizer(as_text(corpus))
                                          : gpt2::train_bpe_tokenizer(as_text(corpus), V);
    } else if (file.extras && !file.extras->tokenizer.empty()) {
        try {
            tokenizer = gpt2::deserialize_tokenizer(file.extras->tokenizer);
        } catch (const std::exception& e) {
            throw gpt2::InputError(o.checkpoint + ": its tokenizer is unreadable: " + e.what());
        }
    } else {
        throw gpt2::InputError(o.checkpoint +
                               ": has no tokenizer; pass --tokenizer gpt2 --tokenizer-dir DIR "
                               "(or --tokenizer char|bpe --tokenizer-corpus FILE)");
    }
    if (tokenizer->vocab_size() > V) {
        throw gpt2::InputError("the tokenizer's vocabulary (" +
                               std::to_string(tokenizer->vocab_size()) +
                               " tokens) is larger than the model's vocab_size (" +
                               std::to_string(V) + ") in " + o.checkpoint);
    }
    out.tokenizer = tokenizer->serialize();
    out.model.emplace(std::move(file.model));
    return out;
}

// Every rank ends up with the same model and tokenizer (rank 0 reads, the others receive).
struct Shared {
    std::optional<gpt2::Model> model;
    std::unique_ptr<gpt2::Tokenizer> tokenizer;
};

Shared share(const Options& o, const gpt2::Communicator& comm) {
    Loaded loaded;
    if (comm.is_root()) loaded = load(o);
    // Waiting ranks sleep instead of spinning in the broadcast while rank 0 reads.
    gpt2::idle_barrier(comm);
    std::vector<std::int32_t> shape(6);
    if (comm.is_root()) {
        const gpt2::ModelConfig& c = loaded.model->config;
        shape = {c.max_seq_len, c.vocab_size, c.padded_vocab_size,
                 c.num_layers,  c.num_heads,  c.channels};
    }
    comm.broadcast(std::span<std::int32_t>(shape));
    if (!comm.is_root()) {
        loaded.model.emplace(
            gpt2::ModelConfig{shape[0], shape[1], shape[2], shape[3], shape[4], shape[5]});
    }
    comm.broadcast(loaded.model->params.span());
    comm.broadcast_vector(loaded.tokenizer);
    return Shared{std::move(loaded.model), gpt2::deserialize_tokenizer(loaded.tokenizer)};
}

// The prompt's tokens; an empty prompt starts from end-of-text, or "\n" for the char tokenizer
// (which has no end-of-text), or token 0.
std::vector<std::int32_t> encode_prompt(const gpt2::Tokenizer& tokenizer, const gpt2::Model& model,
                                        std::string_view text, std::string_view source) {
    std::vector<std::int32_t> tokens;
    if (!text.empty()) {
        try {
            tokens = tokenizer.encode(text);
        } catch (const std::exception& e) {
            throw gpt2::InputError(std::string(source) + ": cannot encode the prompt: " + e.what());
        }
    }
    if (tokens.empty()) {
        if (const auto eot = tokenizer.eot_id()) {
            tokens.push_back(*eot);
        } else {
            try {
                tokens = tokenizer.encode("\n");
            } catch (const gpt2::InputError&) {
                tokens.clear();
            }
            if (tokens.size() != 1) tokens = {0};
        }
    }
    for (const std::int32_t t : tokens) {
        if (t < 0 || t >= model.config.vocab_size) {
            throw gpt2::InputError(std::string(source) + ": token id " + std::to_string(t) +
                                   " is outside the model's vocabulary [0, " +
                                   std::to_string(model.config.vocab_size) + ")");
        }
    }
    const auto maxT = static_cast<std::size_t>(model.config.max_seq_len);
    if (tokens.size() > maxT) {
        std::fprintf(stderr, "%.*s: %zu prompt tokens, only the last %zu fit the context\n",
                     static_cast<int>(source.size()), source.data(), tokens.size(), maxT);
    }
    return tokens;
}

// One finished sample, as rank 0 prints it; serialized to travel to rank 0.
struct Sample {
    std::uint32_t index = 0;
    gpt2::GenerationStats stats;
    std::string text;
};

template <typename T>
void put(std::vector<std::uint8_t>& out, const T& value) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&value);
    out.insert(out.end(), p, p + sizeof(T));
}

template <typename T>
T take(std::span<const std::uint8_t>& in) {
    if (in.size() < sizeof(T)) throw std::runtime_error("inference: short sample message");
    T value;
    std::memcpy(&value, in.data(), sizeof(T));
    in = in.subspan(sizeof(T));
    return value;
}

void serialize(const Sample& s, std::vector<std::uint8_t>& out) {
    put(out, s.index);
    put(out, s.stats.prompt_tokens);
    put(out, s.stats.generated_tokens);
    put(out, s.stats.slides);
    put(out, s.stats.prefill_seconds);
    put(out, s.stats.generate_seconds);
    put(out, static_cast<std::uint64_t>(s.text.size()));
    out.insert(out.end(), s.text.begin(), s.text.end());
}

std::vector<Sample> deserialize(std::span<const std::uint8_t> in) {
    std::vector<Sample> samples;
    while (!in.empty()) {
        Sample s;
        s.index = take<std::uint32_t>(in);
        s.stats.prompt_tokens = take<int>(in);
        s.stats.generated_tokens = take<int>(in);
        s.stats.slides = take<int>(in);
        s.stats.prefill_seconds = take<double>(in);
        s.stats.generate_seconds = take<double>(in);
        const auto size = take<std::uint64_t>(in);
        if (size > in.size()) throw std::runtime_error("inference: short sample message");
        s.text.assign(reinterpret_cast<const char*>(in.data()), size);
        in = in.subspan(size);
        samples.push_back(std::move(s));
    }
    return samples;
}

void write_out(std::string_view bytes) {
    std::fwrite(bytes.data(), 1, bytes.size(), stdout);
    std::fflush(stdout);
}

void print_header(const Options& o, std::uint32_t index) {
    if (o.num_samples > 1) {
        write_out("--- sample " + std::to_string(index + 1) + "/" + std::to_string(o.num_samples) +
                  " ---\n");
    }
}

void print_stats(const Sample& s) {
    const gpt2::GenerationStats& st = s.stats;
    const double per_token =
        st.generated_tokens > 0 ? st.generate_seconds / st.generated_tokens : 0.0;
    std::fprintf(stderr,
                 "stats: sample=%u prompt_tokens=%d generated_tokens=%d prefill_ms=%.2f "
                 "generate_ms=%.2f tokens_per_s=%.2f ms_per_token=%.3f slides=%d\n",
                 s.index + 1, st.prompt_tokens, st.generated_tokens, st.prefill_seconds * 1e3,
                 st.generate_seconds * 1e3, per_token > 0.0 ? 1.0 / per_token : 0.0,
                 per_token * 1e3, st.slides);
}

// Below ~16M parameters one token's work is too small to gain from a second worker (the 0.8M-
// parameter test checkpoint: ~0.1 ms/token on one thread or two on a quiet machine, several times
// slower on two when the cores are busy with other work), so small models default to one thread.
int default_threads(const gpt2::Model& model) {
    constexpr std::size_t kParallelParams = std::size_t{16} << 20;
    return model.layout.total() >= kParallelParams ? gpt2::available_cpus() : 1;
}

// Generates this rank's samples for one prompt; rank 0 prints all of them in order. Sample m
// (of this prompt, numbered `prompt_index`) is made by rank m % size with the random stream
// derived from (seed, m, prompt_index).
void run_prompt(const Options& o, const gpt2::Communicator& comm, gpt2::KvCacheSession& session,
                const gpt2::Tokenizer& tokenizer, std::span<const std::int32_t> prompt,
                std::string_view prompt_text, std::uint64_t prompt_index) {
    const gpt2::SamplingParams params{o.temperature, o.top_k, o.top_p};
    const auto count = static_cast<std::uint32_t>(o.num_samples);
    const auto size = static_cast<std::uint32_t>(comm.size());
    const auto rank = static_cast<std::uint32_t>(comm.rank());
    std::vector<std::uint8_t> outbox;
    std::vector<Sample> own;
    std::vector<std::int32_t> tokens;
    tokens.reserve(prompt.size() + static_cast<std::size_t>(o.max_new_tokens));
    for (std::uint32_t m = rank; m < count; m += size) {
        // Rank 0 can print sample m as it is made only if every earlier sample is printed.
        const bool live = comm.is_root() && (m == 0 || size == 1);
        Sample sample;
        sample.index = m;
        if (live) {
            print_header(o, m);
            write_out(prompt_text);
        }
        tokens.assign(prompt.begin(), prompt.end());
        gpt2::Rng rng = gpt2::Rng::derived(o.seed, m, prompt_index);
        const auto on_token = [&](std::int32_t id) {
            const std::string bytes = tokenizer.token_bytes(id);
            if (live && o.stream) {
                write_out(bytes);
            } else {
                sample.text += bytes;
            }
        };
        sample.stats = gpt2::generate_kv(session, tokens, o.max_new_tokens, params, rng, on_token,
                                         tokenizer.vocab_size());
        if (live) {
            write_out(sample.text);
            write_out("\n");
            sample.text.clear();
            print_stats(sample);
        } else if (comm.is_root()) {
            own.push_back(std::move(sample));
        } else {
            serialize(sample, outbox);
        }
    }
    if (comm.size() == 1) {
        for (const Sample& s : own) {
            print_header(o, s.index);
            write_out(prompt_text);
            write_out(s.text);
            write_out("\n");
            print_stats(s);
        }
        return;
    }
    // Ranks done early sleep here rather than spin inside the gather.
    gpt2::idle_barrier(comm);
    const auto inboxes = gpt2::gather_bytes(comm, outbox);
    if (!comm.is_root()) return;
    std::vector<std::optional<Sample>> by_index(count);
    for (Sample& s : own)
        by_index[s.index].emplace(std::move(s));
    for (const auto& inbox : inboxes) {
        for (Sample& s : deserialize(inbox)) {
            if (s.index < count) by_index[s.index].emplace(std::move(s));
        }
    }
    for (auto& s : by_index) {
        if (!s) continue;  // sample 0, already printed live
        print_header(o, s->index);
        write_out(prompt_text);
        write_out(s->text);
        write_out("\n");
        print_stats(*s);
    }
}

// Rank 0 reads the next stdin line and shares it; nullopt at end of input.
std::optional<std::string> next_line(const gpt2::Communicator& comm) {
    std::vector<std::uint8_t> message;  // [1, line bytes...] or [0] at end of input
    if (comm.is_root()) {
        std::string line;
        if (std::getline(std::cin, line)) {
            message.push_back(1);
            message.insert(message.end(), line.begin(), line.end());
        } else {
            message.push_back(0);
        }
    }
    gpt2::idle_barrier(comm);
    comm.broadcast_vector(message);
    if (message.empty() || message[0] == 0) return std::nullopt;
    return std::string(message.begin() + 1, message.end());
}

int run(const Options& o, const gpt2::Communicator& world) {
    // With one sample per prompt only rank 0 works: the others wait without taking the CPUs.
    const bool solo = o.num_samples == 1 || world.size() == 1;
    if (solo && !world.is_root()) {
        gpt2::idle_barrier(world);
        return 0;
    }
    const gpt2::Communicator comm = solo ? gpt2::Communicator::single_process() : world;
    const Shared shared = share(o, comm);
    const gpt2::Model& model = *shared.model;
    const gpt2::Tokenizer& tokenizer = *shared.tokenizer;
    gpt2::ThreadPool pool(o.threads > 0 ? o.threads : default_threads(model));
    gpt2::KvCacheSession session(model, pool);
    if (comm.is_root()) {
        std::fprintf(stderr,
                     "%s: %s, tokenizer %s (vocab %d), KV cache + scratch %.1f MiB, %d working "
                     "rank(s) of %d x %d thread(s)\n",
                     o.checkpoint.c_str(), gpt2::describe(model.config).c_str(),
                     std::string(gpt2::tokenizer_kind_name(tokenizer.kind())).c_str(),
                     tokenizer.vocab_size(),
                     static_cast<double>(session.memory_bytes()) / (1 << 20), comm.size(),
                     world.size(), pool.size());
    }

    if (o.interactive) {
        for (std::uint64_t index = 0;; ++index) {
            const std::optional<std::string> line = next_line(comm);
            if (!line) break;
            const std::vector<std::int32_t> prompt =
                encode_prompt(tokenizer, model, *line, "stdin line " + std::to_string(index + 1));
            run_prompt(o, comm, session, tokenizer, prompt, *line, index);
        }
    } else {
        // Rank 0 reads and encodes the prompt; the tokens travel as bytes.
        std::string text = o.prompt;
        std::vector<std::uint8_t> bytes;
        if (comm.is_root()) {
            if (!o.prompt_file.empty()) {
                const auto file = gpt2::read_file_bytes(o.prompt_file);
                text.assign(file.begin(), file.end());
            }
            const std::vector<std::int32_t> prompt = encode_prompt(
                tokenizer, model, text, o.prompt_file.empty() ? "--prompt" : o.prompt_file);
            bytes.resize(prompt.size() * sizeof(std::int32_t));
            std::memcpy(bytes.data(), prompt.data(), bytes.size());
        }
        comm.broadcast_vector(bytes);
        std::vector<std::int32_t> prompt(bytes.size() / sizeof(std::int32_t));
        std::memcpy(prompt.data(), bytes.data(), bytes.size());
        run_prompt(o, comm, session, tokenizer, prompt, text, 0);
    }
    if (solo) gpt2::idle_barrier(world);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    gpt2::select_gemm_kernels(argv);
    gpt2::MpiSession mpi(&argc, &argv);
    const gpt2::Communicator comm;
    auto parsed = parse_options(argc, argv, comm.is_root());
    if (const int* code = std::get_if<int>(&parsed)) return *code;
    const Options& options = std::get<Options>(parsed);
    try {
        return run(options, comm);
    } catch (const std::bad_alloc&) {
        comm.abort("out of memory loading or running " + options.checkpoint);
    } catch (const gpt2::InputError& e) {
        // Bad input is found the same way on every rank that looks, or only on rank 0: either
        // way the whole job must end, and MPI_Abort does that without waiting for anyone.
        comm.abort(e.what(), 2);
    } catch (const std::exception& e) {
        comm.abort(e.what());
    }
}
