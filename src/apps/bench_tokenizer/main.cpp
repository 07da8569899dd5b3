// bench_tokenizer: measures GPT-2 tokenizer loading and encoding speed and BPE training time on a
// text file (dev/bench_tokenizer.sh compares the figures with js-tiktoken's).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/clock.hpp"
#include "core/error.hpp"
#include "tokenizer/tokenizer.hpp"

namespace fs = std::filesystem;

namespace {

using gpt2::Clock;
using gpt2::seconds_since;

// Best of `repeat` runs: the least disturbed by other processes on a shared machine.
template <typename F>
[[nodiscard]] double best_seconds(int repeat, F&& run) {
    double best = 1e300;
    for (int i = 0; i < repeat; ++i) {
        const auto start = Clock::now();
        run();
        best = std::min(best, seconds_since(start));
    }
    return best;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Benchmarks GPT-2 encoding and BPE training."};
    fs::path input = "data/tinyshakespeare.txt";
    fs::path tokenizer_dir = "data/gpt2";
    int repeat = 5;
    int threads = 2;
    int bpe_vocab = 4096;
    app.add_option("--input", input, "Text file to encode")->capture_default_str();
    app.add_option("--tokenizer-dir", tokenizer_dir, "Directory with encoder.json and vocab.bpe")
        ->capture_default_str();
    app.add_option("--repeat", repeat, "Runs per measurement (the best is reported)")
        ->capture_default_str()
        ->check(CLI::Range(1, 1000));
    app.add_option("--threads", threads, "Threads for the encode_blocks measurement")
        ->capture_default_str()
        ->check(CLI::Range(1, 1024));
    app.add_option("--bpe-vocab", bpe_vocab, "BPE vocab size to time training for (0: skip)")
        ->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    try {
        std::ifstream file(input, std::ios::binary);
        if (!file) throw gpt2::InputError(input.string() + ": cannot open input file");
        const std::string text{std::istreambuf_iterator<char>(file),
                               std::istreambuf_iterator<char>()};
        const double mb = static_cast<double>(text.size()) / 1e6;
        std::printf("input: %s (%.2f MB)\n", input.c_str(), mb);

        std::unique_ptr<gpt2::Tokenizer> tokenizer;
        const double load =
            best_seconds(repeat, [&] { tokenizer = gpt2::load_gpt2_tokenizer(tokenizer_dir); });
        std::printf("gpt2 load: %.3f s\n", load);

        std::size_t count = 0;
        const double encode = best_seconds(repeat, [&] { count = tokenizer->encode(text).size(); });
        std::printf("gpt2 encode, 1 thread: %.2f MB/s (%zu tokens in %.3f s)\n", mb / encode, count,
                    encode);
        const double blocks = best_seconds(
            repeat, [&] { count = gpt2::encode_blocks(*tokenizer, text, threads).size(); });
        std::printf("gpt2 encode_blocks, %d threads: %.2f MB/s (%zu tokens in %.3f s)\n", threads,
                    mb / blocks, count, blocks);

        if (bpe_vocab > 0) {
            int vocab = 0;
            const double train = best_seconds(std::min(repeat, 3), [&] {
                vocab = gpt2::train_bpe_tokenizer(text, bpe_vocab)->vocab_size();
            });
            std::printf("bpe train to %d tokens: %.3f s\n", vocab, train);
        }
    } catch (const gpt2::InputError& e) {
        std::fprintf(stderr, "bench_tokenizer: %s\n", e.what());
        return 1;
    }
    return 0;
}
