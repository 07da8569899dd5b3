// train_gpt2: data-parallel GPT-2 training (mpirun -np N build/train_gpt2 [flags]; --help lists
// them). Any error on any rank prints one line naming the rank and ends the whole job.
#include <exception>
#include <variant>

#include "gpt2/comm.hpp"
#include "gpt2/train_options.hpp"
#include "gpt2/training_run.hpp"

int main(int argc, char** argv) {
    gpt2::MpiSession mpi(&argc, &argv);
    const gpt2::Communicator comm;
    auto parsed = gpt2::parse_train_options(argc, argv, comm.is_root());
    if (const int* code = std::get_if<int>(&parsed)) {
        // Every rank parsed the same flags and reached the same verdict; only rank 0 speaks.
        return *code;
    }
    try {
        return gpt2::run_training(std::get<gpt2::TrainOptions>(parsed), comm);
    } catch (const std::bad_alloc&) {
        comm.abort("out of memory (try a smaller --batch-size, --seq-len or model)");
    } catch (const std::exception& e) {
        comm.abort(e.what());
    }
}
