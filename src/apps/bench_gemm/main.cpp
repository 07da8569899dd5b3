// Prints GFLOP/s of this build's fp32 (OpenBLAS, or oneDNN's sgemm with --library onednn) and bf16
// (oneDNN) matrix products on GPT-2 124M's shapes in the three layouts training uses: forward
// x@W^T (nt), dX = dY@W (nn) and dW += dY^T@X (tn); on one thread, and per thread with --threads N
// threads calling at once on their own buffers, as the workers do; then attention's fp32 panel
// products. Each product on GPT-2's matrix shapes has its sampled entries checked against a
// double-precision sum first (a wrong or thread-unsafe kernel says so instead of a figure). Last,
// one core's instruction peaks: fp32 multiply-adds and (with AVX512_BF16) bf16 dot products, the
// ceiling of what bf16 products without AMX can gain. A benchmark, not a test: it prints figures.
//   build/bench_gemm [ROWS=512] [--threads N=1] [--library openblas|onednn]
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/clock.hpp"
#include "ops/bf16.hpp"
#include "ops/gemm.hpp"
#include "ops/peak_flops.hpp"

namespace {

struct Shape {
    const char* name;
    int in, out;
};

// One thread's operands for a shape: x (M,K), w (N,K), y (M,N), dw (N,K), and their bf16 copies.
struct Operands {
    Operands(int M, int K, int N, unsigned seed)
        : x(count(M, K)),
          w(count(N, K)),
          y(count(M, N)),
          dw(count(N, K)),
          xb(x.size()),
          wb(w.size()),
          yb(y.size()) {
        std::mt19937 rng(seed);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        for (auto* buffer : {&x, &w, &y})
            for (float& v : buffer->span())
                v = normal(rng);
        gpt2::convert_to_bf16(xb.data(), x.data(), x.size());
        gpt2::convert_to_bf16(wb.data(), w.data(), w.size());
        gpt2::convert_to_bf16(yb.data(), y.data(), y.size());
    }
    static std::size_t count(int a, int b) { return static_cast<std::size_t>(a) * b; }
    gpt2::AlignedBuffer<float> x, w, y, dw;
    gpt2::AlignedBuffer<gpt2::Bf16> xb, wb, yb;
};

// The largest relative error of y = x @ w^T at 64 sampled entries against a double sum, relative
// to the sum of the products' magnitudes (what float rounding is measured against).
double sampled_error(const Operands& o, int M, int K, int N) {
    double worst = 0.0;
    for (int s = 0; s < 64; ++s) {
        const int i = (s * 7919) % M, j = (s * 104729) % N;
        double sum = 0.0, magnitude = 0.0;
        for (int k = 0; k < K; ++k) {
            const double p = static_cast<double>(o.x[static_cast<std::size_t>(i) * K + k]) *
                             o.w[static_cast<std::size_t>(j) * K + k];
            sum += p;
            magnitude += std::abs(p);
        }
        worst = std::max(worst, std::abs(o.y[static_cast<std::size_t>(i) * N + j] - sum) /
                                    std::max(magnitude, 1e-30));
    }
    return worst;
}

// `call(t)` once on each of `threads` threads at once.
void run_at_once(int threads, const std::function<void(int)>& call) {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
        pool.emplace_back([&, t] { call(t); });
    for (std::thread& thread : pool)
        thread.join();
}

// Seconds per call of `call(t)` on each of `threads` threads started together (the slowest).
double seconds_per_call(int threads, const std::function<void(int)>& call) {
    std::vector<double> seconds(static_cast<std::size_t>(threads));
    std::barrier start(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
            call(t);  // warm-up: primitive creation, first touch
            start.arrive_and_wait();
            int calls = 0;
            const gpt2::Clock::time_point begin = gpt2::Clock::now();
            double elapsed = 0.0;
            while (elapsed < 0.5) {
                call(t);
                ++calls;
                elapsed = gpt2::seconds_since(begin);
            }
            seconds[static_cast<std::size_t>(t)] = elapsed / calls;
        });
    }
    for (std::thread& thread : pool)
        thread.join();
    return *std::max_element(seconds.begin(), seconds.end());
}

// GFLOP/s per thread of `flops`-FLOP calls of `call` on each thread's own item at once.
template <typename Item>
double gflops_per_thread(double flops, std::vector<Item>& items,
                         const std::function<void(Item&)>& call) {
    const int threads = static_cast<int>(items.size());
    return flops /
           seconds_per_call(threads, [&](int t) { call(items[static_cast<std::size_t>(t)]); }) *
           1e-9;
}

}  // namespace

int main(int argc, char** argv) {
    gpt2::select_gemm_kernels(argv);
    const char* usage =
        "usage: bench_gemm [ROWS=512] [--threads N=1] [--library openblas|onednn]\n";
    int rows = 512, threads = 1;
    std::string library = "openblas";
    for (int a = 1; a < argc; ++a) {
        if (std::strcmp(argv[a], "--help") == 0 || std::strcmp(argv[a], "-h") == 0) {
            std::printf("%s", usage);
            return 0;
        }
        if (std::strcmp(argv[a], "--threads") == 0 && a + 1 < argc) {
            threads = std::atoi(argv[++a]);
        } else if (std::strcmp(argv[a], "--library") == 0 && a + 1 < argc) {
            library = argv[++a];
        } else {
            rows = std::atoi(argv[a]);
        }
    }
    if (rows < 1 || threads < 1 || (library != "openblas" && library != "onednn")) {
        std::fprintf(stderr, "%s", usage);
        return 2;
    }
    if (library == "openblas" && threads > gpt2::openblas_calls_at_once()) {
        std::fprintf(stderr,
                     "--threads %d: OpenBLAS takes at most %d threads at once (--library onednn)\n",
                     threads, gpt2::openblas_calls_at_once());
        return 2;
    }
    gpt2::set_gemm_library(library == "onednn" ? gpt2::GemmLibrary::OneDnn
                                               : gpt2::GemmLibrary::OpenBlas);
    std::printf("bench_gemm: %d rows, %d thread(s) calling at once; fp32 on %s, bf16 on %s\n", rows,
                threads, gpt2::gemm_library_name().c_str(),
                gpt2::bf16_backend_name(gpt2::bf16_backend()));
    std::printf("%-10s %5s %5s | %9s %9s %9s | %9s %9s %9s  GFLOP/s per thread\n", "shape", "in",
                "out", "fp32 nt", "fp32 nn", "fp32 tn", "bf16 nt", "bf16 nn", "bf16 tn");
    for (const Shape s :
         {Shape{"qkv", 768, 2304}, Shape{"attproj", 768, 768}, Shape{"fc", 768, 3072},
          Shape{"fcproj", 3072, 768}, Shape{"lm_head", 768, 50304}}) {
        const int M = rows, K = s.in, N = s.out;
        std::vector<Operands> ops;
        for (int t = 0; t < threads; ++t)
            ops.emplace_back(M, K, N, 1 + static_cast<unsigned>(t));
        // Correctness first, every thread at once: fp32 to float rounding (K terms: K * 2^-24 of
        // the magnitudes, with a factor 4 to spare).
        run_at_once(threads, [&](int t) {
            Operands& o = ops[static_cast<std::size_t>(t)];
            gpt2::gemm_nt(M, N, K, 1, o.x.data(), K, o.w.data(), K, 0, o.y.data(), N);
        });
        double fp32_error = 0.0;
        for (const Operands& o : ops)
            fp32_error = std::max(fp32_error, sampled_error(o, M, K, N));
        if (fp32_error > 4.0 * K * 0x1p-24) {
            std::printf("%-10s fp32 products wrong: relative error %.2e\n", s.name, fp32_error);
            return 1;
        }
        const double flops = 2.0 * M * N * K;
        const auto gflops = [&](const std::function<void(Operands&)>& call) {
            return gflops_per_thread(flops, ops, call);
        };
        // out(M,N) = x(M,K) @ w(N,K)^T; dx(M,K) = dy(M,N) @ w(N,K); dw(N,K) += dy^T @ x.
        const double f_nt = gflops([&](Operands& o) {
            gpt2::gemm_nt(M, N, K, 1, o.x.data(), K, o.w.data(), K, 0, o.y.data(), N);
        });
        const double f_nn = gflops([&](Operands& o) {
            gpt2::gemm_nn(M, K, N, 1, o.y.data(), N, o.w.data(), K, 0, o.x.data(), K);
        });
        const double f_tn = gflops([&](Operands& o) {
            gpt2::gemm_tn(N, K, M, 1, o.y.data(), N, o.x.data(), K, 1, o.dw.data(), K);
        });
        const double b_nt = gflops([&](Operands& o) {
            gpt2::gemm_bf16_nt(M, N, K, o.xb.data(), K, o.wb.data(), K, 0, o.y.data(), N);
        });
        const double b_nn = gflops([&](Operands& o) {
            gpt2::gemm_bf16_nn(M, K, N, o.yb.data(), N, o.wb.data(), K, 0, o.x.data(), K);
        });
        const double b_tn = gflops([&](Operands& o) {
            gpt2::gemm_bf16_tn(N, K, M, o.yb.data(), N, o.xb.data(), K, 1, o.dw.data(), K);
        });
        std::printf("%-10s %5d %5d | %9.1f %9.1f %9.1f | %9.1f %9.1f %9.1f\n", s.name, K, N, f_nt,
                    f_nn, f_tn, b_nt, b_nn, b_tn);
    }
    // Attention's fp32 products (where bf16 attention does not pay): a panel of 64 query rows
    // against `keys` keys of one head (64 channels), read from the (T, 3C) qkv rows as training
    // does: scores = q k^T (nt), out = P v (nn), dv += P^T dout (tn).
    std::printf(
        "%-22s | %9s %9s %9s  GFLOP/s per thread, fp32 (panels of 64 query rows, head "
        "size 64, in rows of 3 x 768)\n",
        "attention", "q k^T nt", "P v nn", "P^T dO tn");
    for (const int keys : {256, 1024}) {
        constexpr int kRows = 64, kHead = 64, kC = 768;
        struct Panel {
            std::vector<float> qkv, p, out, dqkv;
        };
        std::vector<Panel> panels;
        for (int t = 0; t < threads; ++t) {
            Panel panel{std::vector<float>(static_cast<std::size_t>(keys) * 3 * kC, 0.01f),
                        std::vector<float>(static_cast<std::size_t>(kRows) * keys, 0.01f),
                        std::vector<float>(static_cast<std::size_t>(kRows) * kC, 0.01f),
                        std::vector<float>(static_cast<std::size_t>(keys) * 3 * kC, 0.0f)};
            panels.push_back(std::move(panel));
        }
        const double flops = 2.0 * kRows * keys * kHead;
        const auto gflops = [&](const std::function<void(Panel&)>& call) {
            return gflops_per_thread(flops, panels, call);
        };
        const double nt = gflops([&](Panel& a) {
            gpt2::gemm_nt(kRows, keys, kHead, 0.125f, a.qkv.data(), 3 * kC, a.qkv.data() + kC,
                          3 * kC, 0.0f, a.p.data(), keys);
        });
        const double nn = gflops([&](Panel& a) {
            gpt2::gemm_nn(kRows, kHead, keys, 1.0f, a.p.data(), keys, a.qkv.data() + 2 * kC, 3 * kC,
                          0.0f, a.out.data(), kC);
        });
        const double tn = gflops([&](Panel& a) {
            gpt2::gemm_tn(keys, kHead, kRows, 1.0f, a.p.data(), keys, a.out.data(), kC, 1.0f,
                          a.dqkv.data() + 2 * kC, 3 * kC);
        });
        std::printf("%-10s %5d %5s | %9.1f %9.1f %9.1f\n", "", keys, "keys", nt, nn, tn);
    }
    const gpt2::FmaPeak fma = gpt2::measure_fma_peak();
    const double dot = gpt2::measure_bf16_dot_peak();
    if (dot > 0.0) {
        std::printf(
            "one core's peak: fp32 %s %.1f GFLOP/s, bf16 dot products (AVX512_BF16) %.1f: "
            "bf16 products without AMX run at most %.2fx fp32's rate here\n",
            fma.isa, fma.gflops, dot, dot / fma.gflops);
    } else {
        std::printf("one core's peak: fp32 %s %.1f GFLOP/s; no AVX512_BF16 dot products here\n",
                    fma.isa, fma.gflops);
    }
    return 0;
}
