// bench_prefill: prompt (prefill) time and the decoding speed after it for the KV-cache session
// in each weight format, on random weights of a preset's shape (GPT-2 124M unless --model says)
// made in memory; prints figures (median of the repetitions, formats interleaved), asserts
// nothing. "fp32-steps" is fp32 with the prompt run as one token's forward after another (what
// prompts of the Llama family did before their products), the peer of "fp32" in the same run.
// scripts/bench_inference.sh measures the same through build/inference beside llama.cpp.
//   build/bench_prefill [--model llama-135M] [--prompt 64,512] [--formats fp32,fp32-steps]
//                       [--new-tokens 32] [--threads 2] [--repeat 5]
#include <time.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/clock.hpp"
#include "model/decode_weights.hpp"
#include "model/kv_cache.hpp"
#include "ops/bf16.hpp"
#include "ops/gemm.hpp"

namespace {

// CPU time of the whole process (all threads), in seconds: with other jobs on the machine, CPU
// time per worker is a steadier guide than wall time to what a quiet machine would take.
double process_cpu_seconds() {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
    gpt2::select_gemm_kernels(argv);
    CLI::App app{"Prefill and decoding speed of the KV-cache session per weight format."};
    std::vector<int> prompts = {64, 512};
    std::vector<std::string> formats = {"fp32", "bf16", "int8"};
    int new_tokens = 32, threads = 2, repeat = 5, layers = 0;
    std::string products = "auto", preset = "gpt2-124M";
    app.add_option("--model", preset, "The preset whose shape the random model takes")
        ->capture_default_str();
    app.add_option("--prompt", prompts, "Prompt lengths in tokens")->delimiter(',');
    app.add_option("--formats", formats,
                   "Weight formats: fp32, bf16, int8, fp32-steps (fp32, the prompt "
                   "token by token)")
        ->delimiter(',');
    app.add_option("--new-tokens", new_tokens, "Tokens decoded after each prefill")
        ->capture_default_str();
    app.add_option("--threads", threads, "Worker threads")->capture_default_str();
    app.add_option("--repeat", repeat, "Repetitions (the median is printed)")
        ->capture_default_str();
    app.add_option("--layers", layers, "Layers (0: the preset's)")->capture_default_str();
    app.add_option("--products", products,
                   "How prompts with compact weights run their products: auto, widened, pieces")
        ->check(CLI::IsMember({"auto", "widened", "pieces"}))
        ->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    const int vocab = preset.starts_with("llama") ? 49152 : 50257;  // SmolLM2's, GPT-2's
    gpt2::ModelConfig config = gpt2::preset_config(preset, vocab);
    if (layers > 0) config.num_layers = layers;
    gpt2::Model model(config);
    gpt2::ThreadPool pool(threads);
    gpt2::init_parameters(model, 1, &pool);
    std::map<std::string, std::unique_ptr<gpt2::DecodeWeights>> compact;
    std::map<std::string, std::unique_ptr<gpt2::KvCacheSession>> sessions;
    for (const std::string& f : formats) {
        if (f != "fp32" && f != "bf16" && f != "int8" && f != "fp32-steps") {
            std::fprintf(stderr, "bench_prefill: --formats: unknown format '%s'\n", f.c_str());
            return 2;
        }
        const gpt2::WeightFormat format = f == "bf16"   ? gpt2::WeightFormat::Bf16
                                          : f == "int8" ? gpt2::WeightFormat::Int8
                                                        : gpt2::WeightFormat::Fp32;
        if (format != gpt2::WeightFormat::Fp32)
            compact[f] = std::make_unique<gpt2::DecodeWeights>(model, format);
        const gpt2::PromptProducts prompt_products =
            products == "widened"  ? gpt2::PromptProducts::Widened
            : products == "pieces" ? gpt2::PromptProducts::Pieces
                                   : gpt2::PromptProducts::Auto;
        sessions[f] = std::make_unique<gpt2::KvCacheSession>(
            model, pool, 0, format == gpt2::WeightFormat::Fp32 ? nullptr : compact[f].get(),
            prompt_products);
    }
    std::printf(
        "bench_prefill: %s shape (L%d: %s), random weights, %d threads, fp32 GEMM %s, "
        "bf16 %s; medians of %d\n",
        preset.c_str(), config.num_layers, gpt2::describe(config.arch).c_str(), threads,
        gpt2::gemm_library_name().c_str(), gpt2::bf16_backend_name(gpt2::bf16_backend()), repeat);
    for (const std::string& f : formats) {
        std::printf("%s prompts: %s\n", f.c_str(),
                    f == "fp32-steps" ? "one token's forward after another"
                                      : sessions[f]->prompt_products_name().c_str());
    }
    std::printf("%-10s %6s | %10s %10s %9s %11s | %12s\n", "format", "prompt", "prefill ms",
                "tok/s", "first ms", "cpu ms/thr", "decode tok/s");
    for (const int P : prompts) {
        std::vector<std::int32_t> tokens(static_cast<std::size_t>(P));
        for (int i = 0; i < P; ++i)
            tokens[static_cast<std::size_t>(i)] = (i * 7919 + 262) % vocab;
        std::map<std::string, std::vector<double>> prefill, prefill_cpu, decode;
        std::map<std::string, double> first;
        for (int r = 0; r < repeat + 1; ++r) {
            for (const std::string& f : formats) {
                gpt2::KvCacheSession& s = *sessions[f];
                const double cpu0 = process_cpu_seconds();
                const auto t0 = gpt2::Clock::now();
                std::span<const float> logits =
                    s.prefill(f == "fp32-steps" ? std::span(tokens).first(1) : tokens);
                if (f == "fp32-steps") {
                    for (std::size_t i = 1; i < tokens.size(); ++i)
                        logits = s.step(tokens[i]);
                }
                const double pre = gpt2::seconds_since(t0);
                const double pre_cpu = (process_cpu_seconds() - cpu0) / threads;
                const auto t1 = gpt2::Clock::now();
                for (int n = 0; n < new_tokens; ++n) {
                    const auto next = static_cast<std::int32_t>(
                        std::max_element(logits.begin(), logits.end()) - logits.begin());
                    logits = s.step(next);
                }
                const double dec = gpt2::seconds_since(t1);
                if (r == 0) {  // the first prompt of this length: shown apart
                    first[f] = pre;
                    continue;
                }
                prefill[f].push_back(pre);
                prefill_cpu[f].push_back(pre_cpu);
                decode[f].push_back(dec);
            }
        }
        for (const std::string& f : formats) {
            const double pre = median(prefill[f]), dec = median(decode[f]);
            std::printf("%-10s %6d | %10.1f %10.0f %9.1f %11.1f | %12.1f\n", f.c_str(), P,
                        pre * 1e3, P / pre, first[f] * 1e3, median(prefill_cpu[f]) * 1e3,
                        new_tokens / dec);
        }
    }
    return 0;
}
