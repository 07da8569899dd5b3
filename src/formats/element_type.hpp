// Element types of the exchange formats (safetensors, GGUF, llm.c's bf16 file) and exact
// conversions between them and our fp32 weights: IEEE half and bfloat16, rounded to nearest even as
// PyTorch and ggml round.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace gpt2 {

enum class ElementType { F32, F16, Bf16 };

[[nodiscard]] std::size_t element_bytes(ElementType type);
// "F32", "F16", "BF16": safetensors' spelling.
[[nodiscard]] std::string_view element_type_name(ElementType type);

[[nodiscard]] float half_to_float(std::uint16_t half);
[[nodiscard]] std::uint16_t float_to_half(float value);

// Appends values to out as `type`, little-endian.
void append_elements(std::vector<std::uint8_t>& out, std::span<const float> values,
                     ElementType type);
// out[i] = element i of bytes (which hold out.size() elements of `type`).
void read_elements(std::span<float> out, std::span<const std::uint8_t> bytes, ElementType type);

}  // namespace gpt2
