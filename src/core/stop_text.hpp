// Generated text with stop strings: what may be the start of a stop string is held back, so that
// a stop string (and what would follow it) is never shown, even when tokens cut it (inference's
// samples and the server's completions).
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gpt2 {

class StopText {
  public:
    explicit StopText(std::vector<std::string> stops) : stops_(std::move(stops)) {}
    // Appends `bytes`; returns the text that can no longer become part of a stop string. When a
    // stop string is complete, returns the text before it and stopped() turns true.
    [[nodiscard]] std::string push(std::string_view bytes) {
        held_ += bytes;
        std::size_t first = std::string::npos;
        for (const std::string& stop : stops_)
            first = std::min(first, held_.find(stop));
        if (first != std::string::npos) {
            stopped_ = true;
            std::string before = held_.substr(0, first);
            held_.clear();
            return before;
        }
        // Keep the longest end of the text that begins some stop string.
        std::size_t keep = 0;
        for (const std::string& stop : stops_) {
            for (std::size_t n = std::min(stop.size() - 1, held_.size()); n > keep; --n) {
                if (std::string_view(held_).substr(held_.size() - n) ==
                    std::string_view(stop).substr(0, n)) {
                    keep = n;
                    break;
                }
            }
        }
        std::string ready = held_.substr(0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
        return ready;
    }
    // The end of the text: what was held back is text after all.
    [[nodiscard]] std::string finish() { return std::exchange(held_, std::string()); }
    [[nodiscard]] bool stopped() const { return stopped_; }

  private:
    std::vector<std::string> stops_;
    std::string held_;
    bool stopped_ = false;
};

}  // namespace gpt2
