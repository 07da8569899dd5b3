// A prompt's products with bf16 or int8 weight rows at fp32 accuracy: the fp32 activations are
// split into a few bf16 or int8 pieces that sum back to them to within fp32 rounding, the pieces
// are multiplied by the weight rows as they are stored (oneDNN's bf16 or int8 matmul, AMX where
// the CPU has it), and the partial results are summed. So a prompt computes the function a token's
// matrix-vector products compute (fp32 activations against the same rows) at matrix-product
// speed, and the logits after a prefill agree with token-by-token decoding.
#pragma once

#include <cstdint>

#include "ops/bf16.hpp"

namespace gpt2 {

// bf16 pieces per activation: x = hi + mid + lo to within 2^-24 |x| (each piece holds the next 8
// significant bits; the weights are bf16, so each piece's products are exact). Two pieces (2^-16)
// left a prompt's logits some 40 times further from the token path's than three.
inline constexpr int kBf16Pieces = 3;
// int8 pieces per activation, scaled per row: x = s1 q1 + s2 q2 + s3 q3 to within
// max|row| / (127 * 254^2 * 2) (each piece refines the last one's rounding error 254-fold).
inline constexpr int kInt8Pieces = 3;

// Splits rows [i0, i1) of x (M rows of K, ldx apart) into kBf16Pieces stacked blocks of Mp rows:
// out (kBf16Pieces * Mp, K), piece p's row i at out[(p * Mp + i) * K]. Rows from M to Mp are the
// padding a product's shape may need: zero pieces. Workers may split disjoint row ranges at once.
void split_into_bf16_pieces(Bf16* out, const float* x, int ldx, int M, int Mp, int K, int i0,
                            int i1);
// The same in kInt8Pieces int8 blocks, with scales (kInt8Pieces * Mp): x[i, k] ~ sum_p
// scales[p * Mp + i] * out[(p * Mp + i) * K + k]. A zero row has zero pieces and scales; a row
// with an infinity or NaN zero pieces and NaN scales (its products are NaN).
void split_into_int8_pieces(std::int8_t* out, float* scales, const float* x, int ldx, int M, int Mp,
                            int K, int i0, int i1);
// The same splits by the portable loops, which the two above run where the build has no AVX-512
// (declared here so that tests check them on every machine; their pieces are the same).
void split_into_bf16_pieces_portable(Bf16* out, const float* x, int ldx, int M, int Mp, int K,
                                     int i0, int i1);
void split_into_int8_pieces_portable(std::int8_t* out, float* scales, const float* x, int ldx,
                                     int M, int Mp, int K, int i0, int i1);

// out[i * ldo + j] = ((accumulate ? out : 0) + bias[j]) + x[i] . w[j] for i < M, j < n, with x
// given as split_into_bf16_pieces wrote it and w (n, K) bf16 rows; bias may be null. scratch:
// kBf16Pieces * Mp * n floats.
void pieces_product(float* out, int ldo, const Bf16* pieces, int M, int Mp, int K, const Bf16* w,
                    int n, const float* bias, bool accumulate, float* scratch);
// The same with int8 rows, row j scaled by row_scales[j] (as the int8 matvec applies it: the
// scale times the dot product), x given as split_into_int8_pieces wrote it. scratch:
// kInt8Pieces * Mp * n int32.
void pieces_product(float* out, int ldo, const std::int8_t* pieces, const float* piece_scales,
                    int M, int Mp, int K, const std::int8_t* w, const float* row_scales, int n,
                    const float* bias, bool accumulate, std::int32_t* scratch);

}  // namespace gpt2
