// Prints GFLOP/s of the fp32 (OpenBLAS) and bf16 (oneDNN) matrix products on GPT-2 124M's shapes,
// one thread, in the three layouts training uses: forward x@W^T (nt), dX = dY@W (nn) and
// dW += dY^T@X (tn). A benchmark, not a test: it prints figures and asserts nothing.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "ops/bf16.hpp"
#include "ops/gemm.hpp"

namespace {
double seconds_per_call(const std::function<void()>& call) {
    call();  // warm-up: primitive creation, first touch
    int calls = 0;
    const auto start = std::chrono::steady_clock::now();
    double elapsed = 0.0;
    while (elapsed < 0.5) {
        call();
        ++calls;
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    return elapsed / calls;
}
}  // namespace

int main(int argc, char** argv) {
    gpt2::select_gemm_kernels(argv);
    const int rows = argc > 1 ? std::atoi(argv[1]) : 512;
    std::printf("bench_gemm: %d rows, one thread; fp32 kernels %s, bf16 on %s\n", rows,
                gpt2::gemm_kernel_name(), gpt2::bf16_backend_name(gpt2::bf16_backend()));
    std::printf("%-10s %5s %5s | %9s %9s %9s | %9s %9s %9s  GFLOP/s\n", "shape", "in", "out",
                "fp32 nt", "fp32 nn", "fp32 tn", "bf16 nt", "bf16 nn", "bf16 tn");
    struct Shape {
        const char* name;
        int in, out;
    };
    for (const Shape s :
         {Shape{"qkv", 768, 2304}, Shape{"attproj", 768, 768}, Shape{"fc", 768, 3072},
          Shape{"fcproj", 3072, 768}, Shape{"lm_head", 768, 50304}}) {
        const int M = rows, K = s.in, N = s.out;
        const auto count = [](int a, int b) { return static_cast<std::size_t>(a) * b; };
        gpt2::AlignedBuffer<float> x(count(M, K)), w(count(N, K)), y(count(M, N)), dw(count(N, K));
        gpt2::AlignedBuffer<gpt2::Bf16> xb(x.size()), wb(w.size()), yb(y.size());
        std::mt19937 rng(1);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        for (auto* buffer : {&x, &w, &y})
            for (float& v : buffer->span())
                v = normal(rng);
        gpt2::convert_to_bf16(xb.data(), x.data(), x.size());
        gpt2::convert_to_bf16(wb.data(), w.data(), w.size());
        gpt2::convert_to_bf16(yb.data(), y.data(), y.size());
        const double flops = 2.0 * M * N * K;
        const auto gflops = [&](const std::function<void()>& call) {
            return flops / seconds_per_call(call) * 1e-9;
        };
        // out(M,N) = x(M,K) @ w(N,K)^T; dx(M,K) = dy(M,N) @ w(N,K); dw(N,K) += dy^T @ x.
        const double f_nt =
            gflops([&] { gpt2::gemm_nt(M, N, K, 1, x.data(), K, w.data(), K, 0, y.data(), N); });
        const double f_nn =
            gflops([&] { gpt2::gemm_nn(M, K, N, 1, y.data(), N, w.data(), K, 0, x.data(), K); });
        const double f_tn =
            gflops([&] { gpt2::gemm_tn(N, K, M, 1, y.data(), N, x.data(), K, 1, dw.data(), K); });
        const double b_nt = gflops(
            [&] { gpt2::gemm_bf16_nt(M, N, K, xb.data(), K, wb.data(), K, 0, y.data(), N); });
        const double b_nn = gflops(
            [&] { gpt2::gemm_bf16_nn(M, K, N, yb.data(), N, wb.data(), K, 0, x.data(), K); });
        const double b_tn = gflops(
            [&] { gpt2::gemm_bf16_tn(N, K, M, yb.data(), N, xb.data(), K, 1, dw.data(), K); });
        std::printf("%-10s %5d %5d | %9.1f %9.1f %9.1f | %9.1f %9.1f %9.1f\n", s.name, K, N, f_nt,
                    f_nn, f_tn, b_nt, b_nn, b_tn);
    }
    return 0;
}
