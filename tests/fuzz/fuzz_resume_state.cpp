// Fuzzes gpt2::load_resume_state (state_N.bin: AdamW moments, step, RNG) for a fixed small model.
#include <cstdint>

#include "formats/resume_state.hpp"
#include "fuzz_support.hpp"

namespace {

// The shape make_seeds writes the seed states for: maxT 8, V 16 (Vp 128), L 1, NH 1, C 8.
const gpt2::ModelConfig kConfig{8, 16, 128, 1, 1, 8};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size > gpt2::fuzz::kMaxInputBytes) return -1;
    static gpt2::OptimizerState optimizer(gpt2::ParameterLayout(kConfig).total());
    const std::filesystem::path path = gpt2::fuzz::scratch_dir() / "state_000001.bin";
    gpt2::fuzz::write_bytes(path, {data, size});
    try {
        const gpt2::ResumeState state = gpt2::load_resume_state(path, kConfig, optimizer);
        FUZZ_CHECK(optimizer.m.size() == gpt2::ParameterLayout(kConfig).total());
        (void)state;
    } catch (const gpt2::InputError& error) {
        gpt2::fuzz::rejected(error);
    }
    return 0;
}
