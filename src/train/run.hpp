// The training program: rank 0 prepares tokenizer and tokens and broadcasts them, every rank builds
// its replica and workers, then the step loop with logging, validation, samples, checkpoints,
// resume, signal handling and the non-finite-step policy.
#pragma once

#include "parallel/comm.hpp"
#include "train/options.hpp"

namespace gpt2 {

// Returns the process exit code; throws InputError (or std::exception) for errors that must end
// the whole job.
[[nodiscard]] int run_training(const TrainOptions& options, const Communicator& comm);

}  // namespace gpt2
