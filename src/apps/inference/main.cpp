// inference: text generation from a checkpoint with the KV-cache generator
// (build/inference CHECKPOINT [flags]; --help lists them). Under mpirun rank 0 loads and
// broadcasts the model, the samples are shared between ranks and rank 0 prints them in order.
// Generated text goes to stdout (always valid UTF-8); statistics and diagnostics to stderr.
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <iterator>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "apps/common/cli.hpp"
#include "core/bytes.hpp"
#include "core/error.hpp"
#include "core/utf8.hpp"
#include "formats/checkpoint.hpp"
#include "formats/model_file.hpp"
#include "model/decode_weights.hpp"
#include "model/kv_cache.hpp"
#include "ops/gemm.hpp"
#include "parallel/comm.hpp"
#include "tokenizer/tokenizer.hpp"
#include "train/resume_state.hpp"

namespace {

namespace app = gpt2::app;

// GPT-2's vocabulary: a plain llm.c model file of this size is taken to be a GPT-2.
// --prompt-file's name for standard input.
constexpr std::string_view kStdinName = "-";

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
    std::string tokenizer_dir = "data/gpt2";
    std::string tokenizer_corpus;
    std::string log_level = "info";
    std::string eot_in_text = "token";
    std::string weights = "fp32";

    [[nodiscard]] gpt2::WeightFormat weight_format() const {
        return weights == "bf16"   ? gpt2::WeightFormat::Bf16
               : weights == "int8" ? gpt2::WeightFormat::Int8
                                   : gpt2::WeightFormat::Fp32;
    }

    [[nodiscard]] bool prompt_from_stdin() const { return prompt_file == kStdinName; }
};

void validate(const Options& o) {
    const bool rebuilt = o.tokenizer == "char" || o.tokenizer == "bpe";
    if (rebuilt && o.tokenizer_corpus.empty()) {
        throw gpt2::InputError("--tokenizer " + o.tokenizer +
                               " needs --tokenizer-corpus FILE (its source text)");
    }
}

// Options, or the exit code when parsing ends the program (--help, --version, bad flags). Only the
// speaker prints, so that N ranks parsing the same command line report a bad flag once (every
// rank reaches the same verdict, so none waits for another).
std::variant<Options, int> parse_options(int argc, char** argv, bool speaker) {
    Options o;
    CLI::App app{"Generate text from a GPT-2 checkpoint (KV cache; MPI shares the samples)",
                 "inference"};
    app.option_defaults()->always_capture_default();
    app::add_common_flags(app, o.log_level);
    app.add_option("checkpoint", o.checkpoint,
                   "checkpoint, llm.c model file, or Hugging Face GPT-2 (directory or "
                   "model.safetensors)")
        ->required()
        ->type_name("MODEL");
    auto* prompt = app.add_option("--prompt", o.prompt, "prompt text (none: end-of-text)");
    auto* prompt_file =
        app.add_option("--prompt-file", o.prompt_file,
                       "read the prompt from FILE, as is ('-': all of standard input)")
            ->type_name("FILE");
    prompt->excludes(prompt_file);
    app.add_option("--max-new-tokens,--sample-tokens", o.max_new_tokens,
                   "tokens to generate per sample")
        ->check(app::at_least(0));
    app.add_option("--temperature", o.temperature, "softmax temperature (0: greedy)")
        ->check(app::at_least(0));
    app.add_option("--top-k", o.top_k, "sample among the k most likely tokens (0: all)")
        ->check(app::at_least(0));
    app.add_option("--top-p", o.top_p, "nucleus sampling: smallest set with this mass, in (0, 1]")
        ->check(app::in_unit_interval());
    app.add_option("--seed", o.seed, "sample m draws from a stream derived from (seed, m)");
    app.add_option("--num-samples", o.num_samples, "samples per prompt (shared between ranks)")
        ->check(app::positive());
    app.add_flag("--stream,!--no-stream", o.stream,
                 "print each token as it is generated (the default; --no-stream prints each "
                 "sample when it is done)");
    auto* interactive =
        app.add_flag("--interactive", o.interactive,
                     "read prompts from stdin, one per line, until end of file (a line that "
                     "cannot be encoded is reported and skipped)");
    interactive->excludes(prompt)->excludes(prompt_file);
    app.add_option("--weights", o.weights,
                   "fp32 | bf16 | int8: the matrices' format for decoding (int8: per-row scales; "
                   "fewer bytes per token, so faster; with either, the K/V cache is bf16)")
        ->check(CLI::IsMember({"fp32", "bf16", "int8"}).description(""))
        ->type_name("NAME");
    app.add_option(
           "--threads", o.threads,
           "worker threads per rank (0: the CPUs available, 1 for models under 16M parameters)")
        ->check(app::at_least(0));
    app.add_option("--tokenizer", o.tokenizer,
                   "for a model file without a tokenizer: gpt2 (from --tokenizer-dir), or char | "
                   "bpe (rebuilt from --tokenizer-corpus); none: a checkpoint's own, or gpt2 for "
                   "a model of GPT-2's vocabulary (50257)")
        ->check(CLI::IsMember({"char", "bpe", "gpt2"}));
    app.add_option("--tokenizer-dir", o.tokenizer_dir,
                   "directory with GPT-2's encoder.json and vocab.bpe")
        ->type_name("DIR");
    app.add_option("--eot-in-text", o.eot_in_text,
                   "a literal <|endoftext|> in a prompt: token (the end-of-text token) | text "
                   "(ordinary characters)")
        ->check(CLI::IsMember({"token", "text"}).description(""))
        ->type_name("MODE");
    app.add_option("--tokenizer-corpus", o.tokenizer_corpus,
                   "text the char or bpe tokenizer was built from (--tokenizer char|bpe)")
        ->type_name("FILE");
    if (const std::optional<int> code = app::parse_command_line(app, argc, argv, speaker)) {
        return *code;
    }
    try {
        validate(o);
    } catch (const gpt2::InputError& e) {
        if (speaker) std::cerr << app::error_line(e.what()) << std::endl;
        return app::kExitBadFlags;
    }
    return o;
}

std::string_view as_text(const std::vector<std::uint8_t>& bytes) {
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

// Refuses a training resume state given where a model belongs, naming the model file to use.
void refuse_resume_state(const std::string& path) {
    if (!gpt2::is_resume_state_file(path)) return;
    const std::optional<std::int64_t> step = gpt2::checkpoint_step(path);
    const std::string model =
        step ? gpt2::model_path("", *step).string() : std::string("the model_N.bin");
    throw gpt2::InputError(path +
                           " is a training resume state (optimizer moments), not a model: use " +
                           model + " from the same directory");
}

// The tokenizer --tokenizer asks for, and how to name it in messages.
struct Requested {
    std::unique_ptr<gpt2::Tokenizer> tokenizer;
    std::string origin;
};

Requested requested_tokenizer(const Options& o, int vocab_size) {
    if (o.tokenizer == "gpt2") {
        return {gpt2::load_gpt2_tokenizer(o.tokenizer_dir), "from " + o.tokenizer_dir};
    }
    const std::vector<std::uint8_t> corpus = gpt2::read_file_bytes(o.tokenizer_corpus);
    auto tokenizer = o.tokenizer == "char" ? gpt2::make_char_tokenizer(as_text(corpus))
                                           : gpt2::train_bpe_tokenizer(as_text(corpus), vocab_size);
    return {std::move(tokenizer), "rebuilt from " + o.tokenizer_corpus};
}

// Rank 0's view of the checkpoint before it is shared: model and serialized tokenizer.
struct Loaded {
    std::optional<gpt2::Model> model;
    std::vector<std::uint8_t> tokenizer;
};

// Reads the model and chooses its tokenizer: a checkpoint's own (which a --tokenizer must then
// reproduce exactly), else --tokenizer (whose vocabulary must be the model's), else GPT-2's for a
// model of GPT-2's vocabulary. A tokenizer whose vocabulary cannot be the model's would turn
// every generated id into the wrong text, so it is refused rather than used.
Loaded load(const Options& o) {
    refuse_resume_state(o.checkpoint);
    std::vector<std::string> notes;
    gpt2::LoadedModel file = gpt2::load_model_file(o.checkpoint, &notes);
    for (const std::string& note : notes)
        spdlog::info("{}", note);
    const int V = file.model.config.vocab_size;
    std::unique_ptr<gpt2::Tokenizer> own;
    if (file.extras && !file.extras->tokenizer.empty()) {
        try {
            own = gpt2::deserialize_tokenizer(file.extras->tokenizer);
        } catch (const std::exception& e) {
            throw gpt2::InputError(o.checkpoint + ": its tokenizer is unreadable: " + e.what());
        }
    }
    const auto name = [](const gpt2::Tokenizer& t) {
        return std::string(gpt2::tokenizer_kind_name(t.kind())) + " (vocab " +
               std::to_string(t.vocab_size()) + ")";
    };

    std::unique_ptr<gpt2::Tokenizer> tokenizer;
    std::string origin;
    if (!o.tokenizer.empty()) {
        Requested requested = requested_tokenizer(o, V);
        if (own && requested.tokenizer->serialize() != own->serialize()) {
            throw gpt2::UsageError(o.checkpoint + " carries its own tokenizer, " + name(*own) +
                                   ", and --tokenizer " + o.tokenizer + " (" + requested.origin +
                                   ") is a different one, " + name(*requested.tokenizer) +
                                   ": leave out --tokenizer to use the checkpoint's");
        }
        if (!own && requested.tokenizer->vocab_size() != V) {
            throw gpt2::UsageError(o.checkpoint + ": the model's vocabulary has " +
                                   std::to_string(V) + " tokens but --tokenizer " + o.tokenizer +
                                   " (" + requested.origin + ") has " +
                                   std::to_string(requested.tokenizer->vocab_size()) +
                                   ": a tokenizer must have exactly the model's vocabulary");
        }
        tokenizer = std::move(requested.tokenizer);
        origin = requested.origin;
    } else if (own) {
        tokenizer = std::move(own);
        origin = "from the checkpoint";
    } else if (V == gpt2::kGpt2VocabSize) {
        spdlog::info(
            "{} has no tokenizer; its vocabulary ({}) is GPT-2's, so it uses the GPT-2 "
            "tokenizer from {} (--tokenizer to choose another)",
            o.checkpoint, V, o.tokenizer_dir);
        try {
            tokenizer = gpt2::load_gpt2_tokenizer(o.tokenizer_dir);
        } catch (const gpt2::InputError& e) {
            throw gpt2::InputError(o.checkpoint + " needs the GPT-2 tokenizer (it has none), " +
                                   "which could not be loaded: " + e.what() +
                                   " (--tokenizer-dir DIR names its directory)");
        }
        origin = "from " + o.tokenizer_dir;
    } else {
        // GPT-2's tokenizer cannot fit this vocabulary, so only the rebuilt ones are offered.
        throw gpt2::InputError(o.checkpoint + ": has no tokenizer, and its vocabulary (" +
                               std::to_string(V) + " tokens) is not GPT-2's (" +
                               std::to_string(gpt2::kGpt2VocabSize) +
                               "): pass --tokenizer char|bpe --tokenizer-corpus FILE (the text "
                               "its tokenizer was built from)");
    }
    // A checkpoint may carry a smaller tokenizer than its model (trained from a larger model's
    // weights): generation then samples only the ids the tokenizer can print.
    if (tokenizer->vocab_size() > V) {
        throw gpt2::InputError("the tokenizer's vocabulary (" +
                               std::to_string(tokenizer->vocab_size()) +
                               " tokens) is larger than the model's vocab_size (" +
                               std::to_string(V) + ") in " + o.checkpoint);
    }
    spdlog::info("loaded {}: model {}, tokenizer {}, {}", o.checkpoint,
                 gpt2::describe(file.model.config), name(*tokenizer), origin);
    Loaded out;
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
    comm.idle_barrier();
    gpt2::ShapeInts shape{};
    if (comm.is_root()) shape = gpt2::to_shape_ints(loaded.model->config);
    comm.broadcast(std::span<std::int32_t>(shape));
    if (!comm.is_root()) loaded.model.emplace(gpt2::from_shape_ints(shape));
    comm.broadcast(loaded.model->params.span());
    comm.broadcast_vector(loaded.tokenizer);
    return Shared{std::move(loaded.model), gpt2::deserialize_tokenizer(loaded.tokenizer)};
}

// Whether standard input is a pipe or a file with bytes in it: text meant as a prompt that no
// flag reads, which must not be ignored in silence. Never blocks: a pipe with nothing in it yet
// counts as empty, and a terminal or /dev/null is not looked at. Consumes at most one byte (the
// program then stops anyway).
[[nodiscard]] bool stdin_holds_data() {
    struct stat status {};
    if (::fstat(STDIN_FILENO, &status) != 0) return false;
    if (!S_ISFIFO(status.st_mode) && !S_ISREG(status.st_mode)) return false;
    pollfd fd{STDIN_FILENO, POLLIN, 0};
    if (::poll(&fd, 1, 0) != 1 || (fd.revents & POLLIN) == 0) return false;
    char byte = 0;
    return ::read(STDIN_FILENO, &byte, 1) == 1;  // 0: end of input, nothing was there
}

// The prompt's tokens; an empty prompt starts from end-of-text, or "\n" for the char tokenizer
// (which has no end-of-text), or token 0. InputError naming `source` if it cannot be encoded.
std::vector<std::int32_t> encode_prompt(const gpt2::Tokenizer& tokenizer, const gpt2::Model& model,
                                        std::string_view text, std::string_view source,
                                        gpt2::EotInText eot) {
    std::vector<std::int32_t> tokens;
    if (!text.empty()) {
        try {
            tokens = tokenizer.encode(text, eot);
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
        spdlog::warn("{}: {} prompt tokens, only the last {} fit the context", source,
                     tokens.size(), maxT);
    }
    return tokens;
}

// One finished sample, as rank 0 prints it; serialized to travel to rank 0.
struct Sample {
    std::uint32_t index = 0;
    gpt2::GenerationStats stats;
    std::string text;  // the generated bytes, as the tokens spell them (not yet sanitized)
};

void serialize(const Sample& s, gpt2::ByteWriter& out) {
    out.put(s.index);
    out.put(s.stats.prompt_tokens);
    out.put(s.stats.generated_tokens);
    out.put(s.stats.slides);
    out.put(s.stats.prefill_seconds);
    out.put(s.stats.generate_seconds);
    out.put(static_cast<std::uint64_t>(s.text.size()));
    out.raw(s.text);
}

std::vector<Sample> deserialize(std::span<const std::uint8_t> bytes) {
    std::vector<Sample> samples;
    gpt2::ByteReader in(bytes, "inference: sample message");
    while (in.remaining() > 0) {
        Sample s;
        s.index = in.get<std::uint32_t>("index");
        s.stats.prompt_tokens = in.get<int>("prompt tokens");
        s.stats.generated_tokens = in.get<int>("generated tokens");
        s.stats.slides = in.get<int>("slides");
        s.stats.prefill_seconds = in.get<double>("prefill seconds");
        s.stats.generate_seconds = in.get<double>("generate seconds");
        const auto size = in.get<std::uint64_t>("text size");
        if (size > in.remaining()) in.fail("short sample message");
        s.text = std::string(in.raw(static_cast<std::size_t>(size), "text"));
        samples.push_back(std::move(s));
    }
    return samples;
}

void write_out(std::string_view bytes) {
    std::fwrite(bytes.data(), 1, bytes.size(), stdout);
    std::fflush(stdout);
}

// Rank 0's stdout for one sample: prompt and generated bytes go through one UTF-8 sanitizer, so a
// character split between tokens (or between the prompt and the first token) prints whole, and
// bytes that are no UTF-8 at all print as U+FFFD.
class SamplePrinter {
  public:
    SamplePrinter(const Options& o, std::uint32_t index) {
        if (o.num_samples > 1) {
            write_out("--- sample " + std::to_string(index + 1) + "/" +
                      std::to_string(o.num_samples) + " ---\n");
        }
    }
    void text(std::string_view bytes) { write_out(utf8_.push(bytes)); }
    void end() { write_out(utf8_.finish() + "\n"); }

  private:
    gpt2::Utf8Sanitizer utf8_;
};

void log_stats(const Sample& s) {
    const gpt2::GenerationStats& st = s.stats;
    const double per_token =
        st.generated_tokens > 0 ? st.generate_seconds / st.generated_tokens : 0.0;
    spdlog::info(
        "stats: sample={} prompt_tokens={} generated_tokens={} prefill_ms={:.2f} "
        "generate_ms={:.2f} tokens_per_s={:.2f} ms_per_token={:.3f} slides={}",
        s.index + 1, st.prompt_tokens, st.generated_tokens, st.prefill_seconds * 1e3,
        st.generate_seconds * 1e3, per_token > 0.0 ? 1.0 / per_token : 0.0, per_token * 1e3,
        st.slides);
}

void print_finished(const Options& o, const Sample& s, std::string_view prompt_text) {
    SamplePrinter printer(o, s.index);
    printer.text(prompt_text);
    printer.text(s.text);
    printer.end();
    log_stats(s);
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
// derived from (seed, m, prompt_index). Only rank 0 needs `prompt_text`.
void run_prompt(const Options& o, const gpt2::Communicator& comm, gpt2::KvCacheSession& session,
                const gpt2::Tokenizer& tokenizer, std::span<const std::int32_t> prompt,
                std::string_view prompt_text, std::uint64_t prompt_index) {
    const gpt2::SamplingParams params{o.temperature, o.top_k, o.top_p};
    const auto count = static_cast<std::uint32_t>(o.num_samples);
    const auto size = static_cast<std::uint32_t>(comm.size());
    const auto rank = static_cast<std::uint32_t>(comm.rank());
    gpt2::ByteWriter outbox;
    std::vector<Sample> own;
    std::vector<std::int32_t> tokens;
    tokens.reserve(prompt.size() + static_cast<std::size_t>(o.max_new_tokens));
    for (std::uint32_t m = rank; m < count; m += size) {
        // Rank 0 can print sample m as it is made only if every earlier sample is printed.
        const bool live = comm.is_root() && (m == 0 || size == 1);
        Sample sample;
        sample.index = m;
        std::optional<SamplePrinter> printer;
        if (live) {
            printer.emplace(o, m);
            printer->text(prompt_text);
        }
        tokens.assign(prompt.begin(), prompt.end());
        gpt2::Rng rng = gpt2::Rng::derived(o.seed, m, prompt_index);
        const auto on_token = [&](std::int32_t id) {
            const std::string bytes = tokenizer.token_bytes(id);
            if (live && o.stream) {
                printer->text(bytes);
            } else {
                sample.text += bytes;
            }
        };
        sample.stats = gpt2::generate_kv(session, tokens, o.max_new_tokens, params, rng, on_token,
                                         tokenizer.vocab_size());
        if (live) {
            printer->text(sample.text);
            printer->end();
            log_stats(sample);
        } else if (comm.is_root()) {
            own.push_back(std::move(sample));
        } else {
            serialize(sample, outbox);
        }
    }
    if (comm.size() == 1) return;  // a single rank printed every sample as it was made
    // Ranks done early sleep here rather than spin inside the gather.
    comm.idle_barrier();
    const auto inboxes = comm.gather_bytes(outbox.bytes());
    if (!comm.is_root()) return;
    std::vector<std::optional<Sample>> by_index(count);
    for (Sample& s : own)
        by_index[s.index].emplace(std::move(s));
    for (const auto& inbox : inboxes) {
        for (Sample& s : deserialize(inbox)) {
            if (s.index < count) by_index[s.index].emplace(std::move(s));
        }
    }
    for (const auto& s : by_index) {
        if (s) print_finished(o, *s, prompt_text);  // sample 0 was printed live
    }
}

// One prompt of --interactive: its tokens (on every rank), its text (on rank 0, which prints it)
// and its stdin line number (1-based; it also seeds the samples).
struct Prompt {
    std::uint64_t line = 0;
    std::vector<std::int32_t> tokens;
    std::string text;
};

// Rank 0 reads stdin lines until one encodes, reporting and skipping those that do not (one bad
// line must not end a session), and shares its tokens; nullopt at end of input.
std::optional<Prompt> next_prompt(const gpt2::Communicator& comm, const gpt2::Tokenizer& tokenizer,
                                  const gpt2::Model& model, gpt2::EotInText eot,
                                  std::uint64_t& lines_read) {
    Prompt prompt;
    std::vector<std::uint8_t> message;  // [line number (8 bytes), token ids...], empty at the end
    if (comm.is_root()) {
        std::string line;
        while (std::getline(std::cin, line)) {
            ++lines_read;
            try {
                prompt.tokens = encode_prompt(tokenizer, model, line,
                                              "stdin line " + std::to_string(lines_read), eot);
            } catch (const gpt2::InputError& e) {
                spdlog::warn("{}; skipped, going on with the next line", e.what());
                continue;
            }
            prompt.line = lines_read;
            prompt.text = std::move(line);
            gpt2::ByteWriter out;
            out.put(prompt.line);
            for (const std::int32_t t : prompt.tokens)
                out.put(t);
            message = out.take();
            break;
        }
    }
    comm.idle_barrier();
    comm.broadcast_vector(message);
    if (message.empty()) return std::nullopt;
    if (!comm.is_root()) {
        gpt2::ByteReader in(message, "inference: prompt message");
        prompt.line = in.get<std::uint64_t>("line");
        prompt.tokens.resize(in.remaining() / sizeof(std::int32_t));
        for (std::int32_t& t : prompt.tokens)
            t = in.get<std::int32_t>("token");
    }
    return prompt;
}

// The single prompt (--prompt, --prompt-file or none), read and encoded by rank 0; every rank
// gets the tokens, rank 0 also the text.
Prompt single_prompt(const Options& o, const gpt2::Communicator& comm,
                     const gpt2::Tokenizer& tokenizer, const gpt2::Model& model) {
    Prompt prompt;
    std::vector<std::uint8_t> bytes;
    if (comm.is_root()) {
        std::string source = "--prompt";
        if (o.prompt_from_stdin()) {
            source = "standard input (--prompt-file -)";
            prompt.text.assign(std::istreambuf_iterator<char>(std::cin),
                               std::istreambuf_iterator<char>());
            if (std::cin.bad()) throw gpt2::InputError(source + ": read error");
        } else if (!o.prompt_file.empty()) {
            source = o.prompt_file;
            const auto file = gpt2::read_file_bytes(o.prompt_file);
            prompt.text.assign(file.begin(), file.end());
        } else {
            prompt.text = o.prompt;
        }
        try {
            prompt.tokens = encode_prompt(tokenizer, model, prompt.text, source,
                                          gpt2::parse_eot_in_text(o.eot_in_text));
        } catch (const gpt2::InputError& e) {
            // --prompt is the command line's own text; a file's content is a bad input file.
            if (o.prompt_file.empty()) throw gpt2::UsageError(e.what());
            throw;
        }
        bytes.resize(prompt.tokens.size() * sizeof(std::int32_t));
        std::memcpy(bytes.data(), prompt.tokens.data(), bytes.size());
    }
    comm.broadcast_vector(bytes);
    prompt.tokens.resize(bytes.size() / sizeof(std::int32_t));
    std::memcpy(prompt.tokens.data(), bytes.data(), bytes.size());
    return prompt;
}

int run(const Options& o, const gpt2::Communicator& world) {
    // With one sample per prompt only rank 0 works: the others wait without taking the CPUs.
    const bool solo = o.num_samples == 1 || world.size() == 1;
    if (solo && !world.is_root()) {
        world.idle_barrier();
        return app::kExitOk;
    }
    const gpt2::Communicator comm = solo ? gpt2::Communicator::single_process() : world;
    const Shared shared = share(o, comm);
    const gpt2::Model& model = *shared.model;
    const gpt2::Tokenizer& tokenizer = *shared.tokenizer;
    // Checked once the model is loaded, when text piped in has most likely arrived (under mpirun
    // it travels through mpirun first).
    if (comm.is_root() && !o.interactive && !o.prompt_from_stdin() && stdin_holds_data()) {
        throw gpt2::UsageError(
            "standard input holds text that nothing reads: pass --interactive (one prompt per "
            "line) or --prompt-file - (all of it as one prompt)");
    }
    gpt2::ThreadPool pool(o.threads > 0 ? o.threads : default_threads(model));
    std::unique_ptr<gpt2::DecodeWeights> compact;
    if (o.weight_format() != gpt2::WeightFormat::Fp32) {
        compact = std::make_unique<gpt2::DecodeWeights>(model, o.weight_format());
        spdlog::info(
            "weights {} for decoding: matrices {:.1f} MiB (fp32: {:.1f} MiB)",
            gpt2::weight_format_name(o.weight_format()),
            static_cast<double>(compact->bytes()) / (1 << 20),
            static_cast<double>(gpt2::decode_matrix_count(model) * sizeof(float)) / (1 << 20));
    }
    gpt2::KvCacheSession session(model, pool, 0, compact.get());
    spdlog::info("KV cache + scratch {:.1f} MiB, {} working rank(s) of {} x {} thread(s)",
                 static_cast<double>(session.memory_bytes()) / (1 << 20), comm.size(), world.size(),
                 pool.size());

    if (o.interactive) {
        std::uint64_t lines_read = 0;
        while (const std::optional<Prompt> prompt = next_prompt(
                   comm, tokenizer, model, gpt2::parse_eot_in_text(o.eot_in_text), lines_read)) {
            run_prompt(o, comm, session, tokenizer, prompt->tokens, prompt->text, prompt->line - 1);
        }
    } else {
        const Prompt prompt = single_prompt(o, comm, tokenizer, model);
        run_prompt(o, comm, session, tokenizer, prompt.tokens, prompt.text, 0);
    }
    if (solo) world.idle_barrier();
    return app::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
    gpt2::select_gemm_kernels(argv);
    gpt2::MpiSession mpi(&argc, &argv);
    const gpt2::Communicator comm;
    auto parsed = parse_options(argc, argv, comm.is_root());
    if (const int* code = std::get_if<int>(&parsed)) return *code;
    const Options& options = std::get<Options>(parsed);
    app::setup_logging(options.log_level, app::LogStream::Stderr, comm.rank(), comm.size());
    // An error is found the same way on every rank that looks, or only on rank 0: either way the
    // whole job must end, and MPI_Abort does that without waiting for anyone.
    try {
        return run(options, comm);
    } catch (const std::bad_alloc&) {
        comm.abort("out of memory loading or running " + options.checkpoint,
                   app::kExitRuntimeError);
    } catch (const gpt2::UsageError& e) {
        comm.abort(e.what(), app::kExitBadFlags);
    } catch (const std::exception& e) {
        comm.abort(e.what(), app::kExitRuntimeError);
    }
}
