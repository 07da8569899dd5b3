// The layers of GPT-2 as plain forward/backward functions over raw row-major arrays. Backward
// functions accumulate (+=) into parameter gradients; what they do to input gradients is stated
// per function. N is the number of token rows (B*T).
#pragma once

#include <cstdint>

#include "ops/bf16.hpp"

namespace gpt2 {

inline constexpr float kLayerNormEps = 1e-5f;

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:] (wpe null: rotary positions, no position rows; dwpe
// null likewise)
void encoder_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                     int B, int T, int C);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                      int B, int T, int C);

// out = (inp - mean) * rstd * weight + bias, row-wise; saves mean and rstd for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
// layernorm_forward's output again from the mean and rstd it saved, bitwise (backward recomputes
// the normalised rows instead of storing them).
void layernorm_recompute(float* out, const float* inp, const float* mean, const float* rstd,
                         const float* weight, const float* bias, int N, int C);
// dinp += ..., dweight += ..., dbias += ... (dweight and dbias both null: frozen, not computed)
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);

// out(N,OC) = inp(N,C) @ weight(OC,C)^T + bias (bias may be null).
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC);
// The residual connection fused in: out = residual + inp @ weight^T + bias. Its backward is the
// identity for the residual path, so the block backward passes dout on unchanged.
void matmul_residual_forward(float* out, const float* residual, const float* inp,
                             const float* weight, const float* bias, int N, int C, int OC);
// dinp = dout @ weight (overwritten; skipped when null), dweight += dout^T @ inp (skipped when
// null: a frozen weight), dbias += column sums of dout (skipped when null).
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC);

// The same products with bf16 operands and fp32 accumulation (--precision bf16): the fp32 input is
// rounded into `inp_bf16` (N*C scratch) and multiplied by the bf16 copy of the weight. `residual`
// and `bias` may be null; out = residual + bias + inp @ weight^T.
void matmul_forward_bf16(float* out, const float* residual, const float* inp, Bf16* inp_bf16,
                         const Bf16* weight, const float* bias, int N, int C, int OC);
// out = bias + inp @ weight^T rounded to bf16, for results that only enter bf16 products, by
// blocks of `block` output columns (OC a multiple): out (OC / block, N, block), each block dense.
void matmul_forward_bf16_by_blocks(Bf16* out, const float* inp, Bf16* inp_bf16, const Bf16* weight,
                                   const float* bias, int N, int C, int OC, int block);
// As matmul_backward, with dout and inp rounded into the scratch arrays (N*OC and N*C bf16; for
// dweight both transposed).
void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const Bf16* weight, Bf16* dout_bf16, Bf16* inp_bf16,
                          int N, int C, int OC);

// One causal attention row: softmax over row[0, visible), zeros in [visible, end) (decoding;
// training's attention is ops/attention.hpp).
void causal_softmax_row(float* row, int visible, int end);

// GELU, tanh approximation.
void gelu_forward(float* out, const float* inp, int N);
// dinp = dout * gelu'(inp); dinp may alias dout.
void gelu_backward(float* dinp, const float* inp, const float* dout, int N);

// Softmax over the first V of Vp columns and cross-entropy against targets, rows independent.
// losses[r] = -log softmax(logits[r])[targets[r]]; a negative target (data/windows.hpp: a position
// the loss mask leaves out) is ignored as PyTorch's ignore_index is: loss 0 and, in the fused
// kernel, a zero gradient row.
void cross_entropy_forward(float* losses, const float* logits, const std::int32_t* targets, int R,
                           int V, int Vp);
// Fused forward and backward: also overwrites logits with dlogits = (softmax - onehot) * dloss
// (zero in the padded columns).
void cross_entropy_forward_backward(float* losses, float* logits, const std::int32_t* targets,
                                    int R, int V, int Vp, float dloss);

}  // namespace gpt2
