#include "data/windows.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "core/random.hpp"

namespace gpt2 {

void TokenStore::add(std::span<const std::int32_t> tokens) {
    if (masked_) throw std::invalid_argument("TokenStore: a segment without a mask among masked");
    segments_.push_back(Segment{tokens.data(), nullptr, nullptr, tokens.size()});
}

void TokenStore::add(std::span<const std::uint16_t> tokens) {
    if (masked_) throw std::invalid_argument("TokenStore: a segment without a mask among masked");
    segments_.push_back(Segment{nullptr, tokens.data(), nullptr, tokens.size()});
}

void TokenStore::add(std::span<const std::uint16_t> tokens, std::span<const std::uint8_t> mask) {
    if (mask.size() != tokens.size())
        throw std::invalid_argument("TokenStore: the mask's length is not the tokens'");
    if (!segments_.empty() && !masked_)
        throw std::invalid_argument("TokenStore: a masked segment among unmasked ones");
    masked_ = true;
    segments_.push_back(Segment{nullptr, tokens.data(), mask.data(), tokens.size()});
}

std::pair<const TokenStore::Segment*, std::uint64_t> TokenStore::locate(std::uint64_t window,
                                                                        int T) const {
    const auto uT = static_cast<std::uint64_t>(T);
    for (const Segment& s : segments_) {
        const std::uint64_t here = s.length > 0 ? (s.length - 1) / uT : 0;
        if (window < here) return {&s, window * uT};
        window -= here;
    }
    throw std::out_of_range("TokenStore: window index beyond the data");
}

std::int64_t TokenStore::trained_targets(std::uint64_t window, int T) const {
    const auto [s, start] = locate(window, T);
    if (s->mask == nullptr) return T;
    std::int64_t trained = 0;
    for (std::uint64_t i = start + 1; i <= start + static_cast<std::uint64_t>(T); ++i)
        trained += s->mask[i] != 0 ? 1 : 0;
    return trained;
}

std::uint64_t TokenStore::num_windows(int T) const {
    std::uint64_t n = 0;
    for (const Segment& s : segments_) {
        if (s.length > 0) n += (s.length - 1) / static_cast<std::uint64_t>(T);
    }
    return n;
}

std::uint64_t TokenStore::num_tokens() const {
    std::uint64_t n = 0;
    for (const Segment& s : segments_)
        n += s.length;
    return n;
}

std::int32_t TokenStore::max_token() const {
    std::int32_t result = -1;
    for (const Segment& s : segments_) {
        for (std::uint64_t i = 0; i < s.length; ++i) {
            result = std::max(result, s.wide ? s.wide[i] : static_cast<std::int32_t>(s.narrow[i]));
        }
    }
    return result;
}

void TokenStore::copy_window(std::uint64_t window, int T, std::span<std::int32_t> inputs,
                             std::span<std::int32_t> targets) const {
    const auto [s, start] = locate(window, T);
    for (int t = 0; t < T; ++t) {
        const std::uint64_t i = start + static_cast<std::uint64_t>(t);
        inputs[static_cast<std::size_t>(t)] =
            s->wide ? s->wide[i] : static_cast<std::int32_t>(s->narrow[i]);
        // The target is token i + 1; its mask says whether predicting it is trained.
        targets[static_cast<std::size_t>(t)] =
            s->mask != nullptr && s->mask[i + 1] == 0
                ? kIgnoredTarget
                : (s->wide ? s->wide[i + 1] : static_cast<std::int32_t>(s->narrow[i + 1]));
    }
}

WindowSampler::WindowSampler(const TokenStore& store, int T, std::uint64_t seed, bool shuffle)
    : store_(store), T_(T), seed_(seed), shuffle_(shuffle), num_windows_(store.num_windows(T)) {
    if (num_windows_ == 0) throw std::invalid_argument("WindowSampler: no complete window");
}

std::uint64_t WindowSampler::window_for_slot(std::uint64_t slot) {
    const std::uint64_t epoch = slot / num_windows_;
    const std::uint64_t position = slot % num_windows_;
    if (!shuffle_) return position;
    if (epoch != cached_epoch_) {
        // Fisher-Yates with a stream derived from (seed, epoch): any rank can rebuild any epoch.
        permutation_.resize(num_windows_);
        std::iota(permutation_.begin(), permutation_.end(), std::uint64_t{0});
        Rng rng = Rng::derived(seed_, 0x5eed, epoch);
        for (std::uint64_t i = num_windows_ - 1; i > 0; --i) {
            std::swap(permutation_[i], permutation_[rng.below(i + 1)]);
        }
        cached_epoch_ = epoch;
    }
    return permutation_[position];
}

void WindowSampler::fill_step(std::uint64_t step, int rank, int world, int B, int grad_accum,
                              std::span<std::int32_t> inputs, std::span<std::int32_t> targets) {
    const auto uB = static_cast<std::uint64_t>(B);
    const std::uint64_t G =
        uB * static_cast<std::uint64_t>(world) * static_cast<std::uint64_t>(grad_accum);
    const auto uT = static_cast<std::size_t>(T_);
    for (int a = 0; a < grad_accum; ++a) {
        for (int b = 0; b < B; ++b) {
            const std::uint64_t slot =
                step * G +
                (static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(world) +
                 static_cast<std::uint64_t>(rank)) *
                    uB +
                static_cast<std::uint64_t>(b);
            const std::size_t offset =
                (static_cast<std::size_t>(a) * uB + static_cast<std::size_t>(b)) * uT;
            store_.copy_window(window_for_slot(slot), T_, inputs.subspan(offset, uT),
                               targets.subspan(offset, uT));
        }
    }
}

std::int64_t WindowSampler::step_trained_targets(std::uint64_t step, std::uint64_t sequences) {
    std::int64_t trained = 0;
    for (std::uint64_t slot = step * sequences; slot < (step + 1) * sequences; ++slot)
        trained += store_.trained_targets(window_for_slot(slot), T_);
    return trained;
}

TokenSplit split_tokens(std::vector<std::int32_t> tokens, double val_fraction) {
    const auto val_count =
        static_cast<std::size_t>(static_cast<double>(tokens.size()) * val_fraction);
    TokenSplit split;
    split.val.assign(tokens.end() - static_cast<std::ptrdiff_t>(val_count), tokens.end());
    tokens.resize(tokens.size() - val_count);
    split.train = std::move(tokens);
    return split;
}

}  // namespace gpt2
