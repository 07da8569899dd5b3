// Matrix products: row-major single-precision GEMM run on the calling thread, the one place the
// BLAS library is named (OpenBLAS's pthread build with its own threading off: its serial build is
// not safe under concurrent calls; README "Why OpenBLAS" has the measurements).
#pragma once

namespace gpt2 {

// OpenBLAS 0.3.21 does not know AVX-512 CPUs newer than it (AMD Zen 4/5) and runs its AVX2
// kernels there at about half the speed; it reads OPENBLAS_CORETYPE only when it loads. On such a
// CPU this re-executes the program once with OPENBLAS_CORETYPE=SkylakeX (overriding an inherited
// OPENBLAS_CORETYPE); GPT2_OPENBLAS_CORETYPE=NAME chooses the kernels explicitly instead (set but
// empty: as if unset). Call first thing in main(), before MPI_Init.
void select_gemm_kernels(char** argv);
// The kernel family OpenBLAS is using (for the start-up log).
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
