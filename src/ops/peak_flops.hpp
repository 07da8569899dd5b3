// One core's fp32 multiply-add peak, measured in a few milliseconds with the widest vector
// instructions the GEMM kernels use: the yardstick of the MFU the training log prints; and its bf16
// dot-product peak, the most bf16 products can gain over fp32 on a CPU without AMX.
#pragma once

namespace gpt2 {

struct FmaPeak {
    double gflops = 0.0;   // per core
    const char* isa = "";  // "AVX-512 FMA", "AVX2 FMA" or "SSE"
};

// Independent multiply-add chains for about 2 ms, five times; the fastest run counts (a core
// shared with other work only ever measures slower).
[[nodiscard]] FmaPeak measure_fma_peak();

// One core's rate of AVX512_BF16's dot products (vdpbf16ps on 512-bit registers: 16 lanes, each
// adding two bf16 products into fp32), in GFLOP/s counted as a GEMM counts them (2 per product),
// measured as measure_fma_peak is; 0 where the CPU has no AVX512_BF16. Its ratio to the AVX-512 FMA
// peak bounds what bf16 matrix products without AMX can gain over fp32 on this core.
[[nodiscard]] double measure_bf16_dot_peak();

// Whether this CPU's AVX512_BF16 dot products outrun its fp32 multiply-adds: decided from the CPU,
// not measured, so that a busy core cannot change a run's choices (and with them its bits). AMD's
// do (Zen 4: 1.7-2.0x measured), Intel's do not (Sapphire Rapids issues vdpbf16ps at half an
// instruction per cycle against two FMAs: 0.48x); false without AVX512_BF16.
[[nodiscard]] bool bf16_dots_outrun_fma();

}  // namespace gpt2
