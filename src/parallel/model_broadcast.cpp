#include "parallel/model_broadcast.hpp"

namespace gpt2 {

ModelConfig broadcast_config(const Communicator& comm, const ModelConfig& config) {
    ShapeInts shape{};
    if (comm.is_root()) shape = to_shape_ints(config);
    comm.broadcast(std::span<std::int32_t>(shape));
    return from_shape_ints(shape);
}

void broadcast_weights(const Communicator& comm, Model& model) {
    comm.broadcast(model.params.span());
}

}  // namespace gpt2
