#include "formats/element_type.hpp"

#include <bit>
#include <cstring>

#include "ops/bf16.hpp"

namespace gpt2 {

std::size_t element_bytes(ElementType type) {
    return type == ElementType::F32 ? 4 : 2;
}

std::string_view element_type_name(ElementType type) {
    switch (type) {
        case ElementType::F32:
            return "F32";
        case ElementType::F16:
            return "F16";
        case ElementType::Bf16:
            return "BF16";
    }
    return "?";
}

float half_to_float(std::uint16_t half) {
    const std::uint32_t sign = static_cast<std::uint32_t>(half & 0x8000u) << 16;
    const std::uint32_t exponent = (half >> 10) & 0x1Fu, mantissa = half & 0x3FFu;
    if (exponent == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
    if (exponent == 0) {  // zero or subnormal: mantissa x 2^-24, exact in fp32
        const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
        return sign != 0 ? -magnitude : magnitude;
    }
    return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

std::uint16_t float_to_half(float value) {
    std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
    const std::uint32_t sign = (bits >> 16) & 0x8000u;
    bits &= 0x7FFFFFFFu;
    if (bits >= 0x47800000u) {  // |value| >= 65536, infinity or NaN: the result is not finite
        if (bits > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u);
        return static_cast<std::uint16_t>(sign | 0x7C00u);
    }
    if (bits < 0x38800000u) {
        // Below half's smallest normal (2^-14): adding 0.5 aligns the value's bits to half's
        // subnormal step (2^-24) and the FPU rounds to nearest even on the way.
        const float aligned = std::bit_cast<float>(bits) + 0.5f;
        return static_cast<std::uint16_t>(sign |
                                          (std::bit_cast<std::uint32_t>(aligned) - 0x3F000000u));
    }
    // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even (a carry
    // into the exponent is right, up to infinity for values from 65520).
    const std::uint32_t odd = (bits >> 13) & 1u;
    bits += 0xC8000000u + 0xFFFu + odd;  // (15 - 127) << 23, wrapped
    return static_cast<std::uint16_t>(sign | (bits >> 13));
}

void append_elements(std::vector<std::uint8_t>& out, std::span<const float> values,
                     ElementType type) {
    const std::size_t at = out.size();
    out.resize(at + values.size() * element_bytes(type));
    std::uint8_t* dst = out.data() + at;
    for (std::size_t i = 0; i < values.size(); ++i) {
        if (type == ElementType::F32) {
            std::memcpy(dst + 4 * i, &values[i], 4);
            continue;
        }
        const std::uint16_t bits = type == ElementType::F16
                                       ? float_to_half(values[i])
                                       : static_cast<std::uint16_t>(to_bf16(values[i]));
        std::memcpy(dst + 2 * i, &bits, 2);
    }
}

void read_elements(std::span<float> out, std::span<const std::uint8_t> bytes, ElementType type) {
    for (std::size_t i = 0; i < out.size(); ++i) {
        if (type == ElementType::F32) {
            std::memcpy(&out[i], bytes.data() + 4 * i, 4);
            continue;
        }
        std::uint16_t bits;
        std::memcpy(&bits, bytes.data() + 2 * i, 2);
        out[i] = type == ElementType::F16 ? half_to_float(bits) : to_float(static_cast<Bf16>(bits));
    }
}

}  // namespace gpt2
