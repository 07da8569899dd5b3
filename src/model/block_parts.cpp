#include "model/block_parts.hpp"

#include "ops/kernels.hpp"

namespace gpt2 {

// The block's norm (LayerNorm, or RMSNorm with its gain where it has one) over N rows of C;
// RMSNorm leaves `mean` alone.
void norm_forward(const ModelConfig& c, float* out, float* mean, float* rstd, const float* inp,
                  const float* weight, const float* bias, int N) {
    if (c.arch.norm == NormKind::LayerNorm) {
        layernorm_forward(out, mean, rstd, inp, weight, bias, N, c.channels);
    } else {
        rmsnorm_forward(out, rstd, inp, weight, N, c.channels, c.arch.norm_eps, c.channels);
    }
}
void norm_recompute(const ModelConfig& c, float* out, const float* inp, const float* mean,
                    const float* rstd, const float* weight, const float* bias, int N) {
    if (c.arch.norm == NormKind::LayerNorm) {
        layernorm_recompute(out, inp, mean, rstd, weight, bias, N, c.channels);
    } else {
        rmsnorm_recompute(out, inp, rstd, weight, N, c.channels, c.channels);
    }
}
void norm_backward(const ModelConfig& c, float* dinp, float* dweight, float* dbias,
                   const float* dout, const float* inp, const float* weight, const float* mean,
                   const float* rstd, int N) {
    if (c.arch.norm == NormKind::LayerNorm) {
        layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, c.channels);
    } else {
        rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, N, c.channels, c.channels);
    }
}

void activation_columns(const ModelConfig& c, float* hidden, int n) {
    if (c.arch.mlp == MlpKind::SwiGlu) {
        swiglu_pieces(hidden, hidden, hidden + c.mlp_hidden(), n);
    } else if (c.arch.mlp == MlpKind::ReluSquared) {
        relu2_forward(hidden, hidden, n);
    } else {
        gelu_forward(hidden, hidden, n);
    }
}

// The MLP's activation: act (N, H) from fch (N, F).
void activation_forward(const ModelConfig& c, float* act, const float* fch, int N) {
    const int H = c.mlp_hidden();
    switch (c.arch.mlp) {
        case MlpKind::GeluTanh:
            gelu_forward(act, fch, N * H);
            break;
        case MlpKind::SwiGlu:
            swiglu_forward(act, fch, N, H);
            break;
        case MlpKind::ReluSquared:
            relu2_forward(act, fch, N * H);
            break;
    }
}

void activation_backward(const ModelConfig& c, float* dfch, const float* fch, const float* dact,
                         int N) {
    const int H = c.mlp_hidden();
    switch (c.arch.mlp) {
        case MlpKind::GeluTanh:
            gelu_backward(dfch, fch, dact, N * H);
            break;
        case MlpKind::SwiGlu:
            swiglu_backward(dfch, fch, dact, N, H);
            break;
        case MlpKind::ReluSquared:
            relu2_backward(dfch, fch, dact, N * H);
            break;
    }
}

void rotate_qk_forward(const ModelConfig& c, const RotaryTable& table, float* qkv, int N, int T) {
    if (c.arch.positions != PositionKind::Rotary) return;
    const int W = c.qkv_width();
    rotary_forward(qkv, table, N, T, 0, c.num_heads, c.head_size(), W);
    rotary_forward(qkv + c.channels, table, N, T, 0, c.kv_heads(), c.head_size(), W);
}

void rotate_qk_backward(const ModelConfig& c, const RotaryTable& table, float* dqkv, int N, int T) {
    if (c.arch.positions != PositionKind::Rotary) return;
    const int W = c.qkv_width();
    rotary_backward(dqkv, table, N, T, 0, c.num_heads, c.head_size(), W);
    rotary_backward(dqkv + c.channels, table, N, T, 0, c.kv_heads(), c.head_size(), W);
}

void qk_norm_forward(const ModelConfig& c, float* qkv, float* rstd, int N) {
    if (!c.arch.qk_norm) return;
    const int W = c.qkv_width(), NH = c.num_heads, KV = c.kv_heads(), hs = c.head_size();
    for (int n = 0; n < N; ++n) {
        float* row = qkv + static_cast<long>(n) * W;
        float* s = rstd + static_cast<long>(n) * (NH + KV);
        rmsnorm_forward(row, s, row, nullptr, NH, hs, c.arch.norm_eps, hs);
        rmsnorm_forward(row + c.channels, s + NH, row + c.channels, nullptr, KV, hs,
                        c.arch.norm_eps, hs);
    }
}

void qk_norm_backward(const ModelConfig& c, float* dqkv, const float* qkv, const float* rstd,
                      int N) {
    if (!c.arch.qk_norm) return;
    const int W = c.qkv_width(), NH = c.num_heads, KV = c.kv_heads(), hs = c.head_size();
    for (int n = 0; n < N; ++n) {
        const long at = static_cast<long>(n) * W;
        const float* s = rstd + static_cast<long>(n) * (NH + KV);
        rmsnorm_backward_from_output(dqkv + at, dqkv + at, qkv + at, s, NH, hs, hs);
        rmsnorm_backward_from_output(dqkv + at + c.channels, dqkv + at + c.channels,
                                     qkv + at + c.channels, s + NH, KV, hs, hs);
    }
}

void embedding_norm_forward(const ModelConfig& c, float* encoded, float* rstd, int N) {
    if (!c.arch.embedding_norm) return;
    rmsnorm_forward(encoded, rstd, encoded, nullptr, N, c.channels, c.arch.norm_eps, c.channels);
}

void embedding_norm_backward(const ModelConfig& c, float* dencoded, const float* encoded,
                             const float* rstd, int N) {
    if (!c.arch.embedding_norm) return;
    rmsnorm_backward_from_output(dencoded, dencoded, encoded, rstd, N, c.channels, c.channels);
}

}  // namespace gpt2
