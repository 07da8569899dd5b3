#include "gpt2/training_state.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <regex>

#include "gpt2/checkpoint.hpp"
#include "gpt2/error.hpp"

namespace gpt2 {

namespace {
constexpr std::array<char, 8> kStateMagic = {'G', 'P', 'T', '2', 'S', 'T', 'A', '1'};

struct StateHeader {
    std::array<char, 8> magic;
    std::int64_t step;
    std::uint64_t seed;
    std::int64_t sequences_per_step;
    std::int32_t seq_len;
    std::int32_t config[6];
    std::uint64_t num_params;
    std::int64_t adam_step;
    Rng::State sample_rng;
};

std::span<const std::uint8_t> bytes_of(const void* p, std::size_t n) {
    return {static_cast<const std::uint8_t*>(p), n};
}

std::array<std::int32_t, 6> config_ints(const ModelConfig& c) {
    return {c.max_seq_len, c.vocab_size, c.padded_vocab_size,
            c.num_layers,  c.num_heads,  c.channels};
}
}  // namespace

void save_resume_state(const std::filesystem::path& path, const ResumeState& state,
                       const ModelConfig& config, const AdamWState& optimizer) {
    StateHeader h{};
    h.magic = kStateMagic;
    h.step = state.step;
    h.seed = state.seed;
    h.sequences_per_step = state.sequences_per_step;
    h.seq_len = state.seq_len;
    const auto ints = config_ints(config);
    std::copy(ints.begin(), ints.end(), h.config);
    h.num_params = optimizer.m.size();
    h.adam_step = optimizer.step;
    h.sample_rng = state.sample_rng;
    const auto header = bytes_of(&h, sizeof(h));
    const auto m = bytes_of(optimizer.m.data(), optimizer.m.size() * sizeof(float));
    const auto v = bytes_of(optimizer.v.data(), optimizer.v.size() * sizeof(float));
    const std::uint64_t sum = checksum64(v, checksum64(m, checksum64(header)));
    const std::array pieces = {header, m, v, bytes_of(&sum, sizeof(sum))};
    write_file_atomically(path, pieces);
}

ResumeState load_resume_state(const std::filesystem::path& path, const ModelConfig& config,
                              AdamWState& optimizer) {
    const std::vector<std::uint8_t> bytes = read_file_bytes(path);
    const std::string name = path.string();
    const std::size_t floats = optimizer.m.size() * sizeof(float);
    const std::size_t expected = sizeof(StateHeader) + 2 * floats + sizeof(std::uint64_t);
    if (bytes.size() < sizeof(StateHeader)) throw InputError(name + ": truncated resume state");
    StateHeader h;
    std::memcpy(&h, bytes.data(), sizeof(h));
    if (h.magic != kStateMagic) throw InputError(name + ": not a resume state file (bad magic)");
    const auto ints = config_ints(config);
    if (!std::equal(ints.begin(), ints.end(), h.config) || h.num_params != optimizer.m.size()) {
        throw InputError(name + ": resume state is for another model shape than " +
                         describe(config));
    }
    if (bytes.size() != expected) {
        throw InputError(name + ": resume state has " + std::to_string(bytes.size()) +
                         " bytes, expected " + std::to_string(expected) +
                         " (truncated or corrupt)");
    }
    std::uint64_t stored = 0;
    std::memcpy(&stored, bytes.data() + expected - sizeof(stored), sizeof(stored));
    // Chained over the same three pieces the writer hashed.
    const std::span<const std::uint8_t> all(bytes);
    const std::uint64_t sum = checksum64(all.subspan(sizeof(StateHeader) + floats, floats),
                                         checksum64(all.subspan(sizeof(StateHeader), floats),
                                                    checksum64(all.first(sizeof(StateHeader)))));
    if (sum != stored) {
        throw InputError(name + ": checksum mismatch, the resume state is corrupt");
    }
    std::memcpy(optimizer.m.data(), bytes.data() + sizeof(StateHeader), floats);
    std::memcpy(optimizer.v.data(), bytes.data() + sizeof(StateHeader) + floats, floats);
    optimizer.step = h.adam_step;
    return ResumeState{h.step, h.seed, h.sequences_per_step, h.seq_len, h.sample_rng};
}

bool is_resume_state_file(const std::filesystem::path& path) {
    std::array<char, 8> magic{};
    std::ifstream in(path, std::ios::binary);
    return in.read(magic.data(), magic.size()) && magic == kStateMagic;
}

std::filesystem::path model_path(const std::filesystem::path& dir, std::int64_t step) {
    char name[64];
    std::snprintf(name, sizeof(name), "model_%06lld.bin", static_cast<long long>(step));
    return dir / name;
}

std::filesystem::path state_path(const std::filesystem::path& dir, std::int64_t step) {
    char name[64];
    std::snprintf(name, sizeof(name), "state_%06lld.bin", static_cast<long long>(step));
    return dir / name;
}

std::optional<std::int64_t> checkpoint_step(const std::filesystem::path& file) {
    static const std::regex pattern(R"((model|state)_(\d+)\.bin)");
    std::smatch match;
    const std::string name = file.filename().string();
    if (!std::regex_match(name, match, pattern)) return std::nullopt;
    return std::stoll(match[2].str());
}

std::vector<std::int64_t> list_checkpoints(const std::filesystem::path& dir) {
    std::vector<std::int64_t> steps;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        const auto step = checkpoint_step(entry.path());
        if (step && entry.path().filename().string().starts_with("state_") &&
            std::filesystem::exists(model_path(dir, *step))) {
            steps.push_back(*step);
        }
    }
    std::sort(steps.rbegin(), steps.rend());
    return steps;
}

void prune_checkpoints(const std::filesystem::path& dir, int keep) {
    if (keep <= 0) return;
    const std::vector<std::int64_t> steps = list_checkpoints(dir);
    for (std::size_t i = static_cast<std::size_t>(keep); i < steps.size(); ++i) {
        std::error_code ec;
        // State first: a model without its state is ignored, never the reverse.
        std::filesystem::remove(state_path(dir, steps[i]), ec);
        std::filesystem::remove(model_path(dir, steps[i]), ec);
    }
}

}  // namespace gpt2
