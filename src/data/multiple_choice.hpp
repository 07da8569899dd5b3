// llm.c's multiple-choice evaluation files (HellaSwag's hellaswag_val.bin): a header of 256 int32
// {20240522, 1, examples, longest example in bytes}, then per example a stream of uint16: 65535,
// the example's size in bytes, its index, the label, the number of completions, the context as a
// count followed by its tokens, and each completion the same way.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "core/file_kinds.hpp"

namespace gpt2 {

inline constexpr std::int32_t kMultipleChoiceMagic = kLlmcEvalMagic;

struct MultipleChoiceExample {
    int index = 0;
    int label = 0;  // which ending is right
    std::vector<std::int32_t> context;
    std::vector<std::vector<std::int32_t>> endings;
};

// Reads and checks a whole file (delimiters, sizes, label range, counts). InputError naming the
// file and the example at fault.
[[nodiscard]] std::vector<MultipleChoiceExample> read_multiple_choice_file(
    const std::filesystem::path& path);
// The same from the file's bytes (`path` names it in errors).
[[nodiscard]] std::vector<MultipleChoiceExample> parse_multiple_choice(
    std::span<const std::uint8_t> bytes, const std::filesystem::path& path);
// Writes one (atomically); InputError if an example does not fit the format.
void write_multiple_choice_file(const std::filesystem::path& path,
                                std::span<const MultipleChoiceExample> examples);

}  // namespace gpt2
