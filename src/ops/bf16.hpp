// bf16 matrix products for mixed-precision training (and for prompts with compact weights): bf16
// operands, fp32 accumulation and fp32 results, run on the calling thread through oneDNN (AMX or
// AVX512_BF16 where the CPU has them), or emulated with the fp32 GEMM on bf16-rounded operands
// where oneDNN cannot run bf16; and int8 products into exact int32 for prompts with int8 weights.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace gpt2 {

// A bfloat16 value: the upper 16 bits of an IEEE fp32 number.
enum class Bf16 : std::uint16_t {};

// Round to nearest even (NaN stays NaN), as PyTorch and oneDNN round.
[[nodiscard]] inline Bf16 to_bf16(float value) {
    std::uint32_t bits;
    static_assert(sizeof(bits) == sizeof(value));
    __builtin_memcpy(&bits, &value, sizeof(bits));
    const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
    const std::uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<Bf16>(nan ? ((bits >> 16) | 0x40u) : (rounded >> 16));
}
[[nodiscard]] inline float to_float(Bf16 value) {
    const std::uint32_t bits = static_cast<std::uint32_t>(value) << 16;
    float result;
    __builtin_memcpy(&result, &bits, sizeof(result));
    return result;
}
void convert_to_bf16(Bf16* out, const float* in, std::size_t count);
void convert_to_float(float* out, const Bf16* in, std::size_t count);
// in (rows x cols, rows `cols` apart) rounded as to_bf16 rounds into out transposed (cols x rows,
// rows `rows` apart): out[c * rows + r] = to_bf16(in[r * cols + c]). Lets a product whose operand
// is stored the other way round run in the layout oneDNN's AMX kernels run fastest.
void convert_to_bf16_transposed(Bf16* out, const float* in, int rows, int cols);

// What the bf16 products run on, decided once per process: oneDNN's kernels for AMX-BF16 or
// AVX512_BF16, oneDNN's AVX-512 emulation of bf16, or our emulation (fp32 GEMM on bf16-rounded
// operands; the same numbers, slower). GPT2_BF16_GEMM=emulate forces the last (tests use it to
// check that path on any CPU).
enum class Bf16Backend { Amx, Avx512Bf16, Avx512Emulated, Fp32Emulated };
[[nodiscard]] Bf16Backend bf16_backend();
// For the start-up log: e.g. "AMX-BF16 (oneDNN 2.6.3)".
[[nodiscard]] const char* bf16_backend_name(Bf16Backend backend);

// C(M,N) = A(M,K) * B(N,K)^T + beta * C, beta 0 or 1.
void gemm_bf16_nt(int M, int N, int K, const Bf16* A, int lda, const Bf16* B, int ldb, float beta,
                  float* C, int ldc);
// C(M,N) = A(M,K) * B(K,N) + beta * C
void gemm_bf16_nn(int M, int N, int K, const Bf16* A, int lda, const Bf16* B, int ldb, float beta,
                  float* C, int ldc);
// C(M,N) = A(K,M)^T * B(K,N) + beta * C
void gemm_bf16_tn(int M, int N, int K, const Bf16* A, int lda, const Bf16* B, int ldb, float beta,
                  float* C, int ldc);
// C(M,N) = A(M,K) * B(N,K)^T + bias (N values, one per column; may be null): the bias added to each
// fp32 result, so the product writes C once instead of reading back a bias written first.
void gemm_bf16_nt_bias(int M, int N, int K, const Bf16* A, int lda, const Bf16* B, int ldb,
                       const float* bias, float* C, int ldc);
// The same with the results rounded to bf16 as to_bf16 rounds them, for results that only ever
// enter products. (On AMX and AVX512_BF16 the fp32 results are already flushed to zero below
// 1.2e-38, rounded or not: the bf16 dot-product instructions flush denormals.)
void gemm_bf16_nt_bias_rounded(int M, int N, int K, const Bf16* A, int lda, const Bf16* B, int ldb,
                               const float* bias, Bf16* C, int ldc);
// C(M,N) = alpha * (A(M,K) * B(N,K)^T)
void gemm_bf16_nt_scaled(int M, int N, int K, float alpha, const Bf16* A, int lda, const Bf16* B,
                         int ldb, float* C, int ldc);

// C(M,N) = A(M,K) * B(N,K)^T over int8 operands, exact in int32 (|C| < 2^31 needs K < 2^17):
// oneDNN's int8 matmul (AMX-INT8 or AVX512-VNNI), or a plain loop where it has none or
// GPT2_BF16_GEMM=emulate is set (the same integers, slowly).
void gemm_s8_nt(int M, int N, int K, const std::int8_t* A, int lda, const std::int8_t* B, int ldb,
                std::int32_t* C, int ldc);
// Whether oneDNN runs gemm_s8_nt here with AVX512-VNNI or AMX-INT8 instructions (not with its
// slower int8 code for AVX-512 alone, nor the plain loop, nor under GPT2_BF16_GEMM=emulate).
[[nodiscard]] bool int8_products_native();

}  // namespace gpt2
