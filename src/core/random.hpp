// Random numbers: a small, fast, serializable generator (xoshiro256**) so that initialisation,
// data order and sampling are reproducible from a seed and can be saved for exact resume.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

namespace gpt2 {

[[nodiscard]] constexpr std::uint64_t splitmix64(std::uint64_t& state) {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

class Rng {
  public:
    using State = std::array<std::uint64_t, 4>;

    explicit Rng(std::uint64_t seed = 0) {
        for (auto& word : state_)
            word = splitmix64(seed);
    }
    // A stream derived from (seed, a, b): lets independent pieces of work draw reproducibly in
    // any order or on any thread.
    static Rng derived(std::uint64_t seed, std::uint64_t a, std::uint64_t b = 0) {
        std::uint64_t s = seed ^ (a * 0xD1B54A32D192ED03ull) ^ (b * 0xABC98388FB8FAC03ull);
        return Rng(splitmix64(s));
    }

    std::uint64_t next_u64() {
        const std::uint64_t result = rotl(state_[1] * 5, 7) * 9;
        const std::uint64_t t = state_[1] << 17;
        state_[2] ^= state_[0];
        state_[3] ^= state_[1];
        state_[1] ^= state_[2];
        state_[0] ^= state_[3];
        state_[2] ^= t;
        state_[3] = rotl(state_[3], 45);
        return result;
    }
    // Uniform in [0, 1) with 24 bits, exactly representable as float.
    float uniform() { return static_cast<float>(next_u64() >> 40) * 0x1.0p-24f; }
    // Uniform integer in [0, n).
    std::uint64_t below(std::uint64_t n) {
        return static_cast<std::uint64_t>((static_cast<unsigned __int128>(next_u64()) * n) >> 64);
    }
    // Standard normal (Box-Muller; one value per call keeps the state simple to save).
    float normal() {
        const double u1 = (static_cast<double>(next_u64() >> 11) + 0.5) * 0x1.0p-53;
        const double u2 = static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
        return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) *
                                  std::cos(6.283185307179586 * u2));
    }

    [[nodiscard]] const State& state() const { return state_; }
    void set_state(const State& s) { state_ = s; }

  private:
    static constexpr std::uint64_t rotl(std::uint64_t x, int k) {
        return (x << k) | (x >> (64 - k));
    }
    State state_{};
};

}  // namespace gpt2
