// Loss-spike skipping, as llm.c's trainer does it: z-scores of the loss and of the gradient norm
// against the last 128 steps; an update whose z-score exceeds a threshold is skipped.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

namespace gpt2 {

// The last kWindow values of one quantity, oldest overwritten first. Plain data: it is part of
// the resume state, so that a resumed run decides exactly as an uninterrupted one.
struct SpikeWindow {
    static constexpr std::uint32_t kWindow = 128;
    std::array<double, kWindow> values{};
    std::uint32_t count = 0;  // values held (up to kWindow)
    std::uint32_t next = 0;   // where the next value goes

    // Adds x and returns its z-score against the window with x in it, as llm.c's outlier detector
    // computes it: nullopt while the window was not full before x (the first 128 values), 0 when
    // the window does not vary. Every value enters, so a lasting change of level becomes the new
    // normal within 128 steps, and a z-score cannot exceed sqrt(127) (about 11.3).
    [[nodiscard]] std::optional<double> push(double x);
};

struct SpikeGuard {
    double max_loss_z = 0.0;  // --skip-loss-z (0: off)
    double max_norm_z = 0.0;  // --skip-norm-z (0: off)
    SpikeWindow loss;
    SpikeWindow norm;

    struct Verdict {
        std::optional<double> loss_z;
        std::optional<double> norm_z;
        bool skip = false;
    };
    // Scores a step's (finite) loss and norm, which enter the windows.
    [[nodiscard]] Verdict judge(double loss_value, double norm_value);
};

}  // namespace gpt2
