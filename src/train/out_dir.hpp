// Where checkpoints go, checked before any step rather than found at the first checkpoint: that
// --out-dir can be created and written, and that it has room for one checkpoint and its state.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace gpt2 {

// Writes and removes a probe file in `dir`, or when it does not exist yet checks that its nearest
// existing parent takes new entries (nothing is created). InputError naming --out-dir and the
// system's reason (read-only file system, permission denied, ...) when it cannot be written.
void check_out_dir_writable(const std::filesystem::path& dir);

// The files of one checkpoint and their sizes, for the room check and its message.
struct CheckpointFootprint {
    std::uintmax_t model_bytes = 0;    // model_NNNNNN.bin
    std::uintmax_t state_bytes = 0;    // state_NNNNNN.bin
    std::uintmax_t adapter_bytes = 0;  // model_NNNNNN.adapter (LoRA), 0 without
    [[nodiscard]] std::uintmax_t total() const { return model_bytes + state_bytes + adapter_bytes; }
};

// InputError naming --out-dir, what is free there and what one checkpoint takes, when the file
// system holding `dir` has less room than `need` (a new checkpoint is written beside the old
// ones before they are pruned). Nothing when the free space cannot be read.
void check_out_dir_room(const std::filesystem::path& dir, const CheckpointFootprint& need);

}  // namespace gpt2
