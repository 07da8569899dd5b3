// Rank 0's model to every rank: its configuration record first (dimensions and architecture, so
// the others can allocate), then the weights;
// both programs read a model on rank 0 only.
#pragma once

#include "model/model.hpp"
#include "parallel/comm.hpp"

namespace gpt2 {

// Collective: rank 0's `config` on every rank (the others' argument is ignored).
[[nodiscard]] ModelConfig broadcast_config(const Communicator& comm, const ModelConfig& config);

// Collective: rank 0's weights into every rank's `model`, which has the same shape everywhere.
void broadcast_weights(const Communicator& comm, Model& model);

}  // namespace gpt2
