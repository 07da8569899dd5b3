#include "model/spike_guard.hpp"

#include <cmath>

namespace gpt2 {

std::optional<double> SpikeWindow::z_score(double x) const {
    if (count < kWindow) return std::nullopt;
    // Two passes over 128 values: exact enough and independent of the order they came in.
    double mean = 0.0;
    for (const double v : values)
        mean += v;
    mean /= kWindow;
    double variance = 0.0;
    for (const double v : values)
        variance += (v - mean) * (v - mean);
    const double deviation = std::sqrt(variance / kWindow);
    return deviation > 0.0 ? (x - mean) / deviation : 0.0;
}

void SpikeWindow::add(double x) {
    values[next] = x;
    next = (next + 1) % kWindow;
    if (count < kWindow) ++count;
}

SpikeGuard::Verdict SpikeGuard::judge(double loss_value, double norm_value) {
    Verdict v{loss.z_score(loss_value), norm.z_score(norm_value), false};
    v.skip = (max_loss_z > 0.0 && v.loss_z && *v.loss_z > max_loss_z) ||
             (max_norm_z > 0.0 && v.norm_z && *v.norm_z > max_norm_z);
    if (!v.skip) {
        loss.add(loss_value);
        norm.add(norm_value);
    }
    return v;
}

}  // namespace gpt2
