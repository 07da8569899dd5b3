// What the GGUF tests share (test_gguf, test_lora_export): a GGUF reader written from the format's
// description, and llama.cpp itself run on jobs (tests/llama_cpp_check.mjs).
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/file_io.hpp"
#include "formats/element_type.hpp"
#include "formats/gguf.hpp"
#include "formats_support.hpp"

namespace gpt2::formats_test {

inline const std::string kLlamaCheck = std::string(GPT2_SOURCE_DIR) + "/tests/llama_cpp_check.mjs";

// llama.cpp's own quantizer (llama_model_quantize, llama-quantize's function, in node-llama-cpp's
// libllama) turning GGUF `in` into a Q8_0 GGUF `out`: a file llama.cpp's tooling wrote. Returns
// whether it did. The parameters are taken from llama_model_quantize_default_params (returned by
// value into room to spare), of which only the first two fields are set: nthread and ftype
// (LLAMA_FTYPE_MOSTLY_Q8_0 = 7), which lead llama_model_quantize_params in every llama.cpp.
inline bool llama_quantize_q8_0(const fs::path& library, const fs::path& in, const fs::path& out) {
    struct Params {
        unsigned char bytes[512];
    };
    void* lib = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
        ADD_FAILURE() << "dlopen " << library << ": " << ::dlerror();
        return false;
    }
    const auto init = reinterpret_cast<void (*)()>(::dlsym(lib, "llama_backend_init"));
    const auto defaults =
        reinterpret_cast<Params (*)()>(::dlsym(lib, "llama_model_quantize_default_params"));
    const auto quantize =
        reinterpret_cast<std::uint32_t (*)(const char*, const char*, const Params*)>(
            ::dlsym(lib, "llama_model_quantize"));
    if (init == nullptr || defaults == nullptr || quantize == nullptr) {
        ADD_FAILURE() << library << " lacks llama_model_quantize";
        return false;
    }
    // Its log (every tensor it converts) stays out of the test's output.
    using LogCallback = void (*)(int, const char*, void*);
    if (const auto log_set =
            reinterpret_cast<void (*)(LogCallback, void*)>(::dlsym(lib, "llama_log_set"))) {
        log_set([](int, const char*, void*) {}, nullptr);
    }
    init();
    Params params = defaults();
    const std::int32_t threads = 1, q8_0 = 7;
    std::memcpy(params.bytes, &threads, 4);
    std::memcpy(params.bytes + 4, &q8_0, 4);
    return quantize(in.c_str(), out.c_str(), &params) == 0;
}

// A GGUF reader written from the format's description, for the structure tests.
struct GgufTensor {
    std::vector<std::uint64_t> ne;
    std::uint32_t type = 0;
    std::uint64_t offset = 0;
};
struct GgufFile {
    std::map<std::string, json> kv;  // scalars and string arrays
    std::map<std::string, GgufTensor> tensors;
    std::vector<std::uint8_t> bytes;
    std::size_t data = 0;
};

inline GgufFile read_gguf(const fs::path& path) {
    GgufFile f;
    f.bytes = read_file_bytes(path);
    std::size_t at = 0;
    const auto take = [&](std::size_t n) {
        if (at + n > f.bytes.size()) throw std::runtime_error("GGUF truncated");
        const std::uint8_t* p = f.bytes.data() + at;
        at += n;
        return p;
    };
    const auto u32 = [&] {
        std::uint32_t v;
        std::memcpy(&v, take(4), 4);
        return v;
    };
    const auto u64 = [&] {
        std::uint64_t v;
        std::memcpy(&v, take(8), 8);
        return v;
    };
    const auto str = [&] {
        const std::uint64_t n = u64();
        return std::string(reinterpret_cast<const char*>(take(n)), n);
    };
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(take(4)), 4), "GGUF");
    EXPECT_EQ(u32(), 3u);
    const std::uint64_t tensors = u64(), kvs = u64();
    std::function<json(std::uint32_t)> value = [&](std::uint32_t type) -> json {
        switch (type) {
            case 4:
                return u32();
            case 5: {
                std::int32_t v;
                std::memcpy(&v, take(4), 4);
                return v;
            }
            case 6: {
                float v;
                std::memcpy(&v, take(4), 4);
                return v;
            }
            case 7:
                return *take(1) != 0;
            case 8:
                return str();
            case 9: {
                const std::uint32_t element = u32();
                const std::uint64_t n = u64();
                json array = json::array();
                for (std::uint64_t i = 0; i < n; ++i)
                    array.push_back(value(element));
                return array;
            }
            default:
                throw std::runtime_error("GGUF value type " + std::to_string(type));
        }
    };
    for (std::uint64_t i = 0; i < kvs; ++i) {
        const std::string key = str();
        f.kv[key] = value(u32());
    }
    for (std::uint64_t i = 0; i < tensors; ++i) {
        const std::string name = str();
        GgufTensor t;
        const std::uint32_t dims = u32();
        for (std::uint32_t d = 0; d < dims; ++d)
            t.ne.push_back(u64());
        t.type = u32();
        t.offset = u64();
        EXPECT_EQ(t.offset % 32, 0u) << name;
        f.tensors[name] = t;
    }
    f.data = (at + 31) / 32 * 32;
    return f;
}

// An F32 tensor's values.
inline std::vector<float> gguf_floats(const GgufFile& f, const std::string& name) {
    const GgufTensor& t = f.tensors.at(name);
    if (t.type != 0) throw std::runtime_error(name + " is not F32");
    std::size_t count = 1;
    for (const std::uint64_t n : t.ne)
        count *= n;
    std::vector<float> values(count);
    std::memcpy(values.data(), f.bytes.data() + f.data + t.offset, count * 4);
    return values;
}

// Runs the jobs (see tests/llama_cpp_check.mjs) in one llama.cpp process; one id list per job.
inline std::vector<std::vector<std::int32_t>> llama(const fs::path& dir, const json& jobs) {
    const std::string text = jobs.dump();
    write_file_atomically(
        dir / "jobs.json",
        std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
    const auto r = run_command("node " + kLlamaCheck + " " + kLlamaModules.string() + " " +
                               (dir / "jobs.json").string());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const std::size_t results = r.output.rfind("[[");
    if (r.exit_code != 0 || results == std::string::npos) return {};
    return json::parse(r.output.substr(results)).get<std::vector<std::vector<std::int32_t>>>();
}

// Why llama.cpp's tests cannot run here, or empty when they can.
inline std::string llama_cpp_missing() {
    if (fs::exists(kLlamaModules / "node-llama-cpp")) return {};
    return "node-llama-cpp is not installed in " + kLlamaModules.string() +
           " (GPT2_WITH_LLAMA_CPP=1 scripts/setup.sh installs it)";
}

// What a GGUF file of `type` stores of `values`, read back: the values as that type rounds them.
inline std::vector<float> rounded_as(std::span<const float> values, GgufWeights type) {
    std::vector<std::uint8_t> bytes;
    std::vector<float> out(values.size());
    switch (type) {
        case GgufWeights::F32:
            return {values.begin(), values.end()};
        case GgufWeights::F16:
            append_elements(bytes, values, ElementType::F16);
            read_elements(out, bytes, ElementType::F16);
            return out;
        case GgufWeights::Bf16:
            append_elements(bytes, values, ElementType::Bf16);
            read_elements(out, bytes, ElementType::Bf16);
            return out;
        case GgufWeights::Q8_0:
            append_q8_0(bytes, values);
            for (std::size_t b = 0; b * 32 < values.size(); ++b) {
                std::uint16_t d_bits;
                std::memcpy(&d_bits, bytes.data() + b * 34, 2);
                for (std::size_t i = 0; i < 32; ++i)
                    out[b * 32 + i] =
                        half_to_float(d_bits) *
                        static_cast<float>(static_cast<std::int8_t>(bytes[b * 34 + 2 + i]));
            }
            return out;
    }
    return out;
}

}  // namespace gpt2::formats_test
