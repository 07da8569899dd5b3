// A scratch directory laid out as a checkout after scripts/setup.sh, where tests run the
// commands README.md and docs/ show, exactly as written.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include "process_support.hpp"

namespace gpt2::test {

// A directory laid out as a checkout after scripts/setup.sh: build/ and scripts/ (links to this
// checkout's), data/ with the corpus and GPT-2's tokenizer files, .deps/ when llama.cpp is there.
class Checkout {
  public:
    explicit Checkout(const std::string& name) : dir_(name) {
        const std::filesystem::path source(GPT2_SOURCE_DIR);
        std::filesystem::create_directory_symlink(GPT2_BUILD_DIR, dir_.path() / "build");
        std::filesystem::create_directory_symlink(source / "scripts", dir_.path() / "scripts");
        std::filesystem::create_directories(dir_.path() / "data");
        std::filesystem::create_symlink(source / "data" / "tinyshakespeare.txt",
                                        dir_.path() / "data" / "tinyshakespeare.txt");
        if (std::filesystem::exists(source / "data" / "gpt2")) {
            std::filesystem::create_directory_symlink(source / "data" / "gpt2",
                                                      dir_.path() / "data" / "gpt2");
        }
        if (std::filesystem::exists(source / ".deps")) {
            std::filesystem::create_directory_symlink(source / ".deps", dir_.path() / ".deps");
        }
    }
    [[nodiscard]] std::filesystem::path path() const { return dir_.path(); }
    [[nodiscard]] bool has_corpus() const {
        return std::filesystem::exists(std::filesystem::path(GPT2_SOURCE_DIR) / "data" /
                                       "tinyshakespeare.txt");
    }

    // Runs `command` from the checkout's root as a user's shell would, without Open MPI's root
    // variables (the tests' main sets them for every other test).
    [[nodiscard]] ProcessResult run(const std::string& command) const {
        const std::filesystem::path script = dir_.path() / "command.sh";
        std::ofstream(script) << command << "\n";
        return run_command("cd " + dir_.path().string() +
                           " && env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM "
                           "bash command.sh");
    }

  private:
    ScratchDir dir_;
};

}  // namespace gpt2::test
