// train_gpt2: data-parallel GPT-2 training (mpirun -np N build/train_gpt2 [flags]; --help lists
// them). Any error on any rank prints one line naming the rank and ends the whole job.
#include <exception>
#include <new>
#include <variant>

#include "gpt2/comm.hpp"
#include "gpt2/gemm.hpp"
#include "gpt2/train_options.hpp"
#include "gpt2/training_run.hpp"

int main(int argc, char** argv) {
    gpt2::select_gemm_kernels(argv);
    gpt2::MpiSession mpi(&argc, &argv);
    const gpt2::Communicator comm;
    // Ranks agree on the command line before anything else: the first rank whose flags fail
    // (or rank 0 for --help) prints, and every rank exits with that code.
    auto parsed = gpt2::parse_train_options(argc, argv, false);
    const int* stop = std::get_if<int>(&parsed);
    const auto verdicts = comm.allgather(stop ? static_cast<std::uint64_t>(*stop) + 1 : 0);
    for (std::size_t r = 0; r < verdicts.size(); ++r) {
        if (verdicts[r] == 0) continue;
        if (static_cast<int>(r) == comm.rank()) (void)gpt2::parse_train_options(argc, argv, true);
        return static_cast<int>(verdicts[r] - 1);
    }
    try {
        return gpt2::run_training(std::get<gpt2::TrainOptions>(parsed), comm);
    } catch (const std::bad_alloc&) {
        comm.abort("out of memory (try a smaller --batch-size, --seq-len or model)");
    } catch (const std::exception& e) {
        comm.abort(e.what());
    }
}
