#include "gpt2/gemm.hpp"

#include <cblas.h>

namespace gpt2 {

namespace {
// Parallelism comes from our workers; OpenBLAS must run each call on the calling thread.
void ensure_single_threaded() {
    static const bool configured = [] {
        openblas_set_num_threads(1);
        return true;
    }();
    (void)configured;
}
}  // namespace

void gemm_nt(int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
             float beta, float* C, int ldc) {
    ensure_single_threaded();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, alpha, A, lda, B, ldb, beta, C,
                ldc);
}

void gemm_nn(int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
             float beta, float* C, int ldc) {
    ensure_single_threaded();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C,
                ldc);
}

void gemm_tn(int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
             float beta, float* C, int ldc) {
    ensure_single_threaded();
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C,
                ldc);
}

}  // namespace gpt2
