#include "model/sampling.hpp"

#include <algorithm>
#include <cmath>

namespace gpt2 {

void apply_repetition_penalty(std::span<float> logits, std::span<const std::int32_t> context,
                              float penalty) {
    if (penalty == 1.0f) return;
    std::vector<bool> seen(logits.size(), false);
    for (const std::int32_t id : context) {
        if (id < 0 || static_cast<std::size_t>(id) >= logits.size()) continue;
        const auto i = static_cast<std::size_t>(id);
        if (seen[i]) continue;
        seen[i] = true;
        logits[i] = logits[i] > 0.0f ? logits[i] / penalty : logits[i] * penalty;
    }
}

int sample_token(std::span<const float> logits, const SamplingParams& params, Rng& rng,
                 std::vector<std::pair<float, int>>& scratch) {
    const int V = static_cast<int>(logits.size());
    if (params.temperature <= 0.0f || params.top_k == 1) {
        return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
    scratch.clear();
    for (int i = 0; i < V; ++i)
        scratch.emplace_back(logits[static_cast<std::size_t>(i)], i);
    // Highest logit first; ties by lower id so the order (and so the sample) is deterministic.
    const auto higher = [](const auto& a, const auto& b) {
        return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    int keep = V;
    if (params.top_k > 0 && params.top_k < V) {
        keep = params.top_k;
        std::partial_sort(scratch.begin(), scratch.begin() + keep, scratch.end(), higher);
    } else {
        std::sort(scratch.begin(), scratch.end(), higher);
    }
    const float inv_t = 1.0f / params.temperature;
    const float maxv = scratch.front().first;
    double total = 0.0;
    for (int i = 0; i < keep; ++i) {
        scratch[static_cast<std::size_t>(i)].first =
            std::exp((scratch[static_cast<std::size_t>(i)].first - maxv) * inv_t);
        total += scratch[static_cast<std::size_t>(i)].first;
    }
    if (params.top_p < 1.0f) {
        double cumulative = 0.0;
        int cut = 0;
        while (cut < keep) {
            cumulative += scratch[static_cast<std::size_t>(cut)].first / total;
            ++cut;
            if (cumulative >= params.top_p) break;
        }
        keep = cut;
        total = 0.0;
        for (int i = 0; i < keep; ++i)
            total += scratch[static_cast<std::size_t>(i)].first;
    }
    double r = static_cast<double>(rng.uniform()) * total;
    for (int i = 0; i < keep; ++i) {
        r -= scratch[static_cast<std::size_t>(i)].first;
        if (r < 0.0) return scratch[static_cast<std::size_t>(i)].second;
    }
    return scratch[static_cast<std::size_t>(keep - 1)].second;
}

}  // namespace gpt2
