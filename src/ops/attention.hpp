// Causal multi-head self-attention for training, flash style: forward keeps only the output and
// one log-sum-exp per (sequence, head, query row); backward recomputes the probabilities panel by
// panel from q, k and those statistics. No (T x T) tensor exists anywhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ops/bf16.hpp"
#include "ops/dropout.hpp"

namespace gpt2 {

// Query rows per panel: a panel of scores is (kAttentionQueryRows x keys it can see), at most
// 64 x T floats (256 KiB at T = 1024), so a panel and its gradient stay in L2.
inline constexpr int kAttentionQueryRows = 64;

// Floats of scratch attention_forward and attention_backward need for sequences of T tokens.
[[nodiscard]] std::size_t attention_scratch_floats(int T);

// qkv (B, T, 3C): q, k, v each NH heads of C/NH. Writes out (B, T, C), the heads' outputs, and
// lse (B, NH, T): log sum_j exp(score_ij) over the keys j <= i row i can see. With `dropout`
// active, the probabilities are dropped (element (h * T + i) * T + j of each sequence) after the
// softmax, which lse describes undropped.
// Document masking: with `first_keys` (B, T), query row i of sequence b sees only the keys
// [first_keys[b * T + i], i] (0 <= first <= i), the tokens of its own document; the others get
// probability exactly 0 and lse sums over the seen keys only. Empty: every key j <= i.
// Grouped-query attention: with kv_heads (0: NH) dividing NH, qkv is (B, T, C + 2 KV), k and v
// kv_heads heads each (KV = kv_heads x C / NH), query head h reading key/value head
// h / (NH / kv_heads); GPT-2's (B, T, 3C) is kv_heads = NH.
void attention_forward(float* out, float* lse, float* scratch, const float* qkv, int B, int T,
                       int C, int NH, const DropoutMask& dropout = {},
                       std::span<const std::int32_t> first_keys = {}, int kv_heads = 0);

// Gradient of attention_forward: dqkv (B, T, 3C) is overwritten. Reads the forward's out and lse
// and recomputes the probabilities as exp(score - lse). Panels run from the last query rows to the
// first, so the result is the same on every call whatever the thread count. `dropout` must be
// forward's: its masks are drawn again, not stored, and so must `first_keys` be.
// With kv_heads, dqkv is (B, T, C + 2 KV) and a key/value head's dk and dv sum its query heads'.
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* out,
                        const float* lse, const float* qkv, int B, int T, int C, int NH,
                        const DropoutMask& dropout = {},
                        std::span<const std::int32_t> first_keys = {}, int kv_heads = 0);

// The first keys of document masking for B sequences of T tokens: a document begins at each
// `document_start` token (it is its document's first token, as GPT-2's <|endoftext|> begins each
// document of its training data) and at each sequence's first token, so first_keys[b * T + t] is
// the last position s <= t of sequence b where tokens[b * T + s] == document_start, else 0.
void document_first_keys(std::span<std::int32_t> first_keys, std::span<const std::int32_t> tokens,
                         int B, int T, std::int32_t document_start);

// The same attention with its products on bf16 operands and fp32 accumulation (as the model's
// other products in bf16 precision): q, k and v come in bf16 (the qkv product rounds its results,
// which only ever enter these products), per head dO is rounded to bf16 once (backward), and each
// panel's probabilities (dropped, where dropout is) and dS as they enter a product; the softmax,
// its statistics (max, sum, lse) and dO.O stay fp32. Through the bf16 GEMMs (ops/bf16.hpp), so
// the emulated backend gives the fp32 GEMM's numbers on the rounded operands.
// qkv's layout is by heads, (NH + 2 KVH, B * T, hs): block h holds query head h's (B * T, hs),
// block NH + g key head g's, block NH + KVH + g value head g's (KVH = kv_heads, 0: NH; GPT-2's
// (3 * NH, B * T, hs)), each head's columns of the qkv product written densely, because oneDNN 2.6
// runs AMX products only on operands whose rows are dense. dqkv is (B, T, C + 2 KV) as fp32's.
struct AttentionBf16Scratch {
    float* floats;  // attention_bf16_scratch_floats(T, C / NH)
    Bf16* pieces;   // attention_bf16_scratch_pieces(T, C / NH)
};
[[nodiscard]] std::size_t attention_bf16_scratch_floats(int T, int hs);
[[nodiscard]] std::size_t attention_bf16_scratch_pieces(int T, int hs);
// qkv (N, C + 2 KV) rounded into that layout, out (NH + 2 KVH, N, C / NH).
void round_qkv_by_heads(Bf16* out, const float* qkv, int N, int C, int NH, int kv_heads = 0);
void attention_forward_bf16(float* out, float* lse, const AttentionBf16Scratch& scratch,
                            const Bf16* qkv, int B, int T, int C, int NH,
                            const DropoutMask& dropout = {},
                            std::span<const std::int32_t> first_keys = {}, int kv_heads = 0);
void attention_backward_bf16(float* dqkv, const AttentionBf16Scratch& scratch, const float* dout,
                             const float* out, const float* lse, const Bf16* qkv, int B, int T,
                             int C, int NH, const DropoutMask& dropout = {},
                             std::span<const std::int32_t> first_keys = {}, int kv_heads = 0);

// Whether bf16 attention is faster than fp32 attention on this CPU's bf16 backend, so that bf16
// training takes it: on AMX, and on AVX512_BF16 without AMX where the bf16 dot products outrun the
// fp32 multiply-adds (bf16_dots_outrun_fma: AMD Zen 4, not Intel's cores); not where bf16 is
// emulated. Measured, docs/performance.md. GPT2_BF16_ATTENTION=on or off decides instead (tests
// run the model's bf16 attention on any CPU with it; benchmarks compare the two).
[[nodiscard]] bool bf16_attention_pays();

}  // namespace gpt2
