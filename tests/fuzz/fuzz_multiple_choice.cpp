// Fuzzes gpt2::parse_multiple_choice (llm.c's HellaSwag evaluation files). Property: only
// InputError is thrown, and an accepted file written back and read again gives the same examples.
#include <cstdint>

#include "data/multiple_choice.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size > gpt2::fuzz::kMaxInputBytes) return -1;
    const std::filesystem::path path = gpt2::fuzz::scratch_dir() / "eval.bin";
    try {
        const auto examples = gpt2::parse_multiple_choice({data, size}, path);
        FUZZ_CHECK(!examples.empty());
        gpt2::write_multiple_choice_file(path, examples);
        const auto again = gpt2::read_multiple_choice_file(path);
        FUZZ_CHECK(again.size() == examples.size());
        for (std::size_t i = 0; i < again.size(); ++i) {
            FUZZ_CHECK(again[i].index == examples[i].index);
            FUZZ_CHECK(again[i].label == examples[i].label);
            FUZZ_CHECK(again[i].context == examples[i].context);
            FUZZ_CHECK(again[i].endings == examples[i].endings);
        }
    } catch (const gpt2::InputError& error) {
        gpt2::fuzz::rejected(error);
    }
    return 0;
}
