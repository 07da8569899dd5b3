// The test programs' main: the matrix-product kernels the programs use, the environment every
// test's MPI jobs need, then GoogleTest.
//
// It is set here and not through ctest's ENVIRONMENT property because gtest_discover_tests
// (CMake 3.25) passes that property on unquoted: of a list of variables, only the first reached
// the tests. Set before anything starts MPI, and inherited by every mpiexec a test runs.
#include <gtest/gtest.h>

#include <cstdlib>

#include "ops/gemm.hpp"

int main(int argc, char** argv) {
    // The OpenBLAS kernels train_gpt2 and inference run on this CPU (AVX-512 ones wherever the CPU
    // has AVX-512, whatever OPENBLAS_CORETYPE the environment holds), so that the in-process tests
    // check what users get; GPT2_OPENBLAS_CORETYPE=Haswell checks the AVX2 family (.ci/run).
    gpt2::select_gemm_kernels(argv);
    // MPI refuses root without the first two; tests on a 2-core machine run more ranks than
    // cores; ranks waiting in MPI yield the core instead of spinning on it. The caller's own
    // values win.
    constexpr const char* kMpiTestEnvironment[][2] = {
        {"OMPI_ALLOW_RUN_AS_ROOT", "1"},
        {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
        {"OMPI_MCA_rmaps_base_oversubscribe", "1"},
        {"OMPI_MCA_mpi_yield_when_idle", "1"},
    };
    for (const auto& [name, value] : kMpiTestEnvironment) {
        ::setenv(name, value, /*overwrite=*/0);
    }
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
