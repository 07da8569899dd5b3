// One token's matrix-vector products for decoding, over weight rows in fp32, bf16 or int8: they are
// bound by how fast the weights stream in, so each row is read once and the narrower the cheaper.
#pragma once

#include <cstdint>
#include <span>

#include "ops/bf16.hpp"

namespace gpt2 {

// y[j] = ((accumulate ? y[j] : 0) + bias[j]) + dot(w[j, 0:K], x[0:K]) for j < n.
// w (n, K) row-major, x (K), y (n), bias (n) or null.
void matvec(float* y, const float* x, const float* w, int n, int K, const float* bias,
            bool accumulate);
// The same over bf16 rows (converted exactly to fp32 as they are read).
void matvec(float* y, const float* x, const Bf16* w, int n, int K, const float* bias,
            bool accumulate);
// The same over int8 rows, each with its own scale: y[j] = ((accumulate ? y[j] : 0) + bias[j]) +
// scales[j] * dot(w[j, 0:K], x[0:K]). scales (n).
void matvec(float* y, const float* x, const std::int8_t* w, const float* scales, int n, int K,
            const float* bias, bool accumulate);

// The same products for several vectors at once (decoding several sequences): ys[v] gets exactly
// the bits matvec(ys[v], xs[v], ...) computes, each row of w read (and converted) once for all of
// them. One output per input.
void matvec_many(std::span<float* const> ys, std::span<const float* const> xs, const float* w,
                 int n, int K, const float* bias, bool accumulate);
void matvec_many(std::span<float* const> ys, std::span<const float* const> xs, const Bf16* w, int n,
                 int K, const float* bias, bool accumulate);
void matvec_many(std::span<float* const> ys, std::span<const float* const> xs, const std::int8_t* w,
                 const float* scales, int n, int K, const float* bias, bool accumulate);

// The portable loop behind the overloads above: what every format runs where the build has no
// AVX-512 (declared here so that tests check it on every machine). W is float, Bf16
// or std::int8_t; scales (n) or null, applied as above.
template <typename W>
void matvec_portable(float* y, const float* x, const W* w, const float* scales, int n, int K,
                     const float* bias, bool accumulate);
// And behind matvec_many's where the build has neither AVX-512 nor AVX2 (with AVX2 an explicit loop
// computes the same sums): each (row, vector) as matvec_portable computes it.
template <typename W>
void matvec_many_portable(std::span<float* const> ys, std::span<const float* const> xs, const W* w,
                          const float* scales, int n, int K, const float* bias, bool accumulate);

}  // namespace gpt2
