#include "ops/peak_flops.hpp"

#include <algorithm>

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

// vdpbf16ps: acc += x0 * y0 + x1 * y1 per fp32 lane, x and y pairs of bf16. More chains than for
// the FMA: its latency is longer on some cores, and 24 accumulators still fit the 32 registers.
constexpr int kDotChains = 24;
__attribute__((target("avx512f,avx512bf16"))) float dot_chains_avx512bf16(long iterations) {
    __m512 acc[kDotChains];
    for (int c = 0; c < kDotChains; ++c)
        acc[c] = _mm512_set1_ps(static_cast<float>(c));
    // bf16 pairs of 1.0 and 2^-20: each step adds 2^-19 per lane, never overflowing.
    const __m512bh x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3f803f80));
    const __m512bh y = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x35803580));
    for (long i = 0; i < iterations; ++i) {
        for (int c = 0; c < kDotChains; ++c)
            acc[c] = _mm512_dpbf16_ps(acc[c], x, y);
    }
    __m512 sum = acc[0];
    for (int c = 1; c < kDotChains; ++c)
        sum = _mm512_add_ps(sum, acc[c]);
    float lanes[16];
    _mm512_storeu_ps(lanes, sum);
    return lanes[0] + lanes[15];
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

// The instructions the fp32 products multiply with (gemm_uses_avx512).
Isa gemm_isa() {
#if defined(__x86_64__)
    if (gemm_uses_avx512() && __builtin_cpu_supports("avx512f")) return Isa::Avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::Avx2;
#endif
    return Isa::Portable;
}

// GFLOP/s of run(iterations): the loop grown until one run takes about 2 ms, then the fastest of
// five runs.
template <typename Run>
double fastest_rate(const Run& run, double flops_per_iteration) {
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
    return best / 1e9;
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
    const double gflops = fastest_rate(run, flops_per_iteration);
    const char* name = isa == Isa::Avx512 ? "AVX-512 FMA" : isa == Isa::Avx2 ? "AVX2 FMA" : "SSE";
    return FmaPeak{gflops, name};
}

double measure_bf16_dot_peak() {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16")) {
        // 16 lanes x 2 products x 2 flops per instruction.
        return fastest_rate(dot_chains_avx512bf16, 64.0 * kDotChains);
    }
#endif
    return 0.0;
}

bool bf16_dots_outrun_fma() {
#if defined(__x86_64__)
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_is("amd");
#else
    return false;
#endif
}

}  // namespace gpt2
