// The LM head on bf16 operands (--precision bf16): logits = x @ wte^T with its cross-entropy and
// backward, over the vocabulary in blocks, so each product reads a cache-sized slice of wte and
// each block of logits is reduced and rounded while it is still in cache.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/bf16.hpp"

namespace gpt2 {

// Vocabulary columns per block: wte's slice is 768 KiB of bf16 at C = 768, a block of logits for
// 1024 rows 2 MiB (an L2). oneDNN 2.6 multiplies rows by all of GPT-2's 50304-row wte at once 1.4x
// (forward) and 1.7x (input gradient) slower than block by block; 512 measured up to 1% faster
// than 256 or 1024 in whole steps.
inline constexpr int kLmHeadVocabBlock = 512;

// One call's scratch for R rows of C channels and Vp logits each.
struct LmHeadBf16Scratch {
    float* logits;      // R * Vp, block by block: block v0 is (R, nb) at logits + v0 * R
    float* statistics;  // 2 * R: each row's running maximum and sum of exponentials
    Bf16* inp;          // R * C: the rounded input
    Bf16* dlogits;      // R * kLmHeadVocabBlock: one block's gradient, rounded
};

// Floats and bf16 elements of the scratch above.
[[nodiscard]] std::size_t lm_head_bf16_scratch_floats(int R, int Vp);
[[nodiscard]] std::size_t lm_head_bf16_scratch_pieces(int R, int C);

// losses[r] = -log softmax(inp[r] @ wte^T)[targets[r]] over the first V of Vp columns (0 for a
// negative target, as cross_entropy_forward). inp (R, C) fp32, wte (Vp, C) bf16.
void lm_head_loss_bf16(float* losses, const float* inp, const Bf16* wte,
                       const std::int32_t* targets, int R, int C, int V, int Vp,
                       const LmHeadBf16Scratch& scratch);

// The losses, and with dlogits = (softmax - onehot) * dloss (zero for a negative target and in the
// padded columns): dinp = dlogits @ wte (overwritten), dwte += dlogits^T @ inp (skipped when null).
void lm_head_forward_backward_bf16(float* losses, float* dinp, float* dwte, const float* inp,
                                   const Bf16* wte, const std::int32_t* targets, int R, int C,
                                   int V, int Vp, float dloss, const LmHeadBf16Scratch& scratch);

}  // namespace gpt2
