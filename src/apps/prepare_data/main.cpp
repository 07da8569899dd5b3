// prepare_data: tokenizes a text file into llm.c token shards (val first, then train) and writes
// the tokenizer next to them, both serialized (tokenizer.bin) and in llm.c's gpt2_tokenizer.bin
// format.
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "apps/common/cli.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"
#include "data/shard.hpp"
#include "tokenizer/tokenizer.hpp"

namespace fs = std::filesystem;

namespace {

struct Options {
    fs::path input;
    std::string tokenizer;
    int vocab_size = 4096;
    fs::path tokenizer_dir = "data/gpt2";
    fs::path out_dir;
    std::string name;
    double val_fraction = 0.1;
    std::int64_t shard_tokens = 100'000'000;
    int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    std::string eot_in_text = "token";
    std::string log_level = "info";
};

[[nodiscard]] std::string read_input(const fs::path& path) {
    std::string text = gpt2::read_text_file(path);
    if (text.empty()) throw gpt2::InputError(path.string() + ": input file is empty");
    return text;
}

// A one-line progress bar redrawn in place; only drawn when stderr is a terminal, so logs and
// pipes never see carriage returns.
class ProgressBar {
  public:
    explicit ProgressBar(std::size_t total)
        : total_(total),
          enabled_(::isatty(STDERR_FILENO) == 1),
          start_(std::chrono::steady_clock::now()) {}
    ProgressBar(const ProgressBar&) = delete;
    ProgressBar& operator=(const ProgressBar&) = delete;
    ~ProgressBar() {
        if (enabled_ && drawn_) std::fputc('\n', stderr);
    }

    void update(std::size_t done) {
        if (!enabled_ || total_ == 0) return;
        constexpr int kWidth = 40;
        const double fraction = std::min(1.0, static_cast<double>(done) / total_);
        const auto filled = static_cast<int>(fraction * kWidth);
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        const double mb_per_s = seconds > 0 ? done / 1e6 / seconds : 0.0;
        std::fprintf(stderr, "\rtokenizing [%s%s] %5.1f%% %7.2f MB/s",
                     std::string(filled, '#').c_str(), std::string(kWidth - filled, ' ').c_str(),
                     100.0 * fraction, mb_per_s);
        std::fflush(stderr);
        drawn_ = true;
    }

  private:
    std::size_t total_;
    bool enabled_;
    bool drawn_ = false;
    std::chrono::steady_clock::time_point start_;
};

[[nodiscard]] std::unique_ptr<gpt2::Tokenizer> make_tokenizer(const Options& options,
                                                              std::string_view text) {
    if (options.tokenizer == "char") return gpt2::make_char_tokenizer(text);
    if (options.tokenizer == "gpt2") return gpt2::load_gpt2_tokenizer(options.tokenizer_dir);
    const auto start = std::chrono::steady_clock::now();
    auto tokenizer = gpt2::train_bpe_tokenizer(text, options.vocab_size);
    spdlog::info("trained BPE to {} tokens in {:.2f} s", tokenizer->vocab_size(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (tokenizer->vocab_size() < options.vocab_size) {
        spdlog::warn("the corpus ran out of pairs to merge: vocab size is {}, not {}",
                     tokenizer->vocab_size(), options.vocab_size);
    }
    return tokenizer;
}

// Writes tokens as shards of at most shard_tokens each; returns how many were written.
int write_shards(const Options& options, std::string_view split,
                 std::span<const std::int32_t> tokens) {
    int index = 0;
    for (std::size_t begin = 0; begin < tokens.size(); ++index) {
        const std::size_t count = std::min<std::size_t>(
            tokens.size() - begin, static_cast<std::size_t>(options.shard_tokens));
        const fs::path path =
            options.out_dir / fmt::format("{}_{}_{:06d}.bin", options.name, split, index);
        gpt2::write_shard(path, tokens.subspan(begin, count));
        spdlog::info("wrote {} ({} tokens)", path.string(), count);
        begin += count;
    }
    return index;
}

void run(Options options) {
    if (options.name.empty()) options.name = options.input.stem().string();
    const std::string text = read_input(options.input);
    spdlog::info("read {} ({} bytes)", options.input.string(), text.size());

    const std::unique_ptr<gpt2::Tokenizer> tokenizer = make_tokenizer(options, text);
    if (tokenizer->vocab_size() > 65536) {
        throw gpt2::InputError("--vocab-size: " + std::to_string(tokenizer->vocab_size()) +
                               " tokens do not fit llm.c's uint16 shards (at most 65536)");
    }
    spdlog::info("tokenizer: {} with {} tokens", gpt2::tokenizer_kind_name(tokenizer->kind()),
                 tokenizer->vocab_size());

    const auto start = std::chrono::steady_clock::now();
    std::vector<std::int32_t> ids;
    {
        ProgressBar bar(text.size());
        ids = gpt2::encode_blocks(
            *tokenizer, text, options.threads, [&](std::size_t done) { bar.update(done); },
            gpt2::parse_eot_in_text(options.eot_in_text));
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    spdlog::info("encoded {} tokens in {:.2f} s ({:.2f} MB/s)", ids.size(), seconds,
                 seconds > 0 ? text.size() / 1e6 / seconds : 0.0);

    // The validation split is the end of the text (at least one token when asked for); the
    // training split keeps the rest in order.
    std::size_t val_count = 0;
    if (options.val_fraction > 0) {
        val_count = std::max<std::size_t>(
            1, static_cast<std::size_t>(
                   std::llround(static_cast<double>(ids.size()) * options.val_fraction)));
    }
    if (val_count >= ids.size()) {
        throw gpt2::InputError(
            fmt::format("{}: {} tokens are too few to split with --val-fraction {}",
                        options.input.string(), ids.size(), options.val_fraction));
    }
    const std::span<const std::int32_t> all(ids);
    std::error_code ec;
    fs::create_directories(options.out_dir, ec);
    if (ec) throw gpt2::InputError("--out-dir " + options.out_dir.string() + ": " + ec.message());
    if (val_count > 0) write_shards(options, "val", all.last(val_count));
    write_shards(options, "train", all.first(ids.size() - val_count));

    const fs::path serialized_path = options.out_dir / "tokenizer.bin";
    gpt2::write_file_atomically(serialized_path, tokenizer->serialize());
    spdlog::info("wrote {}", serialized_path.string());

    const fs::path llmc_path = options.out_dir / "gpt2_tokenizer.bin";
    try {
        gpt2::write_llmc_tokenizer(*tokenizer, llmc_path);
        spdlog::info("wrote {}", llmc_path.string());
    } catch (const gpt2::InputError& e) {
        // Only token length limits fail here; the shards and tokenizer.bin are still usable.
        spdlog::warn("skipped llm.c's tokenizer file: {}", e.what());
    }
}

}  // namespace

int main(int argc, char** argv) {
    namespace app = gpt2::app;
    CLI::App cli{"Tokenizes a text file into llm.c token shards plus the tokenizer files.",
                 "prepare_data"};
    cli.option_defaults()->always_capture_default();
    Options options;
    app::add_common_flags(cli, options.log_level);
    cli.add_option("--data,--input", options.input,
                   "text file to tokenize (any bytes; --input is the older name)")
        ->required();
    cli.add_option("--tokenizer", options.tokenizer, "char | bpe | gpt2")
        ->required()
        ->check(CLI::IsMember({"char", "bpe", "gpt2"}).description(""))
        ->type_name("NAME");
    cli.add_option("--vocab-size", options.vocab_size,
                   "BPE vocabulary: 256 bytes + merges + <|endoftext|> (257..65536)")
        ->check(app::at_least(257))
        ->check(CLI::Validator(
            [](std::string& value) {
                return std::stod(value) <= 65536 ? std::string()
                                                 : "must be <= 65536 (llm.c's uint16 shards)";
            },
            "", ""));
    cli.add_option("--tokenizer-dir", options.tokenizer_dir,
                   "directory with GPT-2's encoder.json and vocab.bpe");
    cli.add_option("--eot-in-text", options.eot_in_text,
                   "a literal <|endoftext|> in the text: token (the end-of-text token) | text "
                   "(ordinary characters, as llm.c's encode_ordinary)")
        ->check(CLI::IsMember({"token", "text"}).description(""))
        ->type_name("MODE");
    cli.add_option("--out-dir", options.out_dir, "output directory")->required();
    cli.add_option("--name", options.name, "shard name prefix (default: the input's file stem)");
    cli.add_option("--val-fraction", options.val_fraction,
                   "fraction of tokens, from the end of the text, for validation (0..0.99)")
        ->check(app::at_least(0))
        ->check(CLI::Validator(
            [](std::string& value) {
                return std::stod(value) <= 0.99 ? std::string() : "must be <= 0.99";
            },
            "", ""));
    cli.add_option("--shard-tokens", options.shard_tokens, "maximum tokens per shard")
        ->check(app::positive());
    cli.add_option("--threads", options.threads, "encoding threads")->check(app::positive());
    if (const std::optional<int> code = app::parse_command_line(cli, argc, argv)) return *code;
    app::setup_logging(options.log_level, app::LogStream::Stderr);
    try {
        if (options.tokenizer != "bpe" && cli.count("--vocab-size") > 0) {
            spdlog::warn("--vocab-size only applies to --tokenizer bpe; ignored");
        }
        run(options);
    } catch (const gpt2::UsageError& e) {
        std::cerr << app::error_line(e.what()) << std::endl;
        return app::kExitBadFlags;
    } catch (const std::exception& e) {
        std::cerr << app::error_line(e.what()) << std::endl;
        return app::kExitRuntimeError;
    }
    return app::kExitOk;
}
