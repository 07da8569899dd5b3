// Fuzzes train_gpt2's --config file (CLI11) via parse_train_options and validate_train_options.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "apps/train_gpt2/options.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size > gpt2::fuzz::kMaxInputBytes) return -1;
    const std::filesystem::path path = gpt2::fuzz::scratch_dir() / "train.toml";
    gpt2::fuzz::write_bytes(path, {data, size});
    std::vector<std::string> args = {"train_gpt2", "--config", path.string()};
    std::vector<char*> argv;
    for (std::string& arg : args)
        argv.push_back(arg.data());
    argv.push_back(nullptr);
    const auto parsed =
        gpt2::parse_train_options(static_cast<int>(args.size()), argv.data(), false);
    if (const auto* code = std::get_if<int>(&parsed)) {
        FUZZ_CHECK(*code == 0 || *code == 2);
        gpt2::fuzz::rejected(
            std::runtime_error("parse_train_options returned " + std::to_string(*code)));
        return 0;
    }
    try {
        gpt2::validate_train_options(std::get<gpt2::TrainOptions>(parsed), 1);
    } catch (const gpt2::InputError& error) {
        gpt2::fuzz::rejected(error);
    }
    return 0;
}
