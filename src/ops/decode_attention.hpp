// Attention while decoding, one head against its KV cache: a new token's query against every
// cached position (cache in fp32 or bf16, one template), and a prompt's queries in GEMM blocks
// (against an fp32 cache with the fp32 GEMM, or against a bf16 cache with bf16 products on pieces
// of the queries and probabilities, as ops/prompt_products.hpp splits activations).
//
// A head's cache: keys transposed, keys_t (hs, maxT) with keys_t[d * maxT + position], so that one
// query's scores are a sum of hs contiguous rows scaled by q[d] (vector work with no horizontal
// sums, streaming through memory); values (maxT, hs) with values[position * hs + d], so that its
// output is a sum of contiguous rows.
#pragma once

#include <cstddef>

#include "ops/bf16.hpp"

namespace gpt2 {

// Query rows of a prompt whose scores attend_prompt_rows materialises at once (their score rows
// stay in cache).
inline constexpr int kPromptScoreRows = 64;

// out[0:hs] = softmax(q[0:hs] . keys[0:pos+1] / sqrt(hs)) @ values[0:pos+1]: the query of the token
// at position `pos` against the cached positions 0..pos (its own key and value included). T is
// float or Bf16 (the cache's element). scores: pos + 1 floats of scratch (left holding the
// probabilities).
template <typename T>
void attend_one_query(float* out, const float* q, const T* keys_t, const T* values, float* scores,
                      int pos, int hs, int maxT);

// Causal attention of M query rows at positions pos0.. against an fp32 cache's positions
// 0..pos0+M-1 (the rows' own keys and values already in it): q (M, hs) with rows ldq apart and
// out (M, hs) with rows ldo apart, pointing at the head's hs columns; scores
// (kPromptScoreRows, maxT) scratch.
void attend_prompt_rows(float* out, int ldo, const float* q, int ldq, const float* keys_t,
                        const float* values, float* scores, int M, int pos0, int hs, int maxT);

// Scratch for attend_prompt_rows_bf16 (sizes from prompt_attention_scratch_*).
struct PromptAttentionScratch {
    Bf16* pieces;   // prompt_attention_scratch_pieces(hs, maxT) elements
    float* scores;  // prompt_attention_scratch_floats(hs, maxT) floats
};
[[nodiscard]] std::size_t prompt_attention_scratch_pieces(int hs, int maxT);
[[nodiscard]] std::size_t prompt_attention_scratch_floats(int hs, int maxT);

// attend_prompt_rows against a bf16 cache read as it is stored: each block's queries and then its
// probabilities are split into bf16 pieces that sum to them to fp32 precision, and multiplied by
// the cached keys and values with the bf16 products (oneDNN: AMX where the CPU has it), so the
// result is the fp32 attention over the rounded cache that a token's attention computes. The
// products cover whole 64-position blocks of keys (so that prompts share oneDNN's primitives):
// positions from pos0 + M up to the next multiple of 64 (at most maxT), past the context, are
// zeroed in the cache first.
void attend_prompt_rows_bf16(float* out, int ldo, const float* q, int ldq, Bf16* keys_t,
                             Bf16* values, const PromptAttentionScratch& scratch, int M, int pos0,
                             int hs, int maxT);

}  // namespace gpt2
