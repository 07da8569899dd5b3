// Muon (Keller Jordan's, as github.com/KellerJordan/Muon's muon_update writes it): momentum with
// Nesterov, the update orthogonalized by five quintic Newton-Schulz iterations, on every hidden
// 2-D matrix (Q, K and V apart); AdamW on the embeddings, LayerNorms and biases.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "optim/optimizer.hpp"

namespace gpt2 {

// One matrix Muon orthogonalizes: `rows` x `cols` floats from `offset` of the flat layout, rows
// the output features (a row-major weight as the products read it).
struct MuonMatrix {
    std::size_t offset = 0;
    int rows = 0;
    int cols = 0;
    [[nodiscard]] std::size_t size() const {
        return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
    }
};

// The hidden matrices of a GPT-2 layout in layout order: each layer's Q, K, V (qkvw's three row
// blocks), attention projection, MLP fc and its projection.
[[nodiscard]] std::vector<MuonMatrix> muon_matrices(const ParameterLayout& layout);

// The floats one matrix's update needs on its worker: the update itself and newton_schulz5's
// scratch (r*c + 2*r*r).
[[nodiscard]] std::size_t muon_scratch_floats(const MuonMatrix& matrix);

// newton_schulz5's flops on one matrix (r <= c after the transpose): five iterations of
// X X^T (2 r r c), A A (2 r r r) and B X (2 r r c).
[[nodiscard]] double newton_schulz_flops(const MuonMatrix& matrix);

// The bf16s it needs besides where its products are bf16 (X, A and B rounded: r*c + 2*r*r).
[[nodiscard]] std::size_t muon_scratch_bf16s(const MuonMatrix& matrix);
// The quintic Newton-Schulz iteration with coefficients (3.4445, -4.7750, 2.0315): X (r x c,
// r <= c, row-major) divided by its Frobenius norm (+1e-7), then `steps` times A = X X^T,
// B = b A + c A A, X = a X + B X, through the GEMM layer. `scratch` holds at least r*c + 2*r*r
// floats. With `bf16_scratch` (as many bf16s) the three products take their operands rounded to
// bf16 (fp32 sums, the rest fp32: where bf16 products run several times faster); without, fp32.
// The result replaces X.
void newton_schulz5(std::span<float> x, int r, int c, int steps, std::span<float> scratch,
                    std::span<Bf16> bf16_scratch = {});
// Whether a run of `precision` orthogonalizes with bf16 products: bf16 runs where this CPU's bf16
// products outrun its fp32 ones (AMX-BF16; AVX512_BF16 where bf16_dots_outrun_fma: AMD's).
// Elsewhere (emulated bf16, Intel's AVX512_BF16 without AMX) they are slower, so fp32.
[[nodiscard]] bool newton_schulz_in_bf16(Precision precision);

class Muon final : public Optimizer {
  public:
    Muon(std::size_t count, std::size_t first, const MuonSettings& settings)
        : Optimizer(count, first), settings_(settings) {}
    [[nodiscard]] OptimizerKind kind() const override { return OptimizerKind::Muon; }
    // Matrices wholly inside target.owned are Muon's (each on one worker, so the bits do not
    // depend on the worker count); one cut by owned is a logic error (the exchange slices on
    // indivisible_ranges). The rest of owned is AdamW's. An adapter (no layout) is refused.
    void update(const UpdateTarget& target, const StepRates& rates, ThreadPool& pool) override;

  private:
    MuonSettings settings_;
    std::vector<MuonMatrix> matrices_;               // the model's, found at the first update
    std::vector<AlignedBuffer<float>> scratch_;      // per worker
    std::vector<AlignedBuffer<Bf16>> bf16_scratch_;  // per worker, where the products are bf16
};

}  // namespace gpt2
