#include "core/utf8.hpp"

namespace gpt2 {

namespace {

// Length of the sequence a lead byte starts, or 0 for a byte no well-formed sequence starts with
// (a continuation byte, C0/C1 which could only start overlongs, F5..FF beyond U+10FFFF).
[[nodiscard]] int sequence_length(unsigned char lead) {
    if (lead < 0x80) return 1;
    if (lead >= 0xC2 && lead <= 0xDF) return 2;
    if (lead >= 0xE0 && lead <= 0xEF) return 3;
    if (lead >= 0xF0 && lead <= 0xF4) return 4;
    return 0;
}

[[nodiscard]] bool is_continuation(unsigned char b) {
    return b >= 0x80 && b <= 0xBF;
}

// The second byte's range depends on the lead: this is where overlongs (E0, F0), surrogates
// (ED) and code points above U+10FFFF (F4) are ruled out (Unicode table 3-7).
[[nodiscard]] bool second_byte_ok(unsigned char lead, unsigned char b) {
    switch (lead) {
        case 0xE0:
            return b >= 0xA0 && b <= 0xBF;
        case 0xED:
            return b >= 0x80 && b <= 0x9F;
        case 0xF0:
            return b >= 0x90 && b <= 0xBF;
        case 0xF4:
            return b >= 0x80 && b <= 0x8F;
        default:
            return is_continuation(b);
    }
}

}  // namespace

std::string Utf8Sanitizer::push(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size() + pending_size_);
    std::size_t i = 0;
    while (i < bytes.size()) {
        const auto b = static_cast<unsigned char>(bytes[i]);
        if (pending_size_ == 0) {
            if (b < 0x80) {
                // Runs of ASCII, most of most text, are copied in one piece.
                std::size_t end = i + 1;
                while (end < bytes.size() && static_cast<unsigned char>(bytes[end]) < 0x80)
                    ++end;
                out.append(bytes.substr(i, end - i));
                i = end;
                continue;
            }
            const int length = sequence_length(b);
            if (length == 0) {
                out += kReplacementCharacter;
            } else {
                pending_[0] = bytes[i];
                pending_size_ = 1;
                needed_ = static_cast<std::uint8_t>(length);
            }
            ++i;
            continue;
        }
        const auto lead = static_cast<unsigned char>(pending_[0]);
        const bool fits = pending_size_ == 1 ? second_byte_ok(lead, b) : is_continuation(b);
        if (!fits) {
            // The held bytes are a maximal ill-formed subpart: one U+FFFD for all of them, and
            // this byte starts afresh (it may begin a good sequence of its own).
            out += kReplacementCharacter;
            pending_size_ = 0;
            continue;
        }
        if (pending_size_ + 1 == needed_) {
            out.append(pending_.data(), pending_size_);
            out += bytes[i];
            pending_size_ = 0;
        } else {
            pending_[pending_size_++] = bytes[i];
        }
        ++i;
    }
    return out;
}

std::string Utf8Sanitizer::finish() {
    if (pending_size_ == 0) return {};
    pending_size_ = 0;
    return std::string(kReplacementCharacter);
}

std::string sanitize_utf8(std::string_view bytes) {
    Utf8Sanitizer sanitizer;
    std::string out = sanitizer.push(bytes);
    out += sanitizer.finish();
    return out;
}

bool is_valid_utf8(std::string_view bytes) {
    std::size_t i = 0;
    while (i < bytes.size()) {
        const auto lead = static_cast<unsigned char>(bytes[i]);
        const auto length = static_cast<std::size_t>(sequence_length(lead));
        if (length == 0 || length > bytes.size() - i) return false;
        if (length > 1 && !second_byte_ok(lead, static_cast<unsigned char>(bytes[i + 1]))) {
            return false;
        }
        for (std::size_t k = 2; k < length; ++k) {
            if (!is_continuation(static_cast<unsigned char>(bytes[i + k]))) return false;
        }
        i += length;
    }
    return true;
}

}  // namespace gpt2
