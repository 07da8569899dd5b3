#include "ops/peak_flops.hpp"

#include <algorithm>
#include <cstring>

#include "core/clock.hpp"
#include "ops/gemm.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace gpt2 {

namespace {
// Chains per loop: more than an FMA's latency times its ports (4 x 2 on current cores), so the
// loop is bound by throughput, not latency.
constexpr int kChains = 12;

#if defined(__x86_64__)
__attribute__((target("avx512f"))) float chains_avx512(long iterations) {
    __m512 acc[kChains];
    for (int c = 0; c < kChains; ++c)
        acc[c] = _mm512_set1_ps(static_cast<float>(c));
    const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-6f);
    for (long i = 0; i < iterations; ++i) {
        for (int c = 0; c < kChains; ++c)
            acc[c] = _mm512_fmadd_ps(acc[c], x, y);
    }
    __m512 sum = acc[0];
    for (int c = 1; c < kChains; ++c)
        sum = _mm512_add_ps(sum, acc[c]);
    float lanes[16];
    _mm512_storeu_ps(lanes, sum);
    return lanes[0] + lanes[15];
}

__attribute__((target("avx2,fma"))) float chains_avx2(long iterations) {
    __m256 acc[kChains];
    for (int c = 0; c < kChains; ++c)
        acc[c] = _mm256_set1_ps(static_cast<float>(c));
    const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-6f);
    for (long i = 0; i < iterations; ++i) {
        for (int c = 0; c < kChains; ++c)
            acc[c] = _mm256_fmadd_ps(acc[c], x, y);
    }
    __m256 sum = acc[0];
    for (int c = 1; c < kChains; ++c)
        sum = _mm256_add_ps(sum, acc[c]);
    float lanes[8];
    _mm256_storeu_ps(lanes, sum);
    return lanes[0] + lanes[7];
}
#endif

// Four-wide multiply then add (x86-64's baseline SSE, or whatever the compiler makes of it).
float chains_portable(long iterations) {
    float acc[kChains][4];
    for (int c = 0; c < kChains; ++c)
        std::fill(acc[c], acc[c] + 4, static_cast<float>(c));
    for (long i = 0; i < iterations; ++i) {
        for (auto& chain : acc) {
            for (float& a : chain)
                a = a * 0.999999f + 1e-6f;
        }
    }
    float sum = 0.0f;
    for (const auto& chain : acc)
        sum += chain[0] + chain[3];
    return sum;
}

enum class Isa { Avx512, Avx2, Portable };

// The instructions OpenBLAS's kernels multiply with: AVX-512 for its SkylakeX family (which the
// programs re-execute into on AVX-512 CPUs), AVX2 + FMA for Haswell and Zen.
Isa gemm_isa() {
#if defined(__x86_64__)
    const char* name = gemm_kernel_name();
    const bool avx512_kernels = std::strcmp(name, "SkylakeX") == 0 ||
                                std::strcmp(name, "Cooperlake") == 0 ||
                                std::strcmp(name, "SapphireRapids") == 0;
    if (avx512_kernels && __builtin_cpu_supports("avx512f")) return Isa::Avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::Avx2;
#endif
    return Isa::Portable;
}
}  // namespace

FmaPeak measure_fma_peak() {
    const Isa isa = gemm_isa();
    const auto run = [isa](long iterations) {
#if defined(__x86_64__)
        if (isa == Isa::Avx512) return chains_avx512(iterations);
        if (isa == Isa::Avx2) return chains_avx2(iterations);
#endif
        return chains_portable(iterations);
    };
    const double flops_per_iteration = 2.0 * kChains *
                                       (isa == Isa::Avx512 ? 16
                                        : isa == Isa::Avx2 ? 8
                                                           : 4);
    // Grow the loop until one run takes about 2 ms, then keep the fastest of five.
    long iterations = 1000;
    double best = 0.0;
    volatile float sink = 0.0f;  // keeps the chains from being optimised away
    for (int runs = 0; runs < 5;) {
        const auto start = Clock::now();
        sink = sink + run(iterations);
        const double seconds = seconds_since(start);
        if (seconds < 1e-3 && iterations < (1L << 40)) {
            iterations *= 4;
            continue;
        }
        best = std::max(best, flops_per_iteration * static_cast<double>(iterations) / seconds);
        ++runs;
    }
    const char* name = isa == Isa::Avx512 ? "AVX-512 FMA" : isa == Isa::Avx2 ? "AVX2 FMA" : "SSE";
    return FmaPeak{best / 1e9, name};
}

}  // namespace gpt2
