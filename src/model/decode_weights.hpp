// The model's matrices in a smaller format for decoding (inference --weights bf16|int8): one
// token's products are bound by memory bandwidth, so fewer bytes per weight is what makes a token
// cheaper. Built once from the fp32 parameters; LayerNorms, biases and wpe stay fp32.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/aligned_buffer.hpp"
#include "model/model.hpp"

namespace gpt2 {

enum class WeightFormat { Fp32, Bf16, Int8 };
[[nodiscard]] std::string_view weight_format_name(WeightFormat format);
// The format weight_format_name names ("bf16", "int8"; anything else fp32: the programs' flags
// accept only the three names).
[[nodiscard]] WeightFormat parse_weight_format(std::string_view name);

// Rows of one matrix (each `K` weights long) in the decode format. For int8 a row's weights are
// round(w / scale) with scale = max|w| / 127 for that row (symmetric, per output row).
struct QuantizedRows {
    const Bf16* bf16 = nullptr;         // bf16: the first row
    const std::int8_t* int8 = nullptr;  // int8: the first row
    const float* scales = nullptr;      // int8: the first row's scale, one per row
};

class DecodeWeights {
  public:
    // Converts the matrices (wte, qkvw, attprojw, fcw, fcprojw) of `model`, which must outlive
    // this object. format must not be fp32.
    DecodeWeights(const Model& model, WeightFormat format);

    [[nodiscard]] WeightFormat format() const { return format_; }
    // The rows starting at `weight`, a pointer to the start of a row of one of the five matrices
    // inside model.params.
    [[nodiscard]] QuantizedRows rows(const float* weight) const;
    // Bytes of the converted matrices (and scales).
    [[nodiscard]] std::size_t bytes() const;

  private:
    const Model& model_;
    WeightFormat format_;
    AlignedBuffer<Bf16> bf16_;         // bf16: the flat layout (only the matrices filled)
    AlignedBuffer<std::int8_t> int8_;  // int8: the flat layout (only the matrices filled)
    // int8: per matrix tensor, one scale per row (indexed by row within the tensor).
    std::array<AlignedBuffer<float>, kNumParamTensors> scales_;
};

// The row length (K) of a matrix tensor's rows: C, or the MLP's hidden width (GPT-2's 4C) for
// fcprojw.
[[nodiscard]] int matrix_row_length(const ModelConfig& config, ParamTensor t);
// Whether decoding stores tensor t in the compact format (the matrices: wte, the untied head and
// the four of a layer).
[[nodiscard]] bool is_decode_matrix(ParamTensor t);
// Parameters in those matrices.
[[nodiscard]] std::size_t decode_matrix_count(const Model& model);

}  // namespace gpt2
