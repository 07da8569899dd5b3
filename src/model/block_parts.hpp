// The parts of the block where the architectures differ, each one call over the configuration:
// the norm (LayerNorm, RMSNorm), the MLP's activation (GELU, SwiGLU, ReLU^2), the rotation of
// q and k (rotary positions), QK-norm and the embeddings' norm. The training forward and backward
// (forward_backward.cpp) call them.
#pragma once

#include "model/model.hpp"
#include "ops/block_kernels.hpp"

namespace gpt2 {

// The block's norm over N rows of C: LayerNorm (mean and rstd saved), or RMSNorm with its gain
// where it has one (rstd saved; `mean` left alone). weight and bias null where absent.
void norm_forward(const ModelConfig& c, float* out, float* mean, float* rstd, const float* inp,
                  const float* weight, const float* bias, int N);
// norm_forward's output again from what it saved, bitwise.
void norm_recompute(const ModelConfig& c, float* out, const float* inp, const float* mean,
                    const float* rstd, const float* weight, const float* bias, int N);
// dinp += ..., dweight and dbias += ... (null: absent or frozen).
void norm_backward(const ModelConfig& c, float* dinp, float* dweight, float* dbias,
                   const float* dout, const float* inp, const float* weight, const float* mean,
                   const float* rstd, int N);

// The MLP's activation: act (N, H) from the first product's fch (N, F).
void activation_forward(const ModelConfig& c, float* act, const float* fch, int N);
// dfch (N, F) from dact (N, H), overwritten; GELU and ReLU^2 may run in place (dfch == dact),
// SwiGLU may not (F = 2H).
void activation_backward(const ModelConfig& c, float* dfch, const float* fch, const float* dact,
                         int N);

// The activation on n hidden columns of one row of the first product's output, in place, as the
// decoder's passes split it over workers: `hidden` at the first column (SwiGLU: the gate's, its
// up-projection's H columns further on, the result into the gate's).
void activation_columns(const ModelConfig& c, float* hidden, int n);

// Rotary positions on a qkv (N, W) of sequences of T: q's heads and k's rotated in place (nothing
// with learned positions); backward rotates their gradients back.
void rotate_qk_forward(const ModelConfig& c, const RotaryTable& table, float* qkv, int N, int T);
void rotate_qk_backward(const ModelConfig& c, const RotaryTable& table, float* dqkv, int N, int T);

// QK-norm: each head of q and of k in a qkv (N, W) RMS-normalized without a gain, in place,
// before rotary; rstd (N, NH + KV) saved. Nothing without QK-norm.
void qk_norm_forward(const ModelConfig& c, float* qkv, float* rstd, int N);
// Its backward on dqkv in place, from the stored qkv (normed, then rotated where rotary: run it
// before rotate_qk_backward, in the rotated frame, where mean(dy * y) is the same).
void qk_norm_backward(const ModelConfig& c, float* dqkv, const float* qkv, const float* rstd,
                      int N);

// The embeddings' norm (RMSNorm without a gain, the speedrun's): `encoded` (N, C) in place, rstd
// (N) saved; backward on dencoded in place from the normed `encoded`. Nothing without it.
void embedding_norm_forward(const ModelConfig& c, float* encoded, float* rstd, int N);
void embedding_norm_backward(const ModelConfig& c, float* dencoded, const float* encoded,
                             const float* rstd, int N);

}  // namespace gpt2
