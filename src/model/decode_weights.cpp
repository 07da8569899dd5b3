#include "model/decode_weights.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace gpt2 {

WeightFormat parse_weight_format(std::string_view name) {
    return name == "bf16"   ? WeightFormat::Bf16
           : name == "int8" ? WeightFormat::Int8
                            : WeightFormat::Fp32;
}

std::string_view weight_format_name(WeightFormat format) {
    switch (format) {
        case WeightFormat::Bf16:
            return "bf16";
        case WeightFormat::Int8:
            return "int8";
        case WeightFormat::Fp32:
            break;
    }
    return "fp32";
}

bool is_decode_matrix(ParamTensor t) {
    return t == ParamTensor::wte || t == ParamTensor::lmheadw || t == ParamTensor::qkvw ||
           t == ParamTensor::attprojw || t == ParamTensor::fcw || t == ParamTensor::fcprojw;
}

std::size_t decode_matrix_count(const Model& model) {
    std::size_t count = 0;
    for (int i = 0; i < kNumParamTensors; ++i) {
        const auto t = static_cast<ParamTensor>(i);
        if (is_decode_matrix(t)) count += model.layout.size(t);
    }
    return count;
}

int matrix_row_length(const ModelConfig& config, ParamTensor t) {
    return t == ParamTensor::fcprojw ? config.mlp_hidden() : config.channels;
}

DecodeWeights::DecodeWeights(const Model& model, WeightFormat format)
    : model_(model), format_(format) {
    if (format == WeightFormat::Fp32) {
        throw std::invalid_argument("DecodeWeights: fp32 needs no conversion");
    }
    const std::size_t total = model.params.size();
    if (format == WeightFormat::Bf16) {
        bf16_ = AlignedBuffer<Bf16>(total);
    } else {
        int8_ = AlignedBuffer<std::int8_t>(total);
    }
    for (int i = 0; i < kNumParamTensors; ++i) {
        const auto t = static_cast<ParamTensor>(i);
        if (!is_decode_matrix(t)) continue;
        const std::size_t offset = model.layout.offset(t), size = model.layout.size(t);
        const float* src = model.params.data() + offset;
        if (format == WeightFormat::Bf16) {
            convert_to_bf16(bf16_.data() + offset, src, size);
            continue;
        }
        const auto K = static_cast<std::size_t>(matrix_row_length(model.config, t));
        const std::size_t rows = size / K;
        scales_[static_cast<std::size_t>(i)] = AlignedBuffer<float>(rows);
        float* scales = scales_[static_cast<std::size_t>(i)].data();
        std::int8_t* dst = int8_.data() + offset;
        for (std::size_t r = 0; r < rows; ++r) {
            const float* row = src + r * K;
            float max_abs = 0.0f;
            for (std::size_t k = 0; k < K; ++k)
                max_abs = std::max(max_abs, std::abs(row[k]));
            const float scale = max_abs > 0.0f ? max_abs / 127.0f : 1.0f;
            scales[r] = scale;
            const float inverse = 1.0f / scale;
            for (std::size_t k = 0; k < K; ++k) {
                const float q = std::nearbyint(row[k] * inverse);
                dst[r * K + k] = static_cast<std::int8_t>(std::clamp(q, -127.0f, 127.0f));
            }
        }
    }
}

QuantizedRows DecodeWeights::rows(const float* weight) const {
    const auto offset = static_cast<std::size_t>(weight - model_.params.data());
    if (format_ == WeightFormat::Bf16)
        return QuantizedRows{bf16_.data() + offset, nullptr, nullptr};
    for (int i = 0; i < kNumParamTensors; ++i) {
        const auto t = static_cast<ParamTensor>(i);
        if (!is_decode_matrix(t)) continue;
        const std::size_t begin = model_.layout.offset(t);
        if (offset < begin || offset >= begin + model_.layout.size(t)) continue;
        const auto K = static_cast<std::size_t>(matrix_row_length(model_.config, t));
        return QuantizedRows{nullptr, int8_.data() + offset,
                             scales_[static_cast<std::size_t>(i)].data() + (offset - begin) / K};
    }
    throw std::invalid_argument("DecodeWeights::rows: not a row of a decode matrix");
}

std::size_t DecodeWeights::bytes() const {
    std::size_t scales = 0;
    for (const AlignedBuffer<float>& s : scales_)
        scales += s.size();
    const std::size_t per_weight = format_ == WeightFormat::Bf16 ? sizeof(Bf16) : 1;
    return decode_matrix_count(model_) * per_weight + scales * sizeof(float);
}

}  // namespace gpt2
