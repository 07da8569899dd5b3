#include "core/stop_signal.hpp"

#include <csignal>

namespace gpt2 {

std::atomic<int>& stop_signal() {
    static std::atomic<int> signal{0};
    return signal;
}

namespace {

extern "C" void on_stop_signal(int signum) {
    stop_signal().store(signum);
}

}  // namespace

const char* signal_name(int signum) {
    switch (signum) {
        case SIGINT:
            return "SIGINT";
        case SIGTERM:
            return "SIGTERM";
        case SIGUSR1:
            return "SIGUSR1";
        default:
            return "--stop-at-step";
    }
}

void install_signal_handlers(bool restart_reads) {
    // SIGINT/SIGTERM: Ctrl-C, kill, Slurm. SIGUSR1: what mpirun forwards to every rank without
    // ending the job itself (Open MPI kills the ranks one second after forwarding SIGTERM and
    // then exits 1, whatever they do), so it is the clean way to stop a job under mpirun.
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = restart_reads ? SA_RESTART : 0;
    for (const int signum : {SIGINT, SIGTERM, SIGUSR1})
        ::sigaction(signum, &action, nullptr);
    // Past a file-size limit, a write should fail with EFBIG (reported, previous checkpoint
    // kept) rather than kill the process.
    std::signal(SIGXFSZ, SIG_IGN);
    // When mpirun goes away its output pipes close: a log line must not kill a rank that is
    // about to write its checkpoint.
    std::signal(SIGPIPE, SIG_IGN);
}

}  // namespace gpt2
