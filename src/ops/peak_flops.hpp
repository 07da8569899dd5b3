// One core's fp32 multiply-add peak, measured in a few milliseconds with the widest vector
// instructions the GEMM kernels use: the yardstick of the MFU the training log prints.
#pragma once

namespace gpt2 {

struct FmaPeak {
    double gflops = 0.0;   // per core
    const char* isa = "";  // "AVX-512 FMA", "AVX2 FMA" or "SSE"
};

// Independent multiply-add chains for about 2 ms, five times; the fastest run counts (a core
// shared with other work only ever measures slower).
[[nodiscard]] FmaPeak measure_fma_peak();

}  // namespace gpt2
