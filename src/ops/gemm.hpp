// Matrix products: row-major single-precision GEMM run on the calling thread, the one place the
// BLAS library is named (OpenBLAS's pthread build with its own threading off: its serial build is
// not safe under concurrent calls; oneDNN's sgemm where more threads call at once than OpenBLAS
// takes; performance.md "Why OpenBLAS" has the measurements).
#pragma once

#include <string>

namespace gpt2 {

// The library that runs gemm_nt/nn/tn in this process.
enum class GemmLibrary { OpenBlas, OneDnn };

// How many products OpenBLAS can have in flight at once: its pool of per-call buffers, 2 x its
// build's MAX_THREADS and at least 50 (Debian's 0.3.21: 2 x 64 = 128), less those its own threads
// hold. Past it OpenBLAS takes an overflow path that crashes under concurrent calls (a segfault
// in sgemm from 200 workers).
[[nodiscard]] int openblas_calls_at_once();
// The threads OpenBLAS started for itself when it loaded (0 after select_gemm_kernels): each
// holds a buffer of that pool.
[[nodiscard]] int openblas_threads_started();
// Chooses the library for the process's fp32 products, given the most threads that will call them
// at once (a pool's workers, before they start): OpenBLAS, the default (oneDNN loses to it on some
// shapes: performance.md "Why OpenBLAS"), while its pool holds them, else oneDNN's sgemm, which has
// no such limit. Once oneDNN, it stays (for every pool of the process). GPT2_GEMM_LIBRARY=onednn
// asks for oneDNN whatever the count (to measure it), =openblas for OpenBLAS (an InputError if the
// callers exceed its pool, as is any other value; set but empty: as if unset). Returns the library
// in use.
GemmLibrary choose_gemm_library(int concurrent_callers);
// Sets it directly (tests, bench_gemm).
void set_gemm_library(GemmLibrary library);
[[nodiscard]] GemmLibrary gemm_library();
// Whether the fp32 products multiply with AVX-512 instructions: OpenBLAS's SkylakeX family (which
// select_gemm_kernels chooses on AVX-512 CPUs), or oneDNN where its dispatcher allows AVX-512.
[[nodiscard]] bool gemm_uses_avx512();
// "OpenBLAS <its kernels>" or "oneDNN sgemm", for the logs.
[[nodiscard]] std::string gemm_library_name();

// Sets up OpenBLAS, which reads its environment only when it loads; call first thing in main(),
// before MPI_Init. Re-executes the program once, if needed, with OPENBLAS_NUM_THREADS=1 (the
// threads OpenBLAS would start for itself, one per CPU, are never used but each holds a buffer of
// the pool our workers' calls share) and with the kernels for this CPU (kernels_for_this_cpu,
// overriding an inherited OPENBLAS_CORETYPE); GPT2_OPENBLAS_CORETYPE=NAME chooses the kernels
// explicitly instead (set but empty: as if unset). Stop signals (SIGINT, SIGTERM, SIGUSR1,
// SIGHUP) that arrive during the restart wait until the new image calls this again: a program
// that catches them installs its handlers before calling it.
void select_gemm_kernels(char** argv);
// The OpenBLAS family this CPU's instructions call for when `loaded` (the family OpenBLAS chose)
// is not one of it, else null: OpenBLAS 0.3.21 does not know CPUs newer than it and takes AMD's
// AVX-512 ones (Zen 4/5) for AVX2 ones (half the speed) and an Intel Xeon of model 207 for a
// Prescott (SSE3 kernels, several times slower). AVX-512: SkylakeX (Cooperlake and SapphireRapids
// kept); AVX2 with FMA: Haswell (Zen kept).
[[nodiscard]] const char* kernels_for_this_cpu(const char* loaded);
// The kernel family OpenBLAS is using (for the start-up log; whether or not it runs the products).
[[nodiscard]] const char* gemm_kernel_name();

// C(M,N) = alpha * A(M,K) * B(N,K)^T + beta * C
void gemm_nt(int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
             float beta, float* C, int ldc);
// C(M,N) = alpha * A(M,K) * B(K,N) + beta * C
void gemm_nn(int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
             float beta, float* C, int ldc);
// C(M,N) = alpha * A(K,M)^T * B(K,N) + beta * C
void gemm_tn(int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
             float beta, float* C, int ldc);

}  // namespace gpt2
