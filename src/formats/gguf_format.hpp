// GGUF's numbers that the writer (gguf.cpp) and the reader (gguf_read.cpp) share: the metadata
// value types (gguf.h), the ggml tensor types the programs write and read (ggml.h), the names of
// a layer's tensors in llama.cpp's gpt2 architecture, the alignment, and Q's and K's rows from
// llama.cpp's rotary order back to ours.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/model.hpp"

namespace gpt2::gguf_format {

enum class ValueType : std::uint32_t {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12
};

enum class TensorType : std::uint32_t { F32 = 0, F16 = 1, Q8_0 = 8, Bf16 = 30 };

// A layer's tensors in llama.cpp's names (blk.<l>.<suffix>), in the order the file holds them;
// a matrix's ne is {C * in, C * out}: our (out, in) row-major order is ggml's as it is.
struct LayerTensor {
    std::string_view suffix;
    ParamTensor tensor;
    std::uint64_t in = 0;  // in channels / C; 0: a vector
    std::uint64_t out = 0;
};
constexpr std::array kGgufLayerTensors = {
    LayerTensor{"attn_norm.weight", ParamTensor::ln1w},
    LayerTensor{"attn_norm.bias", ParamTensor::ln1b},
    LayerTensor{"attn_qkv.weight", ParamTensor::qkvw, 1, 3},
    LayerTensor{"attn_qkv.bias", ParamTensor::qkvb},
    LayerTensor{"attn_output.weight", ParamTensor::attprojw, 1, 1},
    LayerTensor{"attn_output.bias", ParamTensor::attprojb},
    LayerTensor{"ffn_norm.weight", ParamTensor::ln2w},
    LayerTensor{"ffn_norm.bias", ParamTensor::ln2b},
    LayerTensor{"ffn_up.weight", ParamTensor::fcw, 1, 4},
    LayerTensor{"ffn_up.bias", ParamTensor::fcb},
    LayerTensor{"ffn_down.weight", ParamTensor::fcprojw, 4, 1},
    LayerTensor{"ffn_down.bias", ParamTensor::fcprojb},
};
inline std::string layer_tensor_name(int l, std::string_view suffix) {
    return "blk." + std::to_string(l) + "." + std::string(suffix);
}

// Rows of `heads` heads (each row `cols` values) from llama.cpp's rotary order (a head's rows
// interleaved: its rotary pairs adjacent channels) back to ours and Hugging Face's (the two halves
// of a head), in place: write_gguf's interleaved_heads undone.
inline void halves_from_interleaved(std::span<float> rows, int heads, int head_size,
                                    std::uint64_t cols) {
    const std::vector<float> stored(rows.begin(), rows.end());
    const int half = head_size / 2;
    const auto n = static_cast<std::size_t>(cols);
    for (int h = 0; h < heads; ++h) {
        for (int i = 0; i < half; ++i) {
            for (int j = 0; j < 2; ++j) {
                const auto ours = static_cast<std::size_t>(h * head_size + j * half + i);
                const auto theirs = static_cast<std::size_t>(h * head_size + 2 * i + j);
                std::copy_n(stored.begin() + static_cast<long>(theirs * n), n,
                            rows.begin() + static_cast<long>(ours * n));
            }
        }
    }
}

// The data section's alignment when general.alignment does not say.
inline constexpr std::uint32_t kAlignment = 32;

}  // namespace gpt2::gguf_format
