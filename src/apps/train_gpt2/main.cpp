// train_gpt2: data-parallel GPT-2 training (mpirun -np N build/train_gpt2 [flags]; --help lists
// them). A bad command line is reported once and every rank exits 2; any error at run time on any
// rank prints one line and ends the whole job with 1.
#include <algorithm>
#include <exception>
#include <iostream>
#include <new>
#include <variant>

#include "apps/cli/cli.hpp"
#include "apps/train_gpt2/options.hpp"
#include "core/error.hpp"
#include "core/stop_signal.hpp"
#include "ops/gemm.hpp"
#include "parallel/comm.hpp"
#include "train/run.hpp"

namespace {

// Every rank parses and validates the same command line, so all reach the same verdict without
// waiting for each other; the first rank whose verdict is "stop" prints it.
std::variant<gpt2::TrainOptions, int> agree_on_options(int argc, char** argv,
                                                       const gpt2::Communicator& comm) {
    auto parsed = gpt2::parse_train_options(argc, argv, false);
    std::string problem;
    if (auto* options = std::get_if<gpt2::TrainOptions>(&parsed)) {
        try {
            gpt2::validate_train_options(*options, comm.size());
        } catch (const gpt2::InputError& e) {
            problem = e.what();
            parsed = gpt2::app::kExitBadFlags;
        }
    }
    const int* stop = std::get_if<int>(&parsed);
    const auto verdicts = comm.allgather(stop ? static_cast<std::uint64_t>(*stop) + 1 : 0);
    for (std::size_t r = 0; r < verdicts.size(); ++r) {
        if (verdicts[r] == 0) continue;
        if (static_cast<int>(r) == comm.rank()) {
            // Only when the ranks were given different flags is the rank worth naming.
            const bool all_refused =
                std::all_of(verdicts.begin(), verdicts.end(), [](auto v) { return v != 0; });
            if (!all_refused) {
                std::cerr << gpt2::app::error_line(
                                 "the ranks' command lines differ; this "
                                 "rank's is refused:",
                                 comm.rank(), comm.size())
                          << std::endl;
            }
            if (problem.empty()) {
                (void)gpt2::parse_train_options(argc, argv, true);
            } else {
                std::cerr << gpt2::app::error_line(problem) << std::endl;
            }
        }
        return static_cast<int>(verdicts[r] - 1);
    }
    return parsed;
}

}  // namespace

int main(int argc, char** argv) {
    // First of all, so that a stop during start-up (Ctrl-C on scripts/mpirun.sh, which becomes
    // SIGUSR1) is a stop, not the end of the process by the signal's default action.
    gpt2::install_signal_handlers();
    gpt2::select_gemm_kernels(argv);
    try {
        gpt2::MpiSession mpi(&argc, &argv);
        gpt2::Communicator comm;
        auto agreed = agree_on_options(argc, argv, comm);
        if (const int* code = std::get_if<int>(&agreed)) return *code;
        const auto& options = std::get<gpt2::TrainOptions>(agreed);
        if (options.test.mpi_chunk_elements > 0) {
            comm.set_max_chunk_elements(static_cast<std::size_t>(options.test.mpi_chunk_elements));
        }
        gpt2::app::setup_logging(options.log_level, gpt2::app::LogStream::Stdout, comm.rank(),
                                 comm.size());
        try {
            return gpt2::run_training(options, comm);
        } catch (const gpt2::UsageError& e) {
            comm.abort(e.what(), gpt2::app::kExitBadFlags);
        } catch (const std::bad_alloc&) {
            comm.abort("out of memory (try a smaller --batch-size, --seq-len or model)");
        } catch (const std::exception& e) {
            comm.abort(e.what());
        }
    } catch (const std::exception& e) {  // MPI itself could not start
        std::cerr << gpt2::app::error_line(e.what()) << std::endl;
        return gpt2::app::kExitRuntimeError;
    }
}
