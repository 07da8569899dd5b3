#include "parallel/model_broadcast.hpp"

namespace gpt2 {

ModelConfig broadcast_config(const Communicator& comm, const ModelConfig& config) {
    // The whole record, architecture with the dimensions: every rank builds the same layout.
    ConfigRecord record{};
    if (comm.is_root()) record = to_config_record(config);
    comm.broadcast(std::span<std::int32_t>(record));
    if (comm.is_root()) return config;
    return from_config_record(record, "the configuration rank 0 sent");
}

void broadcast_weights(const Communicator& comm, Model& model) {
    comm.broadcast(model.params.span());
}

}  // namespace gpt2
