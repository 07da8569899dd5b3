#include "ops/lm_head.hpp"

#include <algorithm>
#include <cmath>

#include "ops/vector_math.hpp"

namespace gpt2 {

namespace {
float row_exp_sum(const float* x, int n, float shift) {
    return lane_sum(n, [x, shift](int j) { return vexp(x[j] - shift); });
}

// Where block v0 of the logits starts, its width, and how many of its columns are real tokens.
struct VocabBlock {
    int v0, width, valid;
};
VocabBlock vocab_block(int v0, int V, int Vp) {
    const int width = std::min(kLmHeadVocabBlock, Vp - v0);
    return VocabBlock{v0, width, std::clamp(V - v0, 0, width)};
}

// The logits block by block, each block's row maxima and sums of exponentials merged into the
// running ones while it is in cache (the online softmax's merge); leaves every row's log-sum-exp
// in statistics[r] and its loss in losses[r].
void logits_and_losses(float* losses, const float* inp, const Bf16* wte,
                       const std::int32_t* targets, int R, int C, int V, int Vp,
                       const LmHeadBf16Scratch& s) {
    float* const maximum = s.statistics;
    float* const sum = s.statistics + R;
    convert_to_bf16(s.inp, inp, static_cast<std::size_t>(R) * C);
    for (int v0 = 0; v0 < Vp; v0 += kLmHeadVocabBlock) {
        const VocabBlock blk = vocab_block(v0, V, Vp);
        float* const logits = s.logits + static_cast<long>(v0) * R;
        gemm_bf16_nt(R, blk.width, C, s.inp, C, wte + static_cast<long>(v0) * C, C, 0.0f, logits,
                     blk.width);
        if (blk.valid == 0) continue;
        for (int r = 0; r < R; ++r) {
            const float* row = logits + static_cast<long>(r) * blk.width;
            const float m = lane_max(row, blk.valid);
            const float e = row_exp_sum(row, blk.valid, m);
            if (v0 == 0) {
                maximum[r] = m;
                sum[r] = e;
            } else {
                const float merged = std::max(maximum[r], m);
                sum[r] = sum[r] * vexp(maximum[r] - merged) + e * vexp(m - merged);
                maximum[r] = merged;
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        const float lse = maximum[r] + std::log(sum[r]);
        s.statistics[r] = lse;
        const int target = targets[r];
        if (target < 0) {  // ignored (PyTorch's ignore_index): no loss, no gradient
            losses[r] = 0.0f;
            continue;
        }
        const int t0 = target / kLmHeadVocabBlock * kLmHeadVocabBlock;
        const int width = vocab_block(t0, V, Vp).width;
        losses[r] =
            lse -
            s.logits[static_cast<long>(t0) * R + static_cast<long>(r) * width + (target - t0)];
    }
}
}  // namespace

std::size_t lm_head_bf16_scratch_floats(int R, int Vp) {
    return static_cast<std::size_t>(R) * static_cast<std::size_t>(Vp) +
           2 * static_cast<std::size_t>(R);
}

std::size_t lm_head_bf16_scratch_pieces(int R, int C) {
    const auto r = static_cast<std::size_t>(R);
    return r * static_cast<std::size_t>(C) + r * kLmHeadVocabBlock;
}

void lm_head_loss_bf16(float* losses, const float* inp, const Bf16* wte,
                       const std::int32_t* targets, int R, int C, int V, int Vp,
                       const LmHeadBf16Scratch& scratch) {
    logits_and_losses(losses, inp, wte, targets, R, C, V, Vp, scratch);
}

void lm_head_forward_backward_bf16(float* losses, float* dinp, float* dwte, const float* inp,
                                   const Bf16* wte, const std::int32_t* targets, int R, int C,
                                   int V, int Vp, float dloss, const LmHeadBf16Scratch& s) {
    logits_and_losses(losses, inp, wte, targets, R, C, V, Vp, s);
    const float* const lse = s.statistics;
    for (int v0 = 0; v0 < Vp; v0 += kLmHeadVocabBlock) {
        const VocabBlock blk = vocab_block(v0, V, Vp);
        float* const block = s.logits + static_cast<long>(v0) * R;
        // dlogits = (softmax - onehot) * dloss, in place and rounded, while the block is in cache.
        for (int r = 0; r < R; ++r) {
            float* const row = block + static_cast<long>(r) * blk.width;
            Bf16* const rounded = s.dlogits + static_cast<long>(r) * blk.width;
            const int target = targets[r];
            const int valid = target < 0 ? 0 : blk.valid;
            const float shift = lse[r];
            for (int j = 0; j < valid; ++j)
                row[j] = vexp(row[j] - shift) * dloss;
            std::fill(row + valid, row + blk.width, 0.0f);
            if (target >= v0 && target < v0 + blk.width) row[target - v0] -= dloss;
            convert_to_bf16(rounded, row, static_cast<std::size_t>(blk.width));
        }
        // dinp (+)= dlogits @ wte[v0:];  dwte[v0:] += dlogits^T @ inp, both from the row-major
        // operands: at a block's shape oneDNN 2.6's transposed-A product is faster than rounding
        // transposed copies for its nt one (AMX: 1.65 against 2.01 ms per block at C = 768, and
        // 2.30 against 2.43 at C = 1024; AVX512_BF16 8.0 against 8.8).
        gemm_bf16_nn(R, C, blk.width, s.dlogits, blk.width, wte + static_cast<long>(v0) * C, C,
                     v0 == 0 ? 0.0f : 1.0f, dinp, C);
        if (dwte == nullptr) continue;
        gemm_bf16_tn(blk.width, C, R, s.dlogits, blk.width, s.inp, C, 1.0f,
                     dwte + static_cast<long>(v0) * C, C);
    }
}

}  // namespace gpt2
