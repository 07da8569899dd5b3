#include "optim/spike_guard.hpp"

#include <cmath>

namespace gpt2 {

std::optional<double> SpikeWindow::push(double x) {
    const bool was_full = count == kWindow;
    values[next] = x;
    next = (next + 1) % kWindow;
    if (!was_full) {
        ++count;
        return std::nullopt;
    }
    // Two passes over the 128 values in array order (the saved state), not running sums, so
    // rounding never accumulates over a long run.
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

SpikeGuard::Verdict SpikeGuard::judge(double loss_value, double norm_value) {
    Verdict v{loss.push(loss_value), norm.push(norm_value), false};
    v.skip = (max_loss_z > 0.0 && v.loss_z && *v.loss_z > max_loss_z) ||
             (max_norm_z > 0.0 && v.norm_z && *v.norm_z > max_norm_z);
    return v;
}

}  // namespace gpt2
