#include "ops/gemm.hpp"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

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

void select_gemm_kernels(char** argv) {
    if (std::getenv("GPT2_GEMM_REEXEC") != nullptr) return;  // already re-executed once
    const char* wanted = std::getenv("GPT2_OPENBLAS_CORETYPE");
    if (wanted != nullptr && *wanted == '\0') wanted = nullptr;  // set but empty: the default
    if (wanted == nullptr) {
        const bool avx512 =
            __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
        const char* name = openblas_get_corename();
        const bool avx2_kernels =
            std::strcmp(name, "Haswell") == 0 || std::strcmp(name, "Zen") == 0;
        if (!avx512 || !avx2_kernels) return;
        wanted = "SkylakeX";
    }
    const char* current = std::getenv("OPENBLAS_CORETYPE");
    if (current != nullptr && std::strcmp(current, wanted) == 0) return;
    ::setenv("OPENBLAS_CORETYPE", wanted, 1);
    ::setenv("GPT2_GEMM_REEXEC", "1", 1);
    // Through the binary's real path, so the process keeps its name (ps, top, pgrep).
    char self[4096];
    const ssize_t length = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (length <= 0) return;
    self[length] = '\0';
    ::execv(self, argv);  // only returns on failure: then carry on as we are
}

const char* gemm_kernel_name() {
    return openblas_get_corename();
}

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
