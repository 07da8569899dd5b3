#include "ops/kernels.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "ops/gemm.hpp"
#include "ops/vector_math.hpp"

namespace gpt2 {

namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
}  // namespace

void encoder_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                     int B, int T, int C) {
    for (int b = 0; b < B; ++b) {
        for (int t = 0; t < T; ++t) {
            float* o = out + (static_cast<long>(b) * T + t) * C;
            const float* w = wte + static_cast<long>(tokens[b * T + t]) * C;
            if (wpe == nullptr) {  // rotary positions: the token's embedding alone
                std::copy(w, w + C, o);
                continue;
            }
            const float* p = wpe + static_cast<long>(t) * C;
            for (int i = 0; i < C; ++i)
                o[i] = w[i] + p[i];
        }
    }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                      int B, int T, int C) {
    for (int b = 0; b < B; ++b) {
        for (int t = 0; t < T; ++t) {
            const float* d = dout + (static_cast<long>(b) * T + t) * C;
            float* dw = dwte + static_cast<long>(tokens[b * T + t]) * C;
            for (int i = 0; i < C; ++i)
                dw[i] += d[i];
            if (dwpe == nullptr) continue;
            float* dp = dwpe + static_cast<long>(t) * C;
            for (int i = 0; i < C; ++i)
                dp[i] += d[i];
        }
    }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C) {
    for (int n = 0; n < N; ++n) {
        const float* x = inp + static_cast<long>(n) * C;
        const float m = lane_sum(C, [x](int i) { return x[i]; }) / static_cast<float>(C);
        const float var = lane_sum(C, [x, m](int i) { return (x[i] - m) * (x[i] - m); });
        mean[n] = m;
        rstd[n] = 1.0f / std::sqrt(var / static_cast<float>(C) + kLayerNormEps);
        // The row while it is in cache, by the very function backward recomputes it with.
        layernorm_recompute(out + static_cast<long>(n) * C, x, mean + n, rstd + n, weight, bias, 1,
                            C);
    }
}

void layernorm_recompute(float* out, const float* inp, const float* mean, const float* rstd,
                         const float* weight, const float* bias, int N, int C) {
    for (int n = 0; n < N; ++n) {
        const float* x = inp + static_cast<long>(n) * C;
        float* o = out + static_cast<long>(n) * C;
        const float m = mean[n];
        const float s = rstd[n];
        for (int i = 0; i < C; ++i)
            o[i] = (x[i] - m) * s * weight[i] + bias[i];
    }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C) {
    for (int n = 0; n < N; ++n) {
        const float* __restrict d = dout + static_cast<long>(n) * C;
        const float* __restrict x = inp + static_cast<long>(n) * C;
        float* __restrict dx = dinp + static_cast<long>(n) * C;
        const float m = mean[n];
        const float s = rstd[n];
        // The two row means in lanes (vectorised, the same order on every CPU).
        std::array<float, kLanes> dnorm_lanes{}, dnorm_norm_lanes{};
        int i = 0;
        for (; i + kLanes <= C; i += kLanes) {
            for (int l = 0; l < kLanes; ++l) {
                const float dnorm = weight[i + l] * d[i + l];
                dnorm_lanes[l] += dnorm;
                dnorm_norm_lanes[l] += dnorm * ((x[i + l] - m) * s);
            }
        }
        for (int l = 0; i + l < C; ++l) {
            const float dnorm = weight[i + l] * d[i + l];
            dnorm_lanes[l] += dnorm;
            dnorm_norm_lanes[l] += dnorm * ((x[i + l] - m) * s);
        }
        const float dnorm_mean = add_lanes(dnorm_lanes) / static_cast<float>(C);
        const float dnorm_norm_mean = add_lanes(dnorm_norm_lanes) / static_cast<float>(C);
        for (int j = 0; j < C; ++j) {
            const float norm = (x[j] - m) * s;
            dx[j] += (weight[j] * d[j] - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
        if (dweight == nullptr) continue;  // frozen weights (LoRA)
        float* __restrict dw = dweight;
        float* __restrict db = dbias;
        for (int j = 0; j < C; ++j) {
            db[j] += d[j];
            dw[j] += (x[j] - m) * s * d[j];
        }
    }
}

namespace {
void add_bias_columns(float* dbias, const float* dout, int N, int OC) {
    for (int n = 0; n < N; ++n) {
        const float* d = dout + static_cast<long>(n) * OC;
        for (int o = 0; o < OC; ++o)
            dbias[o] += d[o];
    }
}

void fill_rows_with_bias(float* out, const float* bias, int N, int OC) {
    for (int n = 0; n < N; ++n) {
        std::memcpy(out + static_cast<long>(n) * OC, bias, sizeof(float) * OC);
    }
}
}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC) {
    float beta = 0.0f;
    if (bias != nullptr) {
        fill_rows_with_bias(out, bias, N, OC);
        beta = 1.0f;
    }
    gemm_nt(N, OC, C, 1.0f, inp, C, weight, C, beta, out, OC);
}

void matmul_residual_forward(float* out, const float* residual, const float* inp,
                             const float* weight, const float* bias, int N, int C, int OC) {
    for (int n = 0; n < N; ++n) {
        float* o = out + static_cast<long>(n) * OC;
        const float* r = residual + static_cast<long>(n) * OC;
        if (bias == nullptr) {
            std::copy(r, r + OC, o);
            continue;
        }
        for (int i = 0; i < OC; ++i)
            o[i] = r[i] + bias[i];
    }
    gemm_nt(N, OC, C, 1.0f, inp, C, weight, C, 1.0f, out, OC);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
    if (dinp != nullptr) gemm_nn(N, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
    if (dweight != nullptr) gemm_tn(OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias != nullptr) add_bias_columns(dbias, dout, N, OC);
}

void matmul_forward_bf16(float* out, const float* residual, const float* inp, Bf16* inp_bf16,
                         const Bf16* weight, const float* bias, int N, int C, int OC) {
    convert_to_bf16(inp_bf16, inp, static_cast<std::size_t>(N) * C);
    if (residual == nullptr && bias != nullptr) {  // oneDNN adds the bias: out written once
        gemm_bf16_nt_bias(N, OC, C, inp_bf16, C, weight, C, bias, out, OC);
        return;
    }
    if (residual != nullptr) {
        for (int n = 0; n < N; ++n) {
            float* o = out + static_cast<long>(n) * OC;
            const float* r = residual + static_cast<long>(n) * OC;
            for (int i = 0; i < OC; ++i)
                o[i] = r[i] + (bias != nullptr ? bias[i] : 0.0f);
        }
    } else if (bias != nullptr) {
        fill_rows_with_bias(out, bias, N, OC);
    }
    const float beta = residual != nullptr || bias != nullptr ? 1.0f : 0.0f;
    gemm_bf16_nt(N, OC, C, inp_bf16, C, weight, C, beta, out, OC);
}

void matmul_forward_bf16_by_blocks(Bf16* out, const float* inp, Bf16* inp_bf16, const Bf16* weight,
                                   const float* bias, int N, int C, int OC, int block) {
    convert_to_bf16(inp_bf16, inp, static_cast<std::size_t>(N) * C);
    for (int j = 0; j < OC / block; ++j) {
        gemm_bf16_nt_bias_rounded(N, block, C, inp_bf16, C,
                                  weight + static_cast<long>(j) * block * C, C,
                                  bias != nullptr ? bias + static_cast<long>(j) * block : nullptr,
                                  out + static_cast<long>(j) * N * block, block);
    }
}

void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const Bf16* weight, Bf16* dout_bf16, Bf16* inp_bf16,
                          int N, int C, int OC) {
    // Without AMX oneDNN reads a transposed first operand about as fast as a plain one
    // (build/bench_gemm on AMD Zen 4: tn 197-209 GFLOP/s, nt 197-224), so the weight gradient
    // takes the row-major roundings (dout's the input gradient's too): no transposed rounding, a
    // 124M step at T=1024 3% faster there.
    const bool row_major_dweight = dweight != nullptr && bf16_backend() == Bf16Backend::Avx512Bf16;
    if (dinp != nullptr || row_major_dweight) {
        convert_to_bf16(dout_bf16, dout, static_cast<std::size_t>(N) * OC);
    }
    if (dinp != nullptr) gemm_bf16_nn(N, C, OC, dout_bf16, OC, weight, C, 0.0f, dinp, C);
    if (row_major_dweight) {
        convert_to_bf16(inp_bf16, inp, static_cast<std::size_t>(N) * C);
        gemm_bf16_tn(OC, C, N, dout_bf16, OC, inp_bf16, C, 1.0f, dweight, C);
    } else if (dweight != nullptr) {
        // dweight += dout^T @ inp with both operands rounded transposed (OC x N and C x N), so the
        // product reads them as the forward reads x and W: oneDNN 2.6 runs that layout on AMX
        // about 1.5x faster than the transposed-A one (build/bench_gemm's bf16 nt against tn).
        // The same rounded values, so the same operands as before.
        convert_to_bf16_transposed(dout_bf16, dout, N, OC);
        convert_to_bf16_transposed(inp_bf16, inp, N, C);
        gemm_bf16_nt(OC, C, N, dout_bf16, N, inp_bf16, N, 1.0f, dweight, C);
    }
    if (dbias != nullptr) add_bias_columns(dbias, dout, N, OC);
}

void causal_softmax_row(float* row, int visible, int end) {
    float maxv = row[0];
    for (int j = 1; j < visible; ++j)
        maxv = std::max(maxv, row[j]);
    float sum = 0.0f;
    for (int j = 0; j < visible; ++j) {
        row[j] = vexp(row[j] - maxv);
        sum += row[j];
    }
    const float inv = 1.0f / sum;
    for (int j = 0; j < visible; ++j)
        row[j] *= inv;
    std::fill(row + visible, row + end, 0.0f);
}

void gelu_forward(float* out, const float* inp, int N) {
    for (int i = 0; i < N; ++i) {
        const float x = inp[i];
        const float u = kGeluScale * (x + 0.044715f * x * x * x);
        out[i] = 0.5f * x * (1.0f + vtanh(u));
    }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int N) {
    for (int i = 0; i < N; ++i) {
        const float x = inp[i];
        const float u = kGeluScale * (x + 0.044715f * x * x * x);
        const float th = vtanh(u);
        const float sech2 = 1.0f - th * th;
        const float du = kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du);
    }
}

void cross_entropy_forward(float* losses, const float* logits, const std::int32_t* targets, int R,
                           int V, int Vp) {
    for (int r = 0; r < R; ++r) {
        const float* row = logits + static_cast<long>(r) * Vp;
        losses[r] = targets[r] < 0 ? 0.0f : log_sum_exp(row, V) - row[targets[r]];
    }
}

void cross_entropy_forward_backward(float* losses, float* logits, const std::int32_t* targets,
                                    int R, int V, int Vp, float dloss) {
    for (int r = 0; r < R; ++r) {
        float* row = logits + static_cast<long>(r) * Vp;
        const int target = targets[r];
        if (target < 0) {  // ignored (PyTorch's ignore_index): no loss, no gradient
            losses[r] = 0.0f;
            std::fill(row, row + Vp, 0.0f);
            continue;
        }
        const float lse = log_sum_exp(row, V);
        losses[r] = lse - row[target];
        for (int j = 0; j < V; ++j)
            row[j] = vexp(row[j] - lse) * dloss;
        row[target] -= dloss;
        for (int j = V; j < Vp; ++j)
            row[j] = 0.0f;
    }
}

}  // namespace gpt2
