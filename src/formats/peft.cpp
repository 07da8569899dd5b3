#include "formats/peft.hpp"

#include <nlohmann/json.hpp>

#include <array>
#include <charconv>
#include <map>
#include <vector>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "formats/safetensors.hpp"

namespace gpt2 {

using nlohmann::json;

namespace {
constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kWeightsFile = "adapter_model.safetensors";

// The double a float's shortest decimal reads as (0.1f as 0.1, not 0.10000000149011612), so that
// adapter_config.json says the rate the user gave.
double json_decimal(float value) {
    std::array<char, 32> text{};
    const auto written = std::to_chars(text.data(), text.data() + text.size(), value);
    double parsed = 0.0;
    std::from_chars(text.data(), written.ptr, parsed);
    return parsed;
}
}  // namespace

std::string peft_tensor_name(int l, LoraTarget t, bool b_matrix) {
    const bool gpt2 = offers(LoraModules{}, t);
    return std::string(gpt2 ? "base_model.model.transformer.h."
                            : "base_model.model.model.layers.") +
           std::to_string(l) + "." + std::string(lora_target_module(t)) +
           (b_matrix ? ".lora_B.weight" : ".lora_A.weight");
}

std::filesystem::path write_peft_adapter(const std::filesystem::path& dir,
                                         const LoraAdapter& adapter,
                                         const std::string& base_model) {
    std::error_code error;
    std::filesystem::create_directories(dir, error);
    if (error) throw InputError(dir.string() + ": cannot create the directory: " + error.message());
    const LoraConfig& c = adapter.config;
    // PEFT's LoraConfig: GPT-2's Conv1D weights are stored (in, out) (fan_in_fan_out), the Llama
    // family's nn.Linear (out, in).
    const json config = {{"peft_type", "LORA"},
                         {"task_type", "CAUSAL_LM"},
                         {"base_model_name_or_path", base_model},
                         {"r", c.rank},
                         {"lora_alpha", c.alpha},
                         {"lora_dropout", json_decimal(c.dropout)},
                         {"target_modules", lora_target_modules(c.targets)},
                         {"fan_in_fan_out", !lora_modules(adapter.layout.model()).llama},
                         {"bias", "none"},
                         {"use_rslora", false},
                         {"use_dora", false},
                         {"inference_mode", true},
                         {"modules_to_save", nullptr}};
    std::vector<SafetensorsOutput> tensors;
    for (int l = 0; l < adapter.layout.num_layers(); ++l) {
        for (int i = 0; i < kLoraTargets; ++i) {
            const auto t = static_cast<LoraTarget>(i);
            if (!c.adapts(t)) continue;
            const ProductShape s = lora_product_shape(adapter.layout.model(), t);
            for (const bool b_matrix : {false, true}) {
                SafetensorsOutput out;
                out.name = peft_tensor_name(l, t, b_matrix);
                out.type = ElementType::F32;
                out.shape = b_matrix ? std::vector<std::int64_t>{s.out, c.rank}
                                     : std::vector<std::int64_t>{c.rank, s.in};
                const std::size_t offset =
                    b_matrix ? adapter.layout.b_offset(l, t) : adapter.layout.a_offset(l, t);
                const std::size_t count =
                    b_matrix ? adapter.layout.b_floats(t) : adapter.layout.a_floats(t);
                append_elements(out.bytes, adapter.params.span().subspan(offset, count),
                                ElementType::F32);
                tensors.push_back(std::move(out));
            }
        }
    }
    write_safetensors(dir / kWeightsFile, tensors, {{"format", "pt"}});
    const std::string text = config.dump(2) + "\n";
    write_file_atomically(
        dir / kConfigFile,
        std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
    return dir;
}

namespace {
// The targets PEFT's target_modules select among the model's projections: a list of names (each
// matches a module equal to it or ending in "." + it, as PEFT matches a list) or "all-linear"
// (every projection of the blocks, the head excepted, as PEFT's shorthand selects).
std::array<bool, kLoraTargets> targets_of(const json& modules, const std::string& where,
                                          const LoraModules& offered) {
    if (modules.is_string() && modules.get<std::string>() == "all-linear") {
        return parse_lora_targets("all", "", offered);
    }
    if (!modules.is_array()) {
        throw InputError(where +
                         ": key 'target_modules' must be a list of module names or "
                         "\"all-linear\" (a regular expression is not read)");
    }
    std::string list;
    for (const json& name : modules) {
        if (!name.is_string()) throw InputError(where + ": 'target_modules' holds a non-string");
        if (!list.empty()) list += ',';
        list += name.get<std::string>();
    }
    if (list.empty()) throw InputError(where + ": key 'target_modules' is empty");
    return parse_lora_targets(list, where + ": target module", offered);
}
}  // namespace

std::unique_ptr<LoraAdapter> read_peft_adapter(const std::filesystem::path& dir,
                                               const ModelConfig& model) {
    const std::string config_path = (dir / kConfigFile).string();
    json config;
    try {
        config = json::parse(read_text_file(dir / kConfigFile));
    } catch (const json::exception& e) {
        throw InputError(config_path + ": not JSON (" + std::string(e.what()) + ")");
    }
    if (!config.is_object()) throw InputError(config_path + ": not a JSON object");
    const auto need = [&](const char* key) -> const json& {
        if (!config.contains(key)) throw InputError(config_path + ": key '" + key + "' missing");
        return config.at(key);
    };
    if (config.value("peft_type", std::string("LORA")) != "LORA") {
        throw InputError(config_path + ": key 'peft_type' is not LORA");
    }
    for (const char* unsupported : {"use_dora", "use_rslora"}) {
        if (config.value(unsupported, false)) {
            throw InputError(config_path + ": key '" + unsupported + "' is not supported");
        }
    }
    if (config.value("bias", std::string("none")) != "none") {
        throw InputError(config_path +
                         ": key 'bias' must be \"none\" (trained biases are not supported)");
    }
    for (const char* pattern : {"rank_pattern", "alpha_pattern"}) {
        if (config.contains(pattern) && !config.at(pattern).is_null() &&
            !config.at(pattern).empty()) {
            throw InputError(config_path + ": key '" + pattern + "' is not supported");
        }
    }
    LoraConfig c;
    if (!need("r").is_number_integer())
        throw InputError(config_path + ": key 'r' must be an integer");
    if (!need("lora_alpha").is_number()) {
        throw InputError(config_path + ": key 'lora_alpha' must be a number");
    }
    c.rank = need("r").get<int>();
    c.alpha = need("lora_alpha").get<float>();
    c.targets = targets_of(need("target_modules"), config_path, lora_modules(model));
    // PEFT transposes the update of a fan_in_fan_out adapter: right for GPT-2's Conv1D (which PEFT
    // sets itself), another model for nn.Linear's (out, in) weights.
    if (lora_modules(model).llama && config.value("fan_in_fan_out", false)) {
        throw InputError(config_path +
                         ": key 'fan_in_fan_out' is true, but this model's projections are "
                         "nn.Linear's (out, in): PEFT would add the transposed update");
    }
    validate_lora(c, config_path);

    const SafetensorsFile file = SafetensorsFile::read(dir / kWeightsFile);
    auto adapter = std::make_unique<LoraAdapter>(model, c);
    std::size_t used = 0;
    for (int l = 0; l < model.num_layers; ++l) {
        for (int i = 0; i < kLoraTargets; ++i) {
            const auto t = static_cast<LoraTarget>(i);
            if (!c.adapts(t)) continue;
            const ProductShape s = lora_product_shape(model, t);
            for (const bool b_matrix : {false, true}) {
                const std::string name = peft_tensor_name(l, t, b_matrix);
                const SafetensorsTensor* tensor = file.find(name);
                if (tensor == nullptr)
                    throw InputError(file.name() + ": tensor '" + name + "' missing");
                const std::vector<std::int64_t> shape =
                    b_matrix ? std::vector<std::int64_t>{s.out, c.rank}
                             : std::vector<std::int64_t>{c.rank, s.in};
                if (tensor->shape != shape || !tensor->type) {
                    throw InputError(file.name() + ": tensor '" + name + "' is not " +
                                     std::to_string(shape[0]) + " x " + std::to_string(shape[1]) +
                                     " of F32, F16 or BF16");
                }
                const std::size_t offset =
                    b_matrix ? adapter->layout.b_offset(l, t) : adapter->layout.a_offset(l, t);
                const std::size_t count =
                    b_matrix ? adapter->layout.b_floats(t) : adapter->layout.a_floats(t);
                read_elements(adapter->params.span().subspan(offset, count), tensor->bytes,
                              *tensor->type);
                ++used;
            }
        }
    }
    if (used != file.tensors().size()) {
        for (const SafetensorsTensor& tensor : file.tensors()) {
            bool known = false;
            for (int l = 0; l < model.num_layers && !known; ++l)
                for (int i = 0; i < kLoraTargets && !known; ++i)
                    for (const bool b : {false, true})
                        known = known ||
                                (c.adapts(static_cast<LoraTarget>(i)) &&
                                 tensor.name == peft_tensor_name(l, static_cast<LoraTarget>(i), b));
            if (!known) {
                throw InputError(file.name() + ": tensor '" + tensor.name +
                                 "' belongs to no adapted projection of this " +
                                 std::to_string(model.num_layers) + "-layer model");
            }
        }
    }
    return adapter;
}

}  // namespace gpt2
