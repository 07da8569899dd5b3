// Matrix products: row-major single-precision GEMM run on the calling thread, the one place the
// BLAS library is named (OpenBLAS's serial build; README "Why OpenBLAS" has the measurements).
#pragma once

namespace gpt2 {

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
