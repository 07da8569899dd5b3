#include "train/out_dir.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "core/error.hpp"
#include "train/text_format.hpp"

namespace gpt2 {

void check_out_dir_writable(const std::filesystem::path& dir) {
    const auto refuse = [&dir](const std::string& why) {
        throw InputError("--out-dir " + dir.string() + " cannot be written (" + why +
                         "); checkpoints go there: give a directory that can be written");
    };
    std::error_code ec;
    if (!std::filesystem::exists(dir, ec)) {
        // Created when training starts (a run refused before then leaves nothing behind): its
        // nearest existing parent must take a new entry. access() reports a read-only file
        // system even to root, whom permission bits do not stop.
        std::filesystem::path parent = std::filesystem::absolute(dir, ec).parent_path();
        while (!parent.empty() && !std::filesystem::exists(parent, ec) &&
               parent != parent.root_path()) {
            parent = parent.parent_path();
        }
        if (!std::filesystem::is_directory(parent, ec)) {
            refuse(parent.string() + " is not a directory");
        }
        if (::access(parent.c_str(), W_OK | X_OK) != 0) {
            refuse(parent.string() + ": " + std::strerror(errno));
        }
        return;
    }
    if (!std::filesystem::is_directory(dir, ec)) refuse("a file of that name is there");
    const std::filesystem::path probe =
        dir / (".gpt2-write-probe." + std::to_string(static_cast<long>(::getpid())));
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) refuse(std::strerror(errno));
    ::close(fd);
    std::filesystem::remove(probe, ec);
}

void check_out_dir_room(const std::filesystem::path& dir, const CheckpointFootprint& need) {
    std::error_code ec;
    const std::filesystem::space_info space = std::filesystem::space(dir, ec);
    if (ec || space.available == static_cast<std::uintmax_t>(-1)) return;
    if (space.available >= need.total()) return;
    const auto bytes = [](std::uintmax_t n) { return human_bytes(static_cast<double>(n)); };
    std::string files =
        "model file " + bytes(need.model_bytes) + " + state file " + bytes(need.state_bytes);
    if (need.adapter_bytes > 0) files += " + LoRA adapter " + bytes(need.adapter_bytes);
    throw InputError("--out-dir " + dir.string() + " has " + bytes(space.available) +
                     " free, but one checkpoint takes " + bytes(need.total()) + " (" + files +
                     "): free some space or give another --out-dir");
}

}  // namespace gpt2
