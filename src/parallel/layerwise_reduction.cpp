#include "parallel/layerwise_reduction.hpp"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <stdexcept>

#include "core/clock.hpp"
#include "threads/thread_pool.hpp"

namespace gpt2 {

namespace {
// Floats summed over all windows at once: the rank's block stays in L1 while every window adds.
constexpr std::size_t kSumBlock = 2048;

Range range_of(const ParameterLayout& layout, ParamTensor t) {
    return Range{layout.offset(t), layout.offset(t) + layout.size(t)};
}
}  // namespace

LayerwiseReduction::LayerwiseReduction(const ModelConfig& config,
                                       std::span<ThreadLocalTrainingContext> contexts,
                                       int contributors, RankGradient held)
    : config_(config),
      layout_(config),
      workers_(static_cast<int>(contexts.size())),
      contributors_(contributors),
      layer_slot_floats_(layer_gradient_floats(config)),
      gradient_(held == RankGradient::Full ? layout_.total() : 0),
      barrier_(static_cast<int>(contexts.size())),
      worker_rows_(contexts.size()),
      windows_(contexts.size(), nullptr) {
    if (contributors < 1 || contributors > workers_) {
        throw std::invalid_argument("LayerwiseReduction: contributors must be 1..workers");
    }
    const std::size_t window = gradient_window_floats(config);
    for (int w = 1; w < contributors && held == RankGradient::Full; ++w) {
        ThreadLocalTrainingContext& ctx = contexts[static_cast<std::size_t>(w)];
        ctx.gradient_window = AlignedBuffer<float>(window);
        windows_[static_cast<std::size_t>(w)] = ctx.gradient_window.data();
    }

    // The tensors the model's table says the head writes (its weight: wte where tied; the final
    // norm's gain and bias where it has them), in that order in a window; the token rows of wte
    // and, with learned positions, wpe's rows are the embeddings'.
    std::size_t in_window = 0;
    for (const ParamTensor t : {head_tensor(layout_), ParamTensor::lnfw, ParamTensor::lnfb}) {
        if (!layout_.has(t)) continue;
        head_pieces_.push_back(Piece{in_window, layout_.offset(t), layout_.size(t)});
        in_window += layout_.size(t);
    }
    const auto present = [&](std::initializer_list<ParamTensor> tensors) {
        std::vector<Range> ranges;
        for (const ParamTensor t : tensors) {
            if (layout_.has(t)) ranges.push_back(range_of(layout_, t));
        }
        std::sort(ranges.begin(), ranges.end(),
                  [](const Range& a, const Range& b) { return a.begin < b.begin; });
        return ranges;
    };
    // An untied head is complete with the final norm (a tied one, wte, only with the embeddings).
    final_layernorm_ranges_ = present({ParamTensor::lnfw, ParamTensor::lnfb, ParamTensor::lmheadw});
    embedding_ranges_ = present({ParamTensor::wte, ParamTensor::wpe});
    lm_head_ranges_ = present({ParamTensor::wte, ParamTensor::wpe, ParamTensor::lnfw,
                               ParamTensor::lnfb, ParamTensor::lmheadw});
    const auto L = static_cast<std::size_t>(config.num_layers);
    for (std::size_t l = 0; l < L; ++l) {
        std::vector<Piece> pieces;
        std::vector<Range> ranges;
        std::size_t in_slot = 0;
        for (int i = 0; i < kLayerTensors; ++i) {
            const ParamTensor t = layer_tensor(i);
            const std::size_t per_layer = layout_.size(t) / L;
            const std::size_t at = layout_.offset(t) + per_layer * l;
            pieces.push_back(Piece{in_slot, at, per_layer});
            ranges.push_back(Range{at, at + per_layer});
            in_slot += per_layer;
        }
        layer_pieces_.push_back(std::move(pieces));
        layer_ranges_.push_back(std::move(ranges));
    }
}

void LayerwiseReduction::adopt_gradient(AlignedBuffer<float> buffer) {
    if (buffer.size() != gradient_.size()) {
        throw std::invalid_argument("LayerwiseReduction::adopt_gradient: wrong size");
    }
    gradient_ = std::move(buffer);
}

void LayerwiseReduction::begin_run() {
    if (!barrier_.aborted()) return;
    barrier_.reset();
    const std::size_t window = gradient_window_floats(config_);
    for (float* w : windows_) {
        if (w != nullptr) std::fill(w, w + window, 0.0f);
    }
    std::fill(gradient_.data(), gradient_.data() + gradient_.size(), 0.0f);
}

void LayerwiseReduction::sum_part(std::span<const Piece> pieces, std::size_t window_base, int w) {
    if (contributors_ == 1) return;  // worker 0 wrote the rank's buffer directly
    std::size_t total = 0;
    for (const Piece& p : pieces)
        total += p.count;
    const Range part = split_range(total, w, workers_);
    std::size_t piece_begin = 0;
    for (const Piece& p : pieces) {
        const std::size_t lo = std::max(part.begin, piece_begin);
        const std::size_t hi = std::min(part.end, piece_begin + p.count);
        if (lo < hi) {
            float* out = gradient_.data() + p.rank_offset + (lo - piece_begin);
            const std::size_t in_window = window_base + p.window_offset + (lo - piece_begin);
            for (std::size_t block = 0; block < hi - lo; block += kSumBlock) {
                const std::size_t n = std::min(kSumBlock, hi - lo - block);
                float* __restrict dst = out + block;
                for (int src = 1; src < contributors_; ++src) {
                    float* __restrict in =
                        windows_[static_cast<std::size_t>(src)] + in_window + block;
                    for (std::size_t i = 0; i < n; ++i) {
                        dst[i] += in[i];
                        in[i] = 0.0f;
                    }
                }
            }
        }
        piece_begin += p.count;
    }
}

// The encoder's gradient from dresidual rows: worker w owns a range of token rows of dwte and of
// positions of dwpe and adds the rows that fall in them in sequence order (worker by worker,
// sequence, position), the order of encoder_backward over the whole batch.
void LayerwiseReduction::sum_embedding_rows_part(std::span<const WorkerRows> workers, int seq_len,
                                                 int w, std::span<float> gradient, Range only) {
    const auto C = static_cast<std::size_t>(config_.channels);
    const Range tokens =
        split_range(static_cast<std::size_t>(config_.padded_vocab_size), w, workers_);
    const Range positions = split_range(static_cast<std::size_t>(seq_len), w, workers_);
    const std::size_t wte = layout_.offset(ParamTensor::wte);
    const bool learned_positions = layout_.has(ParamTensor::wpe);
    const std::size_t wpe = layout_.offset(ParamTensor::wpe);
    // Adds d into the row starting at `at`, only where it lies in `only`.
    const auto add_row = [&](std::size_t at, const float* d) {
        const std::size_t lo = std::max(at, only.begin);
        const std::size_t hi = std::min(at + C, only.end);
        float* const out = gradient.data();
        for (std::size_t i = lo; i < hi; ++i)
            out[i] += d[i - at];
    };
    for (const WorkerRows& rows : workers) {
        for (int row = 0; row < rows.sequences * seq_len; ++row) {
            const float* d = rows.dresidual + static_cast<std::size_t>(row) * C;
            const auto token = static_cast<std::size_t>(rows.inputs[row]);
            const auto t = static_cast<std::size_t>(row % seq_len);
            if (token >= tokens.begin && token < tokens.end) add_row(wte + token * C, d);
            if (learned_positions && t >= positions.begin && t < positions.end) {
                add_row(wpe + t * C, d);
            }
        }
    }
}

void LayerwiseReduction::add_embedding_rows(std::span<const float> rows,
                                            std::span<const std::int32_t> tokens, int seq_len,
                                            int w, std::span<float> gradient, Range only) {
    const WorkerRows all{rows.data(), tokens.data(), static_cast<int>(tokens.size()) / seq_len};
    sum_embedding_rows_part(std::span<const WorkerRows>(&all, 1), seq_len, w, gradient, only);
}

void LayerwiseReduction::pack_embedding_rows(std::span<float> rows, std::span<std::int32_t> tokens,
                                             int seq_len) const {
    const auto C = static_cast<std::size_t>(config_.channels);
    std::size_t at = 0;
    for (int src = 0; src < contributors_; ++src) {
        const WorkerRows& worker = worker_rows_[static_cast<std::size_t>(src)];
        const std::size_t count =
            static_cast<std::size_t>(worker.sequences) * static_cast<std::size_t>(seq_len);
        if ((at + count) * C > rows.size() || at + count > tokens.size()) {
            throw std::invalid_argument("pack_embedding_rows: buffers too small");
        }
        std::copy(worker.dresidual, worker.dresidual + count * C, rows.begin() + at * C);
        std::copy(worker.inputs, worker.inputs + count, tokens.begin() + at);
        at += count;
    }
}

// ---- WorkerSink -----------------------------------------------------------------------------

LayerwiseReduction::WorkerSink::WorkerSink(LayerwiseReduction& reduction, int worker,
                                           const GradientReady* ready)
    : r_(reduction), w_(worker), ready_(ready != nullptr && *ready ? ready : nullptr) {}

void LayerwiseReduction::WorkerSink::wait() {
    const ScopedTimer watch(seconds_at_barriers_);
    r_.barrier_.arrive_and_wait();
}

void LayerwiseReduction::WorkerSink::announce(CompletedGradient::Part part, int layer) const {
    if (w_ != 0 || ready_ == nullptr) return;
    const std::vector<Range>& ranges =
        part == CompletedGradient::Part::FinalLayerNorm ? r_.final_layernorm_ranges_
        : part == CompletedGradient::Part::LmHead       ? r_.lm_head_ranges_
        : part == CompletedGradient::Part::Layer ? r_.layer_ranges_[static_cast<std::size_t>(layer)]
                                                 : r_.embedding_ranges_;
    (*ready_)(CompletedGradient{part, layer, ranges});
}

GradientSink::Head LayerwiseReduction::WorkerSink::head() {
    const ParameterLayout& layout = r_.layout_;
    std::array<float*, 3> at{};  // the head's weight, the final norm's gain and bias
    if (w_ == 0) {
        const std::span<float> g = r_.gradient_.span();
        at = {tensor_or_null(layout, g, head_tensor(layout)),
              tensor_or_null(layout, g, ParamTensor::lnfw),
              tensor_or_null(layout, g, ParamTensor::lnfb)};
    } else {
        float* window = r_.windows_[static_cast<std::size_t>(w_)];
        if (window == nullptr) throw std::logic_error("WorkerSink: a worker without sequences");
        // head_pieces_ in window order, only the tensors the model has.
        std::size_t next = 0;
        for (std::size_t i = 0; i < 3; ++i) {
            const ParamTensor t =
                std::array{head_tensor(layout), ParamTensor::lnfw, ParamTensor::lnfb}[i];
            if (!layout.has(t)) continue;
            at[i] = window + r_.head_pieces_[next++].window_offset;
        }
    }
    return Head{at[0], at[1], at[2]};
}

void LayerwiseReduction::WorkerSink::head_done() {
    {
        const ScopedTimer watch(seconds_);
        wait();
        r_.sum_part(r_.head_pieces_, 0, w_);
        wait();  // the windows are free for layer slots only when every part is summed
    }
    announce(
        deferring() ? CompletedGradient::Part::LmHead : CompletedGradient::Part::FinalLayerNorm,
        -1);
}

LayerView<float> LayerwiseReduction::WorkerSink::layer(int l) {
    if (w_ == 0) return layer_view(r_.layout_, r_.gradient_.span(), l);
    float* window = r_.windows_[static_cast<std::size_t>(w_)];
    if (window == nullptr) throw std::logic_error("WorkerSink: a worker without sequences");
    return layer_slot_view(r_.config_,
                           window + static_cast<std::size_t>(l % 2) * r_.layer_slot_floats_);
}

void LayerwiseReduction::WorkerSink::layer_done(int l) {
    {
        const ScopedTimer watch(seconds_);
        wait();
    }
    // Every worker summed its part of layer l+1 before computing layer l.
    if (l + 1 < r_.config_.num_layers) announce(CompletedGradient::Part::Layer, l + 1);
    const ScopedTimer watch(seconds_);
    r_.sum_part(r_.layer_pieces_[static_cast<std::size_t>(l)],
                static_cast<std::size_t>(l % 2) * r_.layer_slot_floats_, w_);
}

void LayerwiseReduction::WorkerSink::embeddings(const float* dresidual, const TokenBatch& batch) {
    r_.worker_rows_[static_cast<std::size_t>(w_)] =
        WorkerRows{dresidual, batch.inputs.data(), batch.B};
    {
        const ScopedTimer watch(seconds_);
        wait();
    }
    if (r_.config_.num_layers > 0) announce(CompletedGradient::Part::Layer, 0);
    if (deferring()) return;  // the rows stay in the contexts for pack_embedding_rows
    {
        const ScopedTimer watch(seconds_);
        r_.sum_embedding_rows_part(std::span<const WorkerRows>(r_.worker_rows_)
                                       .first(static_cast<std::size_t>(r_.contributors_)),
                                   batch.T, w_, r_.gradient_.span(), Range{0, r_.gradient_.size()});
        wait();  // dresidual and the windows are reused by the next micro-batch
    }
    announce(CompletedGradient::Part::Embeddings, -1);
}

void LayerwiseReduction::WorkerSink::take_part_without_sequences(int seq_len) {
    head_done();
    for (int l = r_.config_.num_layers - 1; l >= 0; --l)
        layer_done(l);
    embeddings(nullptr, TokenBatch{{}, {}, 0, seq_len});
}

}  // namespace gpt2
