#include "ops/gemm.hpp"

#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <csignal>

#include <oneapi/dnnl/dnnl.h>
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "core/error.hpp"
#include "core/stop_signal.hpp"

namespace gpt2 {

namespace {
// How many threads OpenBLAS ran with when it loaded (its own, plus the caller's): one per CPU up
// to its build's MAX_THREADS unless OPENBLAS_NUM_THREADS said otherwise. Read once, before the
// first product sets it to run every call on the calling thread (parallelism comes from our
// workers); the threads it started stay, asleep, each holding one buffer of its pool.
int openblas_threads_at_load() {
    static const int threads = [] {
        const int started = openblas_get_num_threads();
        openblas_set_num_threads(1);
        return started;
    }();
    return threads;
}

void ensure_single_threaded() {
    (void)openblas_threads_at_load();
}

// oneDNN (Debian's build runs on OpenMP) takes its thread count from the calling thread's OpenMP
// setting, which every thread has its own copy of: one, as for OpenBLAS.
void ensure_onednn_single_threaded() {
    thread_local const bool configured = [] {
        omp_set_num_threads(1);
        return true;
    }();
    (void)configured;
}

// The process's choice. A process-wide setting because what it works around is process-wide:
// OpenBLAS's buffer pool, shared by every thread that calls it.
std::atomic<GemmLibrary>& library_in_use() {
    static std::atomic<GemmLibrary> library{GemmLibrary::OpenBlas};
    return library;
}

void onednn_sgemm(char transa, char transb, int M, int N, int K, float alpha, const float* A,
                  int lda, const float* B, int ldb, float beta, float* C, int ldc) {
    ensure_onednn_single_threaded();
    const dnnl_status_t status =
        dnnl_sgemm(transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (status != dnnl_success) {
        throw std::runtime_error("oneDNN's sgemm failed (status " +
                                 std::to_string(static_cast<int>(status)) + ") on a " +
                                 std::to_string(M) + "x" + std::to_string(N) + "x" +
                                 std::to_string(K) + " product");
    }
}
}  // namespace

const char* kernels_for_this_cpu(const char* loaded) {
    const auto loaded_one_of = [loaded](std::initializer_list<const char*> names) {
        return std::any_of(names.begin(), names.end(),
                           [loaded](const char* name) { return std::strcmp(loaded, name) == 0; });
    };
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    // OpenBLAS names a CPU it does not know after an old family (Prescott: SSE3, several times
    // slower), and AMD's AVX-512 CPUs after its AVX2 one: the instructions decide, not the model.
    if (avx512) {
        return loaded_one_of({"SkylakeX", "Cooperlake", "SapphireRapids"}) ? nullptr : "SkylakeX";
    }
    if (avx2) return loaded_one_of({"Haswell", "Zen"}) ? nullptr : "Haswell";
    return nullptr;
}

namespace {
// The stop signals a program catches (train_gpt2's Ctrl-C, SIGTERM and mpirun's SIGUSR1): held
// back across the restart, whose new image has not caught them yet, and let through once it has.
sigset_t stop_signals() {
    sigset_t set;
    sigemptyset(&set);
    for (const int signum : {SIGINT, SIGTERM, SIGUSR1, SIGHUP})
        sigaddset(&set, signum);
    return set;
}
}  // namespace

void select_gemm_kernels(char** argv) {
    if (std::getenv("GPT2_GEMM_REEXEC") != nullptr) {  // already re-executed once
        if (const char* held_list = std::getenv("GPT2_GEMM_REEXEC_HELD")) {
            // Only the signals held for the restart (numbers, comma-separated) are let through;
            // a pending one reaches its handler now.
            sigset_t held;
            sigemptyset(&held);
            for (const char* at = held_list; *at != '\0';) {
                char* end = nullptr;
                const long signum = std::strtol(at, &end, 10);
                if (end == at) break;
                sigaddset(&held, static_cast<int>(signum));
                at = *end == ',' ? end + 1 : end;
            }
            ::unsetenv("GPT2_GEMM_REEXEC_HELD");
            ::sigprocmask(SIG_UNBLOCK, &held, nullptr);
        }
        return;
    }
    bool restart = false;
    // Threads OpenBLAS started for itself are never used (each call runs on its caller) but each
    // holds a buffer of the pool every call draws from: on a node of 64 CPUs, 63 of its 128.
    // OpenBLAS reads OPENBLAS_NUM_THREADS only when it loads.
    if (openblas_get_num_threads() > 1) {
        ::setenv("OPENBLAS_NUM_THREADS", "1", 1);
        restart = true;
    }
    const char* wanted = std::getenv("GPT2_OPENBLAS_CORETYPE");
    if (wanted != nullptr && *wanted == '\0') wanted = nullptr;  // set but empty: the default
    if (wanted == nullptr) wanted = kernels_for_this_cpu(openblas_get_corename());
    const char* current = std::getenv("OPENBLAS_CORETYPE");
    if (wanted != nullptr && (current == nullptr || std::strcmp(current, wanted) != 0)) {
        ::setenv("OPENBLAS_CORETYPE", wanted, 1);
        restart = true;
    }
    if (!restart) return;
    ::setenv("GPT2_GEMM_REEXEC", "1", 1);
    // Through the binary's real path, so the process keeps its name (ps, top, pgrep).
    char self[4096];
    const ssize_t length = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (length <= 0) return;
    self[length] = '\0';
    // A stop signal arriving during the exec would meet the new image's default action (the end
    // of the process): it waits, blocked, until the new image has installed its handlers. Only
    // the signals not blocked already are released afterwards.
    const sigset_t stops = stop_signals();
    sigset_t before;
    ::sigprocmask(SIG_BLOCK, &stops, &before);
    std::string held;
    for (const int signum : {SIGINT, SIGTERM, SIGUSR1, SIGHUP}) {
        if (sigismember(&before, signum) != 0) continue;
        if (!held.empty()) held += ',';
        held += std::to_string(signum);
    }
    if (!held.empty()) ::setenv("GPT2_GEMM_REEXEC_HELD", held.c_str(), 1);
    // A stop that the handlers caught before the signals were held would die with this image's
    // memory: raised again, it waits, pending, for the new image's handlers.
    if (const int caught = stop_signal().load(); caught != 0) ::raise(caught);
    ::execv(self, argv);  // only returns on failure: then carry on as we are
    ::unsetenv("GPT2_GEMM_REEXEC_HELD");
    ::sigprocmask(SIG_SETMASK, &before, nullptr);
}

const char* gemm_kernel_name() {
    return openblas_get_corename();
}

int openblas_threads_started() {
    return openblas_threads_at_load() - 1;
}

int openblas_calls_at_once() {
    // openblas_get_config() names the build's MAX_THREADS (MAX_CPU_NUMBER); its pool holds
    // MAX(50, 2 * MAX_CPU_NUMBER * MAX_PARALLEL_NUMBER) buffers, MAX_PARALLEL_NUMBER 1 unless
    // built otherwise (then the pool is larger and this bound stays safe), less one for each
    // thread it started itself.
    static const int calls = [] {
        const std::string config = openblas_get_config();
        const std::string key = "MAX_THREADS=";
        const std::size_t at = config.find(key);
        const int max_threads =
            at == std::string::npos ? 0 : std::atoi(config.c_str() + at + key.size());
        return std::max(50, 2 * max_threads) - openblas_threads_started();
    }();
    return calls;
}

void set_gemm_library(GemmLibrary library) {
    library_in_use().store(library);
}

GemmLibrary gemm_library() {
    return library_in_use().load(std::memory_order_relaxed);
}

GemmLibrary choose_gemm_library(int concurrent_callers) {
    const int limit = openblas_calls_at_once();
    const char* asked = std::getenv("GPT2_GEMM_LIBRARY");
    if (asked != nullptr && *asked != '\0') {
        if (std::strcmp(asked, "onednn") == 0) {
            set_gemm_library(GemmLibrary::OneDnn);
        } else if (std::strcmp(asked, "openblas") != 0) {
            throw InputError(std::string("GPT2_GEMM_LIBRARY=") + asked +
                             ": expected openblas or onednn");
        } else if (concurrent_callers > limit) {
            throw InputError("GPT2_GEMM_LIBRARY=openblas: " + std::to_string(concurrent_callers) +
                             " threads would call OpenBLAS at once, more than the " +
                             std::to_string(limit) +
                             " its build takes (it crashes beyond); unset it to use oneDNN's "
                             "sgemm, or use fewer --threads");
        }
        return gemm_library();
    }
    if (concurrent_callers > limit) set_gemm_library(GemmLibrary::OneDnn);
    return gemm_library();
}

bool gemm_uses_avx512() {
    if (gemm_library() == GemmLibrary::OneDnn) {
        const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
        return (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
    }
    const char* name = gemm_kernel_name();
    return std::strcmp(name, "SkylakeX") == 0 || std::strcmp(name, "Cooperlake") == 0 ||
           std::strcmp(name, "SapphireRapids") == 0;
}

std::string gemm_library_name() {
    if (gemm_library() == GemmLibrary::OneDnn) return "oneDNN sgemm";
    return std::string("OpenBLAS ") + gemm_kernel_name();
}

void gemm_nt(int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
             float beta, float* C, int ldc) {
    if (gemm_library() == GemmLibrary::OneDnn) {
        onednn_sgemm('N', 'T', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    ensure_single_threaded();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, alpha, A, lda, B, ldb, beta, C,
                ldc);
}

void gemm_nn(int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
             float beta, float* C, int ldc) {
    if (gemm_library() == GemmLibrary::OneDnn) {
        onednn_sgemm('N', 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    ensure_single_threaded();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C,
                ldc);
}

void gemm_tn(int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
             float beta, float* C, int ldc) {
    if (gemm_library() == GemmLibrary::OneDnn) {
        onednn_sgemm('T', 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    ensure_single_threaded();
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C,
                ldc);
}

}  // namespace gpt2
