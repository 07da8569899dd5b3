// How a run is asked to stop: SIGINT, SIGTERM and SIGUSR1 set a flag the step loop reads at each
// step boundary (it then saves a checkpoint and exits 0).
#pragma once

#include <atomic>

namespace gpt2 {

// Set by SIGINT/SIGTERM/SIGUSR1 to the signal's number; a signal handler can only reach static
// storage.
[[nodiscard]] std::atomic<int>& stop_signal();
// "SIGINT", "SIGTERM", "SIGUSR1", or "--stop-at-step" for anything else.
[[nodiscard]] const char* signal_name(int signum);
// Installs the handlers, and ignores SIGXFSZ and SIGPIPE (see the definition).
void install_signal_handlers();

}  // namespace gpt2
