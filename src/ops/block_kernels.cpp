#include "ops/block_kernels.hpp"

#include <array>
#include <cmath>

#include "ops/vector_math.hpp"

namespace gpt2 {

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps, int stride) {
    for (int n = 0; n < N; ++n) {
        const float* x = inp + static_cast<long>(n) * stride;
        float* o = out + static_cast<long>(n) * stride;
        const float squares = lane_sum(C, [x](int i) { return x[i] * x[i]; });
        rstd[n] = 1.0f / std::sqrt(squares / static_cast<float>(C) + eps);
        // The row while it is in cache, by the very function backward recomputes it with.
        rmsnorm_recompute(o, x, rstd + n, weight, 1, C, stride);
    }
}

void rmsnorm_recompute(float* out, const float* inp, const float* rstd, const float* weight, int N,
                       int C, int stride) {
    for (int n = 0; n < N; ++n) {
        const float* x = inp + static_cast<long>(n) * stride;
        float* o = out + static_cast<long>(n) * stride;
        const float s = rstd[n];
        for (int i = 0; i < C; ++i)
            o[i] = weight != nullptr ? x[i] * s * weight[i] : x[i] * s;
    }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C, int stride) {
    for (int n = 0; n < N; ++n) {
        const float* __restrict d = dout + static_cast<long>(n) * stride;
        const float* __restrict x = inp + static_cast<long>(n) * stride;
        float* __restrict dx = dinp + static_cast<long>(n) * stride;
        const float s = rstd[n];
        // dnorm = dout * weight; dx = s (dnorm - norm mean(dnorm norm)), norm = x s.
        const float dot = lane_sum(C, [&](int i) {
            const float dnorm = weight != nullptr ? weight[i] * d[i] : d[i];
            return dnorm * (x[i] * s);
        });
        const float mean = dot / static_cast<float>(C);
        for (int i = 0; i < C; ++i) {
            const float dnorm = weight != nullptr ? weight[i] * d[i] : d[i];
            dx[i] += (dnorm - x[i] * s * mean) * s;
        }
        if (dweight == nullptr) continue;
        for (int i = 0; i < C; ++i)
            dweight[i] += d[i] * (x[i] * s);
    }
}

void rmsnorm_backward_from_output(float* dinp, const float* dout, const float* out,
                                  const float* rstd, int N, int C, int stride) {
    for (int n = 0; n < N; ++n) {
        const float* d = dout + static_cast<long>(n) * stride;
        const float* y = out + static_cast<long>(n) * stride;
        float* dx = dinp + static_cast<long>(n) * stride;
        const float s = rstd[n];
        // dx = s (dy - y mean(dy y)) with y = x s: the input's own formula, y given.
        const float mean = lane_sum(C, [&](int i) { return d[i] * y[i]; }) / static_cast<float>(C);
        for (int i = 0; i < C; ++i)
            dx[i] = (d[i] - y[i] * mean) * s;
    }
}

RotaryTable rotary_table(int positions, int head_size, float theta) {
    RotaryTable table;
    table.positions = positions;
    table.half = head_size / 2;
    const auto size = static_cast<std::size_t>(positions) * static_cast<std::size_t>(table.half);
    table.cos.resize(size);
    table.sin.resize(size);
    std::vector<float> inv_freq(static_cast<std::size_t>(table.half));
    for (int i = 0; i < table.half; ++i) {
        // torch: 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)), all in fp32.
        const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_size);
        inv_freq[static_cast<std::size_t>(i)] = 1.0f / std::pow(theta, exponent);
    }
    for (int p = 0; p < positions; ++p) {
        for (int i = 0; i < table.half; ++i) {
            const float angle = static_cast<float>(p) * inv_freq[static_cast<std::size_t>(i)];
            const std::size_t at =
                static_cast<std::size_t>(p) * static_cast<std::size_t>(table.half) +
                static_cast<std::size_t>(i);
            table.cos[at] = std::cos(angle);
            table.sin[at] = std::sin(angle);
        }
    }
    return table;
}

namespace {
// (x1, x2) -> (x1 c - x2 s, x2 c + x1 s) with sign = 1; the inverse rotation with sign = -1.
void rotate(float* x, const RotaryTable& table, int N, int T, int first_position, int heads,
            int head_size, int stride, float sign) {
    const int half = head_size / 2;
    for (int n = 0; n < N; ++n) {
        const int position = first_position + n % T;
        const float* c = table.cos.data() + static_cast<long>(position) * table.half;
        const float* s = table.sin.data() + static_cast<long>(position) * table.half;
        for (int h = 0; h < heads; ++h) {
            float* x1 = x + static_cast<long>(n) * stride + static_cast<long>(h) * head_size;
            float* x2 = x1 + half;
            for (int i = 0; i < half; ++i) {
                const float a = x1[i], b = x2[i], sin = sign * s[i];
                x1[i] = a * c[i] - b * sin;
                x2[i] = b * c[i] + a * sin;
            }
        }
    }
}
}  // namespace

void rotary_forward(float* x, const RotaryTable& table, int N, int T, int first_position, int heads,
                    int head_size, int stride) {
    rotate(x, table, N, T, first_position, heads, head_size, stride, 1.0f);
}

void rotary_backward(float* dx, const RotaryTable& table, int N, int T, int first_position,
                     int heads, int head_size, int stride) {
    rotate(dx, table, N, T, first_position, heads, head_size, stride, -1.0f);
}

void swiglu_forward(float* out, const float* inp, int N, int H) {
    for (int n = 0; n < N; ++n) {
        const float* gate = inp + static_cast<long>(n) * 2 * H;
        swiglu_pieces(out + static_cast<long>(n) * H, gate, gate + H, H);
    }
}

void swiglu_pieces(float* out, const float* gate, const float* up, int n) {
    for (int i = 0; i < n; ++i) {
        const float g = gate[i];
        out[i] = g / (1.0f + vexp(-g)) * up[i];
    }
}

void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int H) {
    for (int n = 0; n < N; ++n) {
        const float* gate = inp + static_cast<long>(n) * 2 * H;
        const float* up = gate + H;
        const float* d = dout + static_cast<long>(n) * H;
        float* dgate = dinp + static_cast<long>(n) * 2 * H;
        float* dup = dgate + H;
        for (int i = 0; i < H; ++i) {
            const float g = gate[i];
            const float sigmoid = 1.0f / (1.0f + vexp(-g));
            const float silu = g * sigmoid;
            dgate[i] = d[i] * up[i] * sigmoid * (1.0f + g * (1.0f - sigmoid));
            dup[i] = d[i] * silu;
        }
    }
}

void relu2_forward(float* out, const float* inp, int N) {
    for (int i = 0; i < N; ++i) {
        const float r = inp[i] > 0.0f ? inp[i] : 0.0f;
        out[i] = r * r;
    }
}

void relu2_backward(float* dinp, const float* inp, const float* dout, int N) {
    for (int i = 0; i < N; ++i) {
        const float r = inp[i] > 0.0f ? inp[i] : 0.0f;
        dinp[i] = dout[i] * 2.0f * r;
    }
}

}  // namespace gpt2
