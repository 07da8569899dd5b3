// The layers the families after GPT-2 build their block from, as plain forward/backward functions
// over raw row-major arrays like ops/kernels.hpp's: RMSNorm, rotary positions (Llama's rotate-half
// pairs), SwiGLU and ReLU^2. N is the number of token rows (B*T).
#pragma once

#include <vector>

namespace gpt2 {

// out = inp * rstd * weight, rstd = 1 / sqrt(mean(inp^2) + eps) row-wise (weight null: no gain,
// the speedrun's); saves rstd for backward. Rows of C values `stride` apart (stride >= C; a row of
// several heads' values: call with the head size and the row's stride).
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps, int stride);
// rmsnorm_forward's output again from the rstd it saved, bitwise (backward recomputes it).
void rmsnorm_recompute(float* out, const float* inp, const float* rstd, const float* weight, int N,
                       int C, int stride);
// dinp += ..., dweight += ... (dweight null: no gain or a frozen one). Same layout as forward.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C, int stride);

// The gradient through an RMSNorm without a gain from its output y = x * rstd (what the block
// keeps) instead of its input: dinp = rstd * (dout - y * mean(dout * y)), overwritten (dinp may
// alias dout). Where y and dout are both rotated by the same orthogonal map (rotary after
// QK-norm) the result is the rotated gradient: mean(dout * y) is the same in either frame.
void rmsnorm_backward_from_output(float* dinp, const float* dout, const float* out,
                                  const float* rstd, int N, int C, int stride);

// Rotary positions' angles for positions [0, positions) and a head of `head_size`, as Hugging
// Face's LlamaRotaryEmbedding computes them in fp32: inv_freq[i] = 1 / theta^(2i / head_size),
// angle = position * inv_freq[i]; cos and sin (positions x head_size / 2).
struct RotaryTable {
    int positions = 0;
    int half = 0;  // head_size / 2
    std::vector<float> cos, sin;
};
[[nodiscard]] RotaryTable rotary_table(int positions, int head_size, float theta);
// Rotates `heads` heads of head_size values at the start of each of N rows `stride` apart, in
// place: row r is at position first_position + r % T; each head's halves (x1, x2) become
// (x1 cos - x2 sin, x2 cos + x1 sin) (Llama's rotate_half). Q and K of a qkv row are two calls.
void rotary_forward(float* x, const RotaryTable& table, int N, int T, int first_position, int heads,
                    int head_size, int stride);
// The gradient through it, in place: the inverse rotation (dx1, dx2) -> (dx1 cos + dx2 sin,
// dx2 cos - dx1 sin).
void rotary_backward(float* dx, const RotaryTable& table, int N, int T, int first_position,
                     int heads, int head_size, int stride);

// SwiGLU: inp (N, 2H) holds each row's gate then its up-projection; out (N, H) = silu(gate) * up.
void swiglu_forward(float* out, const float* inp, int N, int H);
// The same over n values given apart (decoding's share of a row); out may alias gate.
void swiglu_pieces(float* out, const float* gate, const float* up, int n);
// dinp (N, 2H) = the gradient of the gate and the up halves (overwritten).
void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int H);

// ReLU^2: out = max(inp, 0)^2 elementwise; backward dinp = dout * 2 max(inp, 0) (dinp may alias
// dout).
void relu2_forward(float* out, const float* inp, int N);
void relu2_backward(float* dinp, const float* inp, const float* dout, int N);

}  // namespace gpt2
