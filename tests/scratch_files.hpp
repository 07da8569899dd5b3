// Scratch files for the tests and the fuzz targets: a directory of the test's own under the
// system temp dir, and writing exact bytes into it (reads go through core/file_io).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

namespace gpt2::test {

// A fresh directory `name`-<pid> under $TMPDIR (or /tmp), removed with what it holds by the
// destructor.
class ScratchDir {
  public:
    explicit ScratchDir(const std::string& name) : path_(base() / (name + "-" + pid())) {
        std::filesystem::remove_all(path_);
        std::filesystem::create_directories(path_);
    }
    ~ScratchDir() {
        std::error_code ec;
        // A test may have taken its own rights away (read-only directories): give them back.
        std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                                     std::filesystem::perm_options::add, ec);
        std::filesystem::remove_all(path_, ec);
    }
    ScratchDir(const ScratchDir&) = delete;
    ScratchDir& operator=(const ScratchDir&) = delete;
    [[nodiscard]] const std::filesystem::path& path() const { return path_; }
    [[nodiscard]] std::string operator/(const std::string& name) const {
        return (path_ / name).string();
    }

  private:
    static std::filesystem::path base() {
        std::error_code ec;
        std::filesystem::path dir = std::filesystem::temp_directory_path(ec);
        return ec ? std::filesystem::path("/tmp") : dir;
    }
    static std::string pid() { return std::to_string(static_cast<long>(::getpid())); }

    std::filesystem::path path_;
};

// Replaces `path` with exactly `bytes` (plainly, without the programs' atomic rename and fsync:
// scratch files only). Throws std::runtime_error naming the file if it cannot be written.
inline void write_bytes(const std::filesystem::path& path, std::string_view bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) throw std::runtime_error("cannot write the scratch file " + path.string());
}
inline void write_bytes(const std::filesystem::path& path, std::span<const std::uint8_t> bytes) {
    write_bytes(path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

}  // namespace gpt2::test
