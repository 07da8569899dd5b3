// The fp32 products' two libraries: oneDNN's sgemm computes every layout as OpenBLAS does (both
// against a double-precision sum), and a process whose threads outnumber what OpenBLAS can take at
// once (its build's buffer pool; past it OpenBLAS crashes) runs them on oneDNN, correctly.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "core/random.hpp"
#include "model/kv_cache.hpp"
#include "ops/gemm.hpp"
#include "parallel/worker_group.hpp"
#include "random_model.hpp"
#include "test_support.hpp"
#include "threads/thread_pool.hpp"

namespace gpt2 {
namespace {
using test::normal_vector;

enum class Layout { NT, NN, TN };

// One product C(M,N) = alpha op(A) op(B) + beta C with padded leading dimensions (a wrong stride
// or transpose reads the padding), and its double-precision reference.
struct Product {
    Layout layout;
    int M, N, K;
    float alpha, beta;
    int lda, ldb, ldc;
    std::vector<float> a, b, c0;

    Product(Layout l, int m, int n, int k, float alpha_, float beta_, std::uint64_t seed)
        : layout(l), M(m), N(n), K(k), alpha(alpha_), beta(beta_) {
        // A is (M,K) or, transposed, (K,M); B is (N,K) for NT, else (K,N).
        const int a_rows = l == Layout::TN ? K : M, a_cols = l == Layout::TN ? M : K;
        const int b_rows = l == Layout::NT ? N : K, b_cols = l == Layout::NT ? K : N;
        lda = a_cols + 3;
        ldb = b_cols + 5;
        ldc = N + 2;
        a = normal_vector(static_cast<std::size_t>(a_rows) * lda, seed);
        b = normal_vector(static_cast<std::size_t>(b_rows) * ldb, seed + 1);
        c0 = normal_vector(static_cast<std::size_t>(M) * ldc, seed + 2);
    }
    [[nodiscard]] float a_at(int i, int k) const {
        return layout == Layout::TN ? a[static_cast<std::size_t>(k) * lda + i]
                                    : a[static_cast<std::size_t>(i) * lda + k];
    }
    [[nodiscard]] float b_at(int k, int j) const {
        return layout == Layout::NT ? b[static_cast<std::size_t>(j) * ldb + k]
                                    : b[static_cast<std::size_t>(k) * ldb + j];
    }
    [[nodiscard]] std::vector<float> run() const {
        std::vector<float> c = c0;
        switch (layout) {
            case Layout::NT:
                gemm_nt(M, N, K, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
                break;
            case Layout::NN:
                gemm_nn(M, N, K, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
                break;
            case Layout::TN:
                gemm_tn(M, N, K, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
                break;
        }
        return c;
    }
    // The error of entry (i, j) against the double sum, in units of the float rounding the sum
    // may carry: K + 2 roundings of 2^-24 each, relative to the sum of the terms' magnitudes (with
    // a factor 4 to spare). Below 1 is right; a wrong layout is off by the terms themselves.
    [[nodiscard]] double error_at(const std::vector<float>& c, int i, int j) const {
        const std::size_t at = static_cast<std::size_t>(i) * ldc + j;
        double sum = static_cast<double>(beta) * c0[at];
        double magnitude = std::abs(sum);
        for (int k = 0; k < K; ++k) {
            const double term = static_cast<double>(alpha) * a_at(i, k) * b_at(k, j);
            sum += term;
            magnitude += std::abs(term);
        }
        return std::abs(c[at] - sum) / (4.0 * (K + 2) * 0x1p-24 * std::max(magnitude, 1e-30));
    }
    // The largest error over every entry, or over 64 spread ones when `sampled`; infinite if
    // the padding of C did not come back untouched.
    [[nodiscard]] double worst_error(const std::vector<float>& c, bool sampled = false) const {
        double worst = 0.0;
        for (int i = 0; i < M; ++i)
            for (int j = N; j < ldc; ++j)
                if (c[static_cast<std::size_t>(i) * ldc + j] !=
                    c0[static_cast<std::size_t>(i) * ldc + j])
                    return INFINITY;
        if (sampled) {
            for (int s = 0; s < 64; ++s)
                worst = std::max(worst, error_at(c, (s * 7919) % M, (s * 104729) % N));
            return worst;
        }
        for (int i = 0; i < M; ++i)
            for (int j = 0; j < N; ++j)
                worst = std::max(worst, error_at(c, i, j));
        return worst;
    }
};

// Each test starts on OpenBLAS with GPT2_GEMM_LIBRARY unset, and leaves the process so whatever it
// asserted.
class GemmLibraries : public ::testing::Test {
  protected:
    void SetUp() override {
        if (const char* value = std::getenv(kVariable)) saved_ = value;
        ::unsetenv(kVariable);
        set_gemm_library(GemmLibrary::OpenBlas);
    }
    void TearDown() override {
        if (saved_) {
            ::setenv(kVariable, saved_->c_str(), 1);
        } else {
            ::unsetenv(kVariable);
        }
        set_gemm_library(GemmLibrary::OpenBlas);
    }
    static constexpr const char* kVariable = "GPT2_GEMM_LIBRARY";
    std::optional<std::string> saved_;
};

// The tests' main set OpenBLAS up as the programs do (select_gemm_kernels): it started no threads
// of its own, which would hold buffers of the pool the workers' calls share (on a machine of 64
// CPUs, 63 of 128; checked there by faking 64 CPUs: 100 workers then went past it).
TEST_F(GemmLibraries, OpenBlasStartedNoThreadsOfItsOwn) {
    EXPECT_EQ(openblas_threads_started(), 0);
    // OpenBLAS's pool holds at least 50 whatever its build.
    EXPECT_GE(openblas_calls_at_once(), 50);
}

TEST_F(GemmLibraries, OneDnnComputesEveryLayoutAsOpenBlasDoes) {
    for (const Layout layout : {Layout::NT, Layout::NN, Layout::TN}) {
        for (const float beta : {0.0f, 1.0f, 0.5f}) {
            // A GPT-2-like product and a small odd one (edges of every kernel's blocking).
            for (const auto [M, N, K] : {std::array{64, 96, 48}, std::array{7, 5, 3}}) {
                const Product p(layout, M, N, K, 0.75f, beta, 11);
                SCOPED_TRACE("layout " + std::to_string(static_cast<int>(layout)) + ", beta " +
                             std::to_string(beta) + ", M " + std::to_string(M));
                set_gemm_library(GemmLibrary::OpenBlas);
                EXPECT_LT(p.worst_error(p.run()), 1.0) << "OpenBLAS";
                set_gemm_library(GemmLibrary::OneDnn);
                EXPECT_LT(p.worst_error(p.run()), 1.0) << "oneDNN";
            }
        }
    }
}

// The products go to the library chosen, whatever the timing: oneDNN refuses a leading dimension
// shorter than a row (an error status, thrown here), where OpenBLAS would only print its own
// parameter message and return. A product that ignored the choice would not throw.
TEST_F(GemmLibraries, EveryLayoutRunsOnTheLibraryChosen) {
    set_gemm_library(GemmLibrary::OneDnn);
    std::vector<float> a(64, 1.0f), b(64, 1.0f), c(64, 0.0f);
    EXPECT_THROW(gemm_nt(4, 4, 4, 1.0f, a.data(), 2, b.data(), 4, 0.0f, c.data(), 4),
                 std::runtime_error);
    EXPECT_THROW(gemm_nn(4, 4, 4, 1.0f, a.data(), 2, b.data(), 4, 0.0f, c.data(), 4),
                 std::runtime_error);
    EXPECT_THROW(gemm_tn(4, 4, 4, 1.0f, a.data(), 2, b.data(), 4, 0.0f, c.data(), 4),
                 std::runtime_error);
    // The same products with valid strides run.
    gemm_nt(4, 4, 4, 1.0f, a.data(), 4, b.data(), 4, 0.0f, c.data(), 4);
    EXPECT_EQ(c[0], 4.0f);
}

TEST_F(GemmLibraries, TheLibraryFollowsHowManyThreadsCallAtOnceAndStaysOneDnn) {
    const int limit = openblas_calls_at_once();
    EXPECT_EQ(choose_gemm_library(limit), GemmLibrary::OpenBlas);
    EXPECT_EQ(gemm_library_name().rfind("OpenBLAS ", 0), 0u) << gemm_library_name();
    EXPECT_EQ(choose_gemm_library(limit + 1), GemmLibrary::OneDnn);
    EXPECT_EQ(gemm_library_name(), "oneDNN sgemm");
    // A smaller pool later in the same process keeps oneDNN: the larger may still be calling.
    EXPECT_EQ(choose_gemm_library(1), GemmLibrary::OneDnn);
}

// Twice as many threads at once as OpenBLAS takes, as a pool's workers: oneDNN's sgemm must be
// right under them. (On OpenBLAS, these products overflow its pool of buffers, which it says on
// stderr as "precompiled NUM_THREADS exceeded": 3 of 3 runs of the same threads and products in a
// standalone program on 2 cores; from 200 training workers of the d6 model it crashed.) The
// products are long (about 5 ms, longer than a scheduler's time slice) so that on a machine of few
// cores the threads are preempted inside them and really are in the library at once; they share
// their operands, each thread its own result.
TEST_F(GemmLibraries, MoreThreadsAtOnceThanOpenBlasTakesAllGetTheirProductsRight) {
    const int threads = 2 * openblas_calls_at_once();
    ASSERT_EQ(choose_gemm_library(threads), GemmLibrary::OneDnn);
    const std::array<Product, 3> products = {Product(Layout::NT, 256, 1024, 1024, 1.0f, 0.0f, 7),
                                             Product(Layout::NN, 256, 1024, 1024, 1.0f, 1.0f, 8),
                                             Product(Layout::TN, 256, 1024, 1024, 0.5f, 1.0f, 9)};
    std::vector<double> errors(static_cast<std::size_t>(threads), 0.0);
    std::barrier start(threads);
    ::testing::internal::CaptureStderr();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
            const Product& p = products[static_cast<std::size_t>(t % 3)];
            start.arrive_and_wait();
            double worst = 0.0;
            for (int call = 0; call < 2; ++call)
                worst = std::max(worst, p.worst_error(p.run(), /*sampled=*/true));
            errors[static_cast<std::size_t>(t)] = worst;
        });
    }
    for (std::thread& thread : pool)
        thread.join();
    const std::string said = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(said.find("NUM_THREADS exceeded"), std::string::npos) << said;
    for (int t = 0; t < threads; ++t)
        EXPECT_LT(errors[static_cast<std::size_t>(t)], 1.0) << "thread " << t;
}

// What calls the products chooses for its thread count before its threads start: training's
// WorkerGroup and the prompts' KvCacheSession; one thread more than OpenBLAS takes is oneDNN.
TEST_F(GemmLibraries, TrainingWorkersAndPromptSessionsChooseForTheirThreadCount) {
    const int threads = openblas_calls_at_once() + 1;
    const ModelConfig config = test::small_config(16);
    {
        const WorkerGroup few(config, 2, 2, 8, false);
        EXPECT_EQ(gemm_library(), GemmLibrary::OpenBlas);
    }
    {
        const WorkerGroup many(config, threads, threads, 8, false);
        EXPECT_EQ(gemm_library(), GemmLibrary::OneDnn);
    }
    set_gemm_library(GemmLibrary::OpenBlas);
    const auto model = test::random_model(config, 3);
    ThreadPool pool(threads);
    const KvCacheSession session(*model, pool, 0, nullptr);
    EXPECT_EQ(gemm_library(), GemmLibrary::OneDnn);
    EXPECT_EQ(session.prompt_products_name(), "fp32 GEMM (oneDNN sgemm)");
}

// GPT2_GEMM_LIBRARY chooses by name: onednn always; openblas refused past its pool; anything else
// refused, naming the variable.
TEST_F(GemmLibraries, Gpt2GemmLibraryChoosesByNameAndRefusesWhatCannotWork) {
    const int limit = openblas_calls_at_once();
    ::setenv("GPT2_GEMM_LIBRARY", "onednn", 1);
    EXPECT_EQ(choose_gemm_library(1), GemmLibrary::OneDnn);
    set_gemm_library(GemmLibrary::OpenBlas);
    ::setenv("GPT2_GEMM_LIBRARY", "openblas", 1);
    EXPECT_EQ(choose_gemm_library(limit), GemmLibrary::OpenBlas);
    try {
        (void)choose_gemm_library(limit + 1);
        ADD_FAILURE() << "openblas past its pool was accepted";
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find(
                      "GPT2_GEMM_LIBRARY=openblas: " + std::to_string(limit + 1) + " threads"),
                  std::string::npos)
            << e.what();
    }
    ::setenv("GPT2_GEMM_LIBRARY", "mkl", 1);
    try {
        (void)choose_gemm_library(1);
        ADD_FAILURE() << "an unknown library was accepted";
    } catch (const InputError& e) {
        EXPECT_STREQ(e.what(), "GPT2_GEMM_LIBRARY=mkl: expected openblas or onednn");
    }
}

}  // namespace
}  // namespace gpt2
