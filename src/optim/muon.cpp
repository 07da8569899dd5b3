#include "optim/muon.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "ops/bf16.hpp"
#include "ops/gemm.hpp"
#include "ops/peak_flops.hpp"
#include "optim/adamw.hpp"
#include "threads/thread_pool.hpp"

namespace gpt2 {

std::vector<MuonMatrix> muon_matrices(const ParameterLayout& layout) {
    // The tensors the model's table hands to Muon, each layer's slice cut into its parts (Q, K
    // and V of the fused qkv apart), in layout order (the ranges a slice must hold whole are
    // sorted).
    std::vector<MuonMatrix> matrices;
    for (const TensorSpec& spec : layout.specs()) {
        if (spec.muon_blocks.empty()) continue;
        const std::size_t per_layer = spec.per_layer_size();
        const std::size_t slices = layout.size(spec.id) / per_layer;
        for (std::size_t l = 0; l < slices; ++l) {
            std::size_t row = 0;
            for (const std::size_t rows : spec.muon_blocks) {
                matrices.push_back({layout.offset(spec.id) + l * per_layer + row * spec.cols,
                                    static_cast<int>(rows), static_cast<int>(spec.cols)});
                row += rows;
            }
        }
    }
    std::sort(matrices.begin(), matrices.end(),
              [](const MuonMatrix& a, const MuonMatrix& b) { return a.offset < b.offset; });
    return matrices;
}

double newton_schulz_flops(const MuonMatrix& matrix) {
    const double r = std::min(matrix.rows, matrix.cols), c = std::max(matrix.rows, matrix.cols);
    return 5.0 * (4.0 * r * r * c + 2.0 * r * r * r);
}

std::size_t muon_scratch_floats(const MuonMatrix& matrix) {
    const auto r = static_cast<std::size_t>(std::min(matrix.rows, matrix.cols));
    return 2 * matrix.size() + 2 * r * r;
}

std::size_t muon_scratch_bf16s(const MuonMatrix& matrix) {
    const auto r = static_cast<std::size_t>(std::min(matrix.rows, matrix.cols));
    return matrix.size() + 2 * r * r;
}

void newton_schulz5(std::span<float> x, int r, int c, int steps, std::span<float> scratch,
                    std::span<Bf16> bf16_scratch) {
    constexpr float a = 3.4445f, b = -4.7750f, k = 2.0315f;
    const std::size_t n = static_cast<std::size_t>(r) * static_cast<std::size_t>(c);
    const std::size_t rr = static_cast<std::size_t>(r) * static_cast<std::size_t>(r);
    const bool bf16 = !bf16_scratch.empty();
    if (r > c || x.size() < n || scratch.size() < n + 2 * rr ||
        (bf16 && bf16_scratch.size() < n + 2 * rr)) {
        throw std::invalid_argument(
            "newton_schulz5: needs r <= c and r*c + 2r^2 scratch floats (and as many bf16s)");
    }
    double squares = 0.0;
    for (std::size_t i = 0; i < n; ++i)
        squares += static_cast<double>(x[i]) * x[i];
    const float inv = 1.0f / (static_cast<float>(std::sqrt(squares)) + 1e-7f);
    for (std::size_t i = 0; i < n; ++i)
        x[i] *= inv;
    float* X = x.data();
    float* next = scratch.data();
    float* A = next + n;
    float* B = A + rr;
    for (int s = 0; s < steps; ++s) {
        if (bf16) {
            // The same iteration with each product's operands rounded to bf16 as they enter it
            // (fp32 sums; X, A and B themselves stay fp32, as do a X and b A).
            Bf16* Xb = bf16_scratch.data();
            Bf16* Ab = Xb + n;
            Bf16* Bb = Ab + rr;
            convert_to_bf16(Xb, X, n);
            gemm_bf16_nt(r, r, c, Xb, c, Xb, c, 0.0f, A, r);  // A = X X^T
            convert_to_bf16(Ab, A, rr);
            gemm_bf16_nn(r, r, r, Ab, r, Ab, r, 0.0f, B, r);  // B = A A
            for (std::size_t i = 0; i < rr; ++i)
                B[i] = b * A[i] + k * B[i];
            convert_to_bf16(Bb, B, rr);
            gemm_bf16_nn(r, c, r, Bb, r, Xb, c, 0.0f, next, c);  // next = B X
            for (std::size_t i = 0; i < n; ++i)
                next[i] = a * X[i] + next[i];
        } else {
            gemm_nt(r, r, c, 1.0f, X, c, X, c, 0.0f, A, r);  // A = X X^T
            std::copy(A, A + rr, B);
            gemm_nn(r, r, r, k, A, r, A, r, b, B, r);  // B = b A + k A A
            std::copy(X, X + n, next);
            gemm_nn(r, c, r, 1.0f, B, r, X, c, a, next, c);  // next = a X + B X
        }
        std::swap(X, next);
    }
    if (X != x.data()) std::copy(X, X + n, x.data());
}

bool newton_schulz_in_bf16(Precision precision) {
    // Decided from the CPU, never measured, so every rank of a machine and every run decides
    // alike (the choice changes the bits).
    const Bf16Backend backend = bf16_backend();
    return precision == Precision::Bf16 &&
           (backend == Bf16Backend::Amx ||
            (backend == Bf16Backend::Avx512Bf16 && bf16_dots_outrun_fma()));
}

namespace {

// One matrix's Muon update on the calling thread: momentum (buf), Nesterov's look-ahead, the
// orthogonalized update (transposed while it has more rows than columns), decoupled decay.
void update_matrix(const MuonMatrix& mat, const UpdateTarget& t, OptimizerState& state,
                   const MuonSettings& s, const StepRates& rates, std::span<float> scratch,
                   std::span<Bf16> bf16_scratch) {
    const std::size_t n = mat.size();
    float* p = t.params.data() + mat.offset;
    float* g = t.gradient.data() + mat.offset;
    float* buf = state.m.data() + (mat.offset - state.first);
    const bool transpose = mat.rows > mat.cols;
    const int r = std::min(mat.rows, mat.cols);
    const int c = std::max(mat.rows, mat.cols);
    const std::span<float> x = scratch.first(n);
    const float beta = s.momentum;
    for (int i = 0; i < mat.rows; ++i) {
        for (int j = 0; j < mat.cols; ++j) {
            const std::size_t at = static_cast<std::size_t>(i) * mat.cols + j;
            const float grad = g[at] * rates.grad_scale;
            // torch.lerp's two forms: buf.lerp_(grad, 1 - beta), then grad.lerp_(buf, beta).
            buf[at] = buf[at] + (1.0f - beta) * (grad - buf[at]);
            const float u = s.nesterov ? buf[at] - (buf[at] - grad) * (1.0f - beta) : buf[at];
            x[transpose ? static_cast<std::size_t>(j) * mat.rows + i : at] = u;
            g[at] = 0.0f;
        }
    }
    newton_schulz5(x, r, c, s.newton_schulz_steps, scratch.subspan(n), bf16_scratch);
    const float scale = std::sqrt(std::max(1.0f, static_cast<float>(mat.rows) / mat.cols));
    const float step = rates.muon_lr * scale;
    const float decay = 1.0f - rates.muon_lr * s.weight_decay;
    Bf16* twin = t.params_bf16.empty() ? nullptr : t.params_bf16.data() + mat.offset;
    for (int i = 0; i < mat.rows; ++i) {
        for (int j = 0; j < mat.cols; ++j) {
            const std::size_t at = static_cast<std::size_t>(i) * mat.cols + j;
            const float o = x[transpose ? static_cast<std::size_t>(j) * mat.rows + i : at];
            p[at] = p[at] * decay - step * o;
            if (twin != nullptr) twin[at] = to_bf16(p[at]);
        }
    }
}

}  // namespace

void Muon::update(const UpdateTarget& target, const StepRates& rates, ThreadPool& pool) {
    if (target.layout == nullptr) {
        throw std::logic_error("Muon::update: an adapter has no hidden matrices (use AdamW)");
    }
    const std::int64_t t = ++state.step;
    const Range owned = target.owned;
    if (matrices_.empty()) matrices_ = muon_matrices(*target.layout);
    std::vector<MuonMatrix> mine;
    for (const MuonMatrix& mat : matrices_) {
        const std::size_t end = mat.offset + mat.size();
        if (end <= owned.begin || mat.offset >= owned.end) continue;
        if (mat.offset < owned.begin || end > owned.end) {
            throw std::logic_error("Muon::update: a matrix cut by the rank's slice");
        }
        mine.push_back(mat);
    }
    // The matrices dealt to the workers, the costliest first, each to the least loaded (the
    // Newton-Schulz products cost about r*r*c each); any dealing gives the same bits.
    const int W = pool.size();
    std::vector<std::size_t> order(mine.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    const auto cost = [&](std::size_t i) {
        const double r = std::min(mine[i].rows, mine[i].cols);
        return r * static_cast<double>(mine[i].size());
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t x, std::size_t y) { return cost(x) > cost(y); });
    std::vector<std::vector<std::size_t>> dealt(static_cast<std::size_t>(W));
    std::vector<double> load(static_cast<std::size_t>(W), 0.0);
    for (const std::size_t i : order) {
        const auto w =
            static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
        dealt[w].push_back(i);
        load[w] += cost(i);
    }
    std::size_t largest = 0;
    for (const MuonMatrix& mat : mine)
        largest = std::max(largest, muon_scratch_floats(mat));
    if (scratch_.size() < static_cast<std::size_t>(W)) scratch_.resize(static_cast<std::size_t>(W));
    for (AlignedBuffer<float>& s : scratch_) {
        if (s.size() < largest) s = AlignedBuffer<float>(largest);
    }
    if (settings_.bf16_products) {
        std::size_t largest_bf16 = 0;
        for (const MuonMatrix& mat : mine)
            largest_bf16 = std::max(largest_bf16, muon_scratch_bf16s(mat));
        if (bf16_scratch_.size() < static_cast<std::size_t>(W)) {
            bf16_scratch_.resize(static_cast<std::size_t>(W));
        }
        for (AlignedBuffer<Bf16>& s : bf16_scratch_) {
            if (s.size() < largest_bf16) s = AlignedBuffer<Bf16>(largest_bf16);
        }
    }
    // What is left of owned is AdamW's: the parts outside the four matrix families.
    std::vector<Range> adamw_parts;
    std::size_t at = owned.begin;
    for (const ParamTensor family : kLayerMatrices) {
        const std::size_t lo = target.layout->offset(family);
        const std::size_t hi = lo + target.layout->size(family);
        if (lo > at) adamw_parts.push_back({at, std::min(lo, owned.end)});
        at = std::max(at, hi);
    }
    if (at < owned.end) adamw_parts.push_back({at, owned.end});
    pool.run([&](int w) {
        const auto uw = static_cast<std::size_t>(w);
        for (const std::size_t i : dealt[uw])
            update_matrix(mine[i], target, state, settings_, rates, scratch_[uw].span(),
                          settings_.bf16_products ? bf16_scratch_[uw].span() : std::span<Bf16>());
        for (const Range part : adamw_parts) {
            if (part.begin >= part.end) continue;
            const Range r = split_range(part.end - part.begin, w, W);
            adamw_update_range(*target.layout, target.params, target.gradient, state,
                               part.begin + r.begin, part.begin + r.end, rates.adamw, t,
                               rates.grad_scale, target.params_bf16);
        }
    });
}

}  // namespace gpt2
