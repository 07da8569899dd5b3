// The optimizer layer's interface: an optimizer owns its state (two floats per parameter it
// updates, over the flat layout), updates the elements a rank owns from the summed gradient, and
// says which ranges a rank must own whole. The gradient exchange knows none of it (train/step.cpp
// calls the exchange, then the optimizer, then the exchange's publish).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/aligned_buffer.hpp"
#include "core/range.hpp"
#include "model/model.hpp"

namespace gpt2 {

class ThreadPool;

// Which optimizer a run trains with (its number is what the resume state records).
enum class OptimizerKind : std::uint32_t { AdamW = 0, Muon = 1 };
[[nodiscard]] std::string_view optimizer_name(OptimizerKind kind);
// "adamw" or "muon"; nullopt for anything else.
[[nodiscard]] std::optional<OptimizerKind> parse_optimizer_kind(std::string_view name);
// The kind a resume state records as this number; nullopt for none.
[[nodiscard]] std::optional<OptimizerKind> optimizer_kind_of(std::uint32_t number);
// The names --optimizer takes, in the table's order.
[[nodiscard]] std::vector<std::string> optimizer_names();

// AdamW's hyperparameters for one step (the learning rate is the schedule's).
struct AdamWHyper {
    float lr = 3e-4f;
    float beta1 = 0.9f;
    float beta2 = 0.95f;
    float eps = 1e-8f;
    float weight_decay = 0.0f;
};

// What an optimizer keeps for the parameters [first, first + count) of the flat layout (all of
// them, or one rank's slice): two floats per parameter (AdamW's moments m and v; Muon's momentum
// in m for its matrices, whose v stays zero and is never touched) and the updates made so far.
struct OptimizerState {
    AlignedBuffer<float> m;
    AlignedBuffer<float> v;
    std::int64_t step = 0;
    std::size_t first = 0;

    explicit OptimizerState(std::size_t count, std::size_t first_param = 0)
        : m(count), v(count), first(first_param) {}
};

// What one update changes: the trained parameters (the model's, or a LoRA adapter's), their bf16
// copy (empty in fp32), the gradient summed over every rank (read where owned, then zeroed for the
// next step), the elements this rank updates, and the model's layout (null for an adapter: every
// element is a matrix's, weight-decayed, and updated elementwise).
struct UpdateTarget {
    std::span<float> params;
    std::span<Bf16> params_bf16;
    std::span<float> gradient;
    Range owned;
    const ParameterLayout* layout = nullptr;
};

// One step's rules for the optimizer: AdamW's (for Muon: for the parameters it leaves to AdamW),
// Muon's learning rate, and the factor the gradient is multiplied by first (clipping).
struct StepRates {
    AdamWHyper adamw;
    float muon_lr = 0.0f;
    float grad_scale = 1.0f;
};

// The factor clipping applies to gradients with global norm `norm` (PyTorch's clip_grad_norm_
// rule: max_norm / (norm + 1e-6) when that is below 1). max_norm <= 0 disables clipping.
[[nodiscard]] float clip_scale(double norm, float max_norm);

class Optimizer {
  public:
    Optimizer(std::size_t count, std::size_t first) : state(count, first) {}
    virtual ~Optimizer() = default;
    Optimizer(const Optimizer&) = delete;
    Optimizer& operator=(const Optimizer&) = delete;

    [[nodiscard]] virtual OptimizerKind kind() const = 0;
    // One update of target.owned (inside the state's range) on the pool's workers; the step
    // number advances once. Afterwards the gradient there is zero and the bf16 copy current.
    virtual void update(const UpdateTarget& target, const StepRates& rates, ThreadPool& pool) = 0;
    // The bytes of state it keeps resident for its range of a model of `layout`.
    [[nodiscard]] virtual std::size_t resident_bytes(const ParameterLayout& layout) const;

    OptimizerState state;
};

// The ranges of a model's flat layout that one rank must update whole under `kind` (Muon's
// matrices), in layout order; none for AdamW.
[[nodiscard]] std::vector<Range> indivisible_ranges(OptimizerKind kind,
                                                    const ParameterLayout& layout);
// The cost of updating an element of each of indivisible_ranges, in units of an AdamW element:
// Muon's Newton-Schulz iteration, about 20r + 10r^2/c flops per element of an r x c matrix
// (r <= c), at a tenth of an AdamW element's time per flop (AdamW's update is memory-bound: about
// 28 bytes moved per element). Ranks' slices balance these costs.
[[nodiscard]] std::vector<double> indivisible_costs(OptimizerKind kind,
                                                    const ParameterLayout& layout);

// The flops of Muon's Newton-Schulz iterations over every matrix of `layout`, a step.
[[nodiscard]] double muon_update_flops(const ParameterLayout& layout);
// The resident bytes of an optimizer's state for all of `layout` (Muon's matrices keep one float,
// the rest two), for the memory plan.
[[nodiscard]] std::size_t optimizer_state_bytes(OptimizerKind kind, const ParameterLayout& layout);

// The scratch an optimizer's update takes per worker thread (Muon: its largest matrix twice and
// two r x r products; with bf16 products also their rounded operands), for the memory plan.
[[nodiscard]] std::size_t optimizer_scratch_bytes(OptimizerKind kind, const ParameterLayout& layout,
                                                  bool bf16_products = false);

// Muon's fixed settings (its learning rate is the schedule's, per step).
struct MuonSettings {
    float momentum = 0.95f;
    float weight_decay = 0.0f;
    bool nesterov = true;
    int newton_schulz_steps = 5;
    // The iteration's products on bf16-rounded operands (newton_schulz_in_bf16).
    bool bf16_products = false;
};

// The optimizer of `kind` for [first, first + count) of the flat layout.
[[nodiscard]] std::unique_ptr<Optimizer> make_optimizer(OptimizerKind kind, std::size_t count,
                                                        std::size_t first = 0,
                                                        const MuonSettings& muon = {});

}  // namespace gpt2
