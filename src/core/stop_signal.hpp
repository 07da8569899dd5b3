// How a run is asked to stop: SIGINT, SIGTERM and SIGUSR1 set a flag the step loop reads at each
// step boundary (it then saves a checkpoint and exits 0), and inference between tokens.
#pragma once

#include <atomic>

namespace gpt2 {

// Set by SIGINT/SIGTERM/SIGUSR1 to the signal's number; a signal handler can only reach static
// storage.
[[nodiscard]] std::atomic<int>& stop_signal();
// "SIGINT", "SIGTERM", "SIGUSR1", or "--stop-at-step" for anything else.
[[nodiscard]] const char* signal_name(int signum);
// Installs the handlers, and ignores SIGXFSZ and SIGPIPE (see the definition). With
// `restart_reads` false a read waiting for input (inference's standard input) returns when a
// stop signal arrives instead of going on waiting.
void install_signal_handlers(bool restart_reads = true);

}  // namespace gpt2
