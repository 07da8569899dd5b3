#include "formats/resume_state.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <tuple>

#include "core/bytes.hpp"
#include "core/error.hpp"
#include "formats/checkpoint.hpp"

namespace gpt2 {

namespace {
// Version 9 (a LoRA run on a model that is not GPT-2) is version 8's header with version 5's LoRA
// record after the spike windows, where version 5 has it. Version 7 (a model that is not GPT-2,
// ModelConfig::is_gpt2) is version 3's header, the optimizer's kind (AdamW too) and the model's
// configuration record; GPT-2 runs keep writing 3 or 6. Version 6 (full training with an optimizer
// other than AdamW) adds the optimizer's kind after version 3's header; AdamW runs keep writing
// version 3, which earlier builds read. Version 5 (LoRA runs only) adds LoRA's input dropout rate
// after version 4's LoRA record; a version 4 state is of a run without it (rate 0). Version 4 (LoRA
// runs only) adds the adapter's configuration and the base's fingerprint. Version 3 adds the
// loss-spike windows (SpikeGuard) to the header. Version 2 writes its header field by field and
// adds the lineage and the schedule length. Version 1 was the raw bytes of a struct (4 padding
// bytes after the model shape); it is still read, field by field, so checkpoints of earlier builds
// resume.
constexpr std::array<char, 8> kStateMagicV1 = {'G', 'P', 'T', '2', 'S', 'T', 'A', '1'};
constexpr std::array<char, 8> kStateMagicV2 = {'G', 'P', 'T', '2', 'S', 'T', 'A', '2'};
constexpr std::array<char, 8> kStateMagicV3 = {'G', 'P', 'T', '2', 'S', 'T', 'A', '3'};
constexpr std::array<char, 8> kStateMagicV4 = {'G', 'P', 'T', '2', 'S', 'T', 'A', '4'};
constexpr std::array<char, 8> kStateMagicV5 = {'G', 'P', 'T', '2', 'S', 'T', 'A', '5'};
constexpr std::array<char, 8> kStateMagicV6 = {'G', 'P', 'T', '2', 'S', 'T', 'A', '6'};
constexpr std::array<char, 8> kStateMagicV7 = {'G', 'P', 'T', '2', 'S', 'T', 'A', '7'};
constexpr std::array<char, 8> kStateMagicV8 = {'G', 'P', 'T', '2', 'S', 'T', 'A', '8'};
constexpr std::array<char, 8> kStateMagicV9 = {'G', 'P', 'T', '2', 'S', 'T', 'A', '9'};
constexpr std::size_t kHeaderBytesV1 = 112;
constexpr std::size_t kHeaderBytesV2 = 124;
constexpr std::size_t kWindowBytes = 8 + 8 * SpikeWindow::kWindow;
constexpr std::size_t kHeaderBytesV3 = kHeaderBytesV2 + 2 * kWindowBytes;
constexpr std::size_t kLoraBytes = 4 + 4 + 4 + 4 + 8;  // rank, alpha, targets, base, fingerprint
constexpr std::size_t kHeaderBytesV4 = kHeaderBytesV3 + kLoraBytes;
constexpr std::size_t kHeaderBytesV5 = kHeaderBytesV4 + 4;  // the dropout rate
constexpr std::size_t kHeaderBytesV6 = kHeaderBytesV3 + 4;  // the optimizer's kind
// Version 7 held a version-1 configuration record, version 8 the current one.
constexpr std::size_t kHeaderBytesV7 = kHeaderBytesV6 + kConfigRecordV1Ints * sizeof(std::int32_t);
constexpr std::size_t kHeaderBytesV8 = kHeaderBytesV6 + sizeof(ConfigRecord);
constexpr std::size_t kHeaderBytesV9 = kHeaderBytesV8 + kLoraBytes + 4;
constexpr std::size_t kLongestHeader =
    std::max({kHeaderBytesV5, kHeaderBytesV6, kHeaderBytesV8, kHeaderBytesV9});

void put_lora(ByteWriter& out, const LoraRecord& lora) {
    out.put(static_cast<std::int32_t>(lora.config.rank));
    out.put(lora.config.alpha);
    std::uint32_t targets = 0;
    for (int t = 0; t < kLoraTargets; ++t)
        targets |= lora.config.targets[static_cast<std::size_t>(t)] ? 1u << t : 0u;
    out.put(targets);
    out.put(static_cast<std::uint32_t>(lora.base_from_file ? 1 : 0));
    out.put(lora.base_fingerprint);
    out.put(lora.config.dropout);  // version 5
}

LoraRecord get_lora(ByteReader& in, const std::string& name, bool with_dropout) {
    LoraRecord lora;
    lora.config.rank = in.get<std::int32_t>("LoRA rank");
    lora.config.alpha = in.get<float>("LoRA alpha");
    const auto targets = in.get<std::uint32_t>("LoRA targets");
    const auto base = in.get<std::uint32_t>("LoRA base");
    lora.base_fingerprint = in.get<std::uint64_t>("LoRA base fingerprint");
    if (with_dropout) lora.config.dropout = in.get<float>("LoRA dropout");
    if (lora.config.rank <= 0 || targets == 0 || targets >= (1u << kLoraTargets) || base > 1 ||
        !(lora.config.dropout >= 0.0f && lora.config.dropout < 1.0f)) {
        throw InputError(name + ": damaged LoRA record (rank " + std::to_string(lora.config.rank) +
                         ", targets " + std::to_string(targets) + ", dropout " +
                         std::to_string(lora.config.dropout) + ")");
    }
    for (int t = 0; t < kLoraTargets; ++t)
        lora.config.targets[static_cast<std::size_t>(t)] = (targets >> t & 1u) != 0;
    lora.base_from_file = base == 1;
    return lora;
}

void put_window(ByteWriter& out, const SpikeWindow& w) {
    out.put(w.count);
    out.put(w.next);
    for (const double v : w.values)
        out.put(v);
}

SpikeWindow get_window(ByteReader& in, const std::string& name, const char* what) {
    SpikeWindow w;
    w.count = in.get<std::uint32_t>(what);
    w.next = in.get<std::uint32_t>(what);
    for (double& v : w.values)
        v = in.get<double>(what);
    if (w.count > SpikeWindow::kWindow || w.next >= SpikeWindow::kWindow) {
        throw InputError(name + ": " + what + " holds " + std::to_string(w.count) +
                         " values at position " + std::to_string(w.next) + " (at most " +
                         std::to_string(SpikeWindow::kWindow) + ")");
    }
    return w;
}

std::span<const std::uint8_t> bytes_of(const void* p, std::size_t n) {
    return {static_cast<const std::uint8_t*>(p), n};
}

struct StateHeader {
    ResumeState state;
    std::array<std::int32_t, 6> config{};
    std::uint64_t num_params = 0;
    std::int64_t adam_step = 0;
    std::optional<ConfigRecord> record;  // versions 7-8: the whole configuration; else GPT-2's
    std::size_t bytes = 0;               // header size in the file
};

// Parses whichever version's header `bytes` starts with.
StateHeader parse_header(std::span<const std::uint8_t> bytes, const std::string& name) {
    if (bytes.size() < 8) throw InputError(name + ": truncated resume state");
    std::array<char, 8> magic{};
    std::memcpy(magic.data(), bytes.data(), 8);
    const bool v1 = magic == kStateMagicV1;
    const bool v9 = magic == kStateMagicV9;        // a LoRA record and a configuration record
    const bool v8 = magic == kStateMagicV8 || v9;  // the current configuration record
    const bool v7 = magic == kStateMagicV7 || v8;  // a configuration record
    const bool v6 = magic == kStateMagicV6;
    const bool v5 = magic == kStateMagicV5 || v9;
    const bool v4 = magic == kStateMagicV4 || v5;
    const bool v3 = magic == kStateMagicV3 || v4 || v6 || v7;
    if (!v1 && !v3 && magic != kStateMagicV2) {
        throw InputError(name + ": not a resume state file (bad magic)");
    }
    ByteReader in(bytes, name + " (resume state header)");
    in.skip(8, "magic");
    StateHeader h;
    h.state.step = in.get<std::int64_t>("step");
    h.state.seed = in.get<std::uint64_t>("seed");
    h.state.sequences_per_step = in.get<std::int64_t>("sequences per step");
    h.state.seq_len = in.get<std::int32_t>("sequence length");
    h.config = in.get_array<std::int32_t, 6>("model shape");
    if (v1) in.skip(4, "padding");  // the struct's padding
    h.num_params = in.get<std::uint64_t>("parameter count");
    h.adam_step = in.get<std::int64_t>("AdamW step");
    h.state.sample_rng = in.get_array<std::uint64_t, 4>("sampling RNG");
    if (!v1) {
        h.state.run_id = in.get<std::uint64_t>("run id");
        h.state.lr_decay_steps = in.get<std::int64_t>("schedule length");
    }
    if (v3) {
        h.state.loss_window = get_window(in, name, "loss-spike window");
        h.state.norm_window = get_window(in, name, "gradient-norm-spike window");
    }
    if (v4) h.state.lora = get_lora(in, name, v5);
    if (v6 || v7) {
        const auto number = in.get<std::uint32_t>("optimizer");
        const std::optional<OptimizerKind> kind = optimizer_kind_of(number);
        // A GPT-2 run's AdamW state is version 3.
        if (!kind || (v6 && *kind == OptimizerKind::AdamW)) {
            throw InputError(name + ": damaged header (optimizer " + std::to_string(number) + ")");
        }
        h.state.optimizer = *kind;
    }
    if (v7) {
        const std::size_t record_bytes =
            v8 ? sizeof(ConfigRecord) : kConfigRecordV1Ints * sizeof(std::int32_t);
        h.record =
            config_record_of_bytes(in.take(record_bytes, "model configuration record"), name);
        const ModelConfig model = from_config_record(*h.record, name);  // its ranges
        h.state.lora.modules = lora_modules(model);
    }
    h.bytes = in.offset();
    if (h.bytes != (v1   ? kHeaderBytesV1
                    : v9 ? kHeaderBytesV9
                    : v8 ? kHeaderBytesV8
                    : v7 ? kHeaderBytesV7
                    : v6 ? kHeaderBytesV6
                    : v5 ? kHeaderBytesV5
                    : v4 ? kHeaderBytesV4
                    : v3 ? kHeaderBytesV3
                         : kHeaderBytesV2)) {
        throw std::logic_error("resume state header size mismatch");
    }
    return h;
}
}  // namespace

void save_resume_state(const std::filesystem::path& path, const ResumeState& state,
                       const ModelConfig& config, const OptimizerState& optimizer) {
    ByteWriter out;
    const bool lora = state.lora.config.rank > 0;
    const bool adamw = state.optimizer == OptimizerKind::AdamW;
    const bool record = !config.is_gpt2();
    if (lora && !adamw) throw std::logic_error("save_resume_state: LoRA trains with AdamW");
    for (const char c : record&& lora ? kStateMagicV9
                        : record      ? kStateMagicV8
                        : lora        ? kStateMagicV5
                        : adamw       ? kStateMagicV3
                                      : kStateMagicV6)
        out.put(c);
    out.put(state.step);
    out.put(state.seed);
    out.put(state.sequences_per_step);
    out.put(state.seq_len);
    out.put_array(to_shape_ints(config));
    out.put(static_cast<std::uint64_t>(optimizer.m.size()));
    out.put(optimizer.step);
    out.put_array(state.sample_rng);
    out.put(state.run_id);
    out.put(state.lr_decay_steps);
    put_window(out, state.loss_window);
    put_window(out, state.norm_window);
    if (lora) put_lora(out, state.lora);
    if (!adamw || record) out.put(static_cast<std::uint32_t>(state.optimizer));
    if (record) out.put_array(to_config_record(config));
    const std::span<const std::uint8_t> header(out.bytes());
    const auto m = bytes_of(optimizer.m.data(), optimizer.m.size() * sizeof(float));
    const auto v = bytes_of(optimizer.v.data(), optimizer.v.size() * sizeof(float));
    const std::uint64_t sum = checksum64(v, checksum64(m, checksum64(header)));
    const std::array pieces = {header, m, v, bytes_of(&sum, sizeof(sum))};
    write_file_atomically(path, pieces);
}

std::uintmax_t resume_state_file_bytes(std::size_t moment_floats, bool lora,
                                       OptimizerKind optimizer, bool gpt2) {
    return (!gpt2 && lora                       ? kHeaderBytesV9
            : !gpt2                             ? kHeaderBytesV8
            : lora                              ? kHeaderBytesV5
            : optimizer == OptimizerKind::AdamW ? kHeaderBytesV3
                                                : kHeaderBytesV6) +
           2 * moment_floats * sizeof(float) + sizeof(std::uint64_t);
}

ResumeState load_resume_state(const std::filesystem::path& path, const ModelConfig& config,
                              OptimizerState& optimizer) {
    const std::vector<std::uint8_t> bytes = read_file_bytes(path);
    const std::string name = path.string();
    const StateHeader h = parse_header(bytes, name);
    const std::size_t floats = optimizer.m.size() * sizeof(float);
    const std::size_t expected = h.bytes + 2 * floats + sizeof(std::uint64_t);
    const bool same_model = h.record ? *h.record == to_config_record(config)
                                     : config.is_gpt2() && h.config == to_shape_ints(config);
    if (!same_model || h.num_params != optimizer.m.size()) {
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
    const std::uint64_t sum =
        checksum64(all.subspan(h.bytes + floats, floats),
                   checksum64(all.subspan(h.bytes, floats), checksum64(all.first(h.bytes))));
    if (sum != stored) {
        throw InputError(name + ": checksum mismatch, the resume state is corrupt");
    }
    std::memcpy(optimizer.m.data(), bytes.data() + h.bytes, floats);
    std::memcpy(optimizer.v.data(), bytes.data() + h.bytes + floats, floats);
    optimizer.step = h.adam_step;
    return h.state;
}

void verify_resume_state(const std::filesystem::path& path) {
    const MappedFile file(path);
    const std::span<const std::uint8_t> bytes = file.bytes();
    const std::string name = path.string();
    const StateHeader h = parse_header(bytes, name);
    // More parameters than any file could hold is a damaged header, not a size to compute.
    if (h.num_params > (std::numeric_limits<std::uint64_t>::max() >> 4)) {
        throw InputError(name + ": damaged header (" + std::to_string(h.num_params) +
                         " parameters)");
    }
    const std::uint64_t expected =
        h.bytes + 2 * h.num_params * sizeof(float) + sizeof(std::uint64_t);
    if (bytes.size() != expected) {
        throw InputError(name + ": resume state has " + std::to_string(bytes.size()) +
                         " bytes, expected " + std::to_string(expected) + " for its " +
                         std::to_string(h.num_params) + " parameters (truncated or corrupt)");
    }
    // Chained over the three pieces the writer hashed, each piece's pages handed back once read.
    const std::size_t floats = h.num_params * sizeof(float);
    std::uint64_t sum = checksum64(bytes.first(h.bytes));
    for (const std::size_t start : {h.bytes, h.bytes + floats}) {
        Checksum64 piece_sum(sum);
        constexpr std::size_t kPiece = std::size_t{16} << 20;
        for (std::size_t at = 0; at < floats; at += kPiece) {
            const std::span<const std::uint8_t> piece =
                bytes.subspan(start + at, std::min(kPiece, floats - at));
            piece_sum.add(piece);
            file.release(piece);
        }
        sum = piece_sum.value();
    }
    std::uint64_t stored = 0;
    std::memcpy(&stored, bytes.data() + bytes.size() - sizeof(stored), sizeof(stored));
    if (sum != stored) throw InputError(name + ": checksum mismatch, the resume state is corrupt");
}

std::optional<std::uint64_t> read_run_id(const std::filesystem::path& path) {
    std::ifstream file(path, std::ios::binary);
    std::array<std::uint8_t, kLongestHeader> header{};
    file.read(reinterpret_cast<char*>(header.data()), header.size());
    try {
        const StateHeader h = parse_header(
            std::span<const std::uint8_t>(header.data(), static_cast<std::size_t>(file.gcount())),
            path.string());
        if (h.state.run_id == 0) return std::nullopt;
        return h.state.run_id;
    } catch (const InputError&) {
        return std::nullopt;
    }
}

std::optional<ResumeState> read_state_header(const std::filesystem::path& path) {
    std::ifstream file(path, std::ios::binary);
    std::array<std::uint8_t, kLongestHeader> header{};
    file.read(reinterpret_cast<char*>(header.data()), header.size());
    try {
        return parse_header(std::span<const std::uint8_t>(header.data(),
                                                          static_cast<std::size_t>(file.gcount())),
                            path.string())
            .state;
    } catch (const InputError&) {
        return std::nullopt;
    }
}

std::optional<std::int32_t> read_state_seq_len(const std::filesystem::path& path) {
    const std::optional<ResumeState> state = read_state_header(path);
    if (!state) return std::nullopt;
    return state->seq_len;
}

std::uint64_t lora_base_fingerprint(std::span<const float> base) {
    return checksum64(bytes_of(base.data(), base.size_bytes()));
}

bool is_resume_state_file(const std::filesystem::path& path) {
    std::array<char, 8> magic{};
    std::ifstream in(path, std::ios::binary);
    return in.read(magic.data(), magic.size()) &&
           (magic == kStateMagicV1 || magic == kStateMagicV2 || magic == kStateMagicV3 ||
            magic == kStateMagicV4 || magic == kStateMagicV5 || magic == kStateMagicV6 ||
            magic == kStateMagicV7 || magic == kStateMagicV8 || magic == kStateMagicV9);
}

std::filesystem::path model_path(const std::filesystem::path& dir, std::int64_t step) {
    char name[64];
    std::snprintf(name, sizeof(name), "model_%06lld.bin", static_cast<long long>(step));
    return dir / name;
}

std::filesystem::path adapter_path(const std::filesystem::path& dir, std::int64_t step) {
    return std::filesystem::path(model_path(dir, step)).replace_extension(".adapter");
}

std::filesystem::path state_path(const std::filesystem::path& dir, std::int64_t step) {
    char name[64];
    std::snprintf(name, sizeof(name), "state_%06lld.bin", static_cast<long long>(step));
    return dir / name;
}

namespace {
// "model" or "state", and the digits of NNN, for names of the form model_NNN.bin / state_NNN.bin.
std::optional<std::pair<std::string, std::string>> split_checkpoint_name(const std::string& name) {
    for (const char* kind : {"model", "state"}) {
        const std::string prefix = std::string(kind) + "_";
        if (!name.starts_with(prefix) || !name.ends_with(".bin")) continue;
        const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - 4);
        const bool all_digits =
            !digits.empty() &&
            std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (all_digits) return std::pair{std::string(kind), digits};
    }
    return std::nullopt;
}
}  // namespace

std::optional<std::int64_t> checkpoint_step(const std::filesystem::path& file) {
    const auto parts = split_checkpoint_name(file.filename().string());
    if (!parts) return std::nullopt;
    std::int64_t step = 0;
    const std::string& digits = parts->second;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
    if (error != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
    return step;
}

std::vector<std::int64_t> list_checkpoints(const std::filesystem::path& dir,
                                           std::vector<std::filesystem::path>* not_ours) {
    std::vector<std::int64_t> steps;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        const std::string name = entry.path().filename().string();
        const auto parts = split_checkpoint_name(name);
        if (!parts) continue;
        const auto step = checkpoint_step(entry.path());
        if (!step) {
            if (not_ours != nullptr) not_ours->push_back(entry.path());
            continue;
        }
        if (parts->first == "state" && std::filesystem::exists(model_path(dir, *step))) {
            steps.push_back(*step);
        }
    }
    std::sort(steps.rbegin(), steps.rend());
    return steps;
}

std::vector<std::string> checkpoint_file_names(const std::filesystem::path& dir) {
    std::vector<std::string> names;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        const std::string name = entry.path().filename().string();
        if (split_checkpoint_name(name)) names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    return names;
}

void prune_checkpoints(const std::filesystem::path& dir, int keep, std::uint64_t run_id,
                       std::int64_t saved) {
    if (keep <= 0) return;
    std::vector<std::int64_t> ours;
    for (const std::int64_t step : list_checkpoints(dir)) {
        if (step <= saved && read_run_id(state_path(dir, step)) == run_id) ours.push_back(step);
    }
    for (std::size_t i = static_cast<std::size_t>(keep); i < ours.size(); ++i) {
        std::error_code ec;
        // State first: a model without its state is ignored, never the reverse.
        std::filesystem::remove(state_path(dir, ours[i]), ec);
        std::filesystem::remove(model_path(dir, ours[i]), ec);
        std::filesystem::remove_all(adapter_path(dir, ours[i]), ec);
    }
}

}  // namespace gpt2
