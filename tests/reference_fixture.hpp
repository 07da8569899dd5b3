// Reader for tests/data/gpt2_reference.bin, written by dev/make_reference.py.
// Format (little-endian): "GPT2REF1", uint32 count, then per record: uint32 name length, name,
// uint32 dtype (0 = float32, 1 = int32), uint32 ndim, int64 dims[ndim], raw C-order data.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/model.hpp"

namespace gpt2::test {

struct FixtureTensor {
    std::vector<std::int64_t> dims;
    std::vector<float> f32;         // filled when dtype is float32
    std::vector<std::int32_t> i32;  // filled when dtype is int32

    [[nodiscard]] std::int64_t numel() const {
        std::int64_t n = 1;
        for (const auto d : dims)
            n *= d;
        return n;
    }
};

class ReferenceFixture {
  public:
    [[nodiscard]] static ReferenceFixture load(const std::filesystem::path& path) {
        static_assert(std::endian::native == std::endian::little, "fixture is little-endian");
        std::ifstream in(path, std::ios::binary);
        const auto fail = [&](const std::string& what) {
            throw std::runtime_error("reference fixture " + path.string() + ": " + what);
        };
        if (!in) fail("cannot open");
        const auto file_size = std::filesystem::file_size(path);
        const auto read = [&](void* dst, std::streamsize bytes) {
            if (!in.read(static_cast<char*>(dst), bytes)) fail("truncated");
        };
        const auto u32 = [&] {
            std::uint32_t v = 0;
            read(&v, sizeof v);
            return v;
        };
        std::string magic(8, '\0');
        read(magic.data(), 8);
        if (magic != "GPT2REF1") fail("bad magic");

        ReferenceFixture fixture;
        const std::uint32_t count = u32();
        for (std::uint32_t r = 0; r < count; ++r) {
            const std::uint32_t name_len = u32();
            if (name_len > 256) fail("bad record name length");
            std::string name(name_len, '\0');
            read(name.data(), name_len);
            const std::uint32_t dtype = u32();
            if (dtype > 1) fail("record '" + name + "' has unknown dtype");
            FixtureTensor t;
            t.dims.resize(u32());
            if (t.dims.size() > 8) fail("record '" + name + "' has too many dims");
            read(t.dims.data(), static_cast<std::streamsize>(t.dims.size() * sizeof(std::int64_t)));
            // Bound the element count by the bytes left so corrupt dims cannot allocate wildly.
            const auto left =
                static_cast<std::int64_t>(file_size) - static_cast<std::int64_t>(in.tellg());
            std::int64_t n = 1;
            for (const auto d : t.dims) {
                if (d < 0 || (d > 0 && n > left / 4 / d)) fail("record '" + name + "' truncated");
                n *= d;
            }
            if (dtype == 0) {
                t.f32.resize(static_cast<std::size_t>(n));
                read(t.f32.data(), n * 4);
            } else {
                t.i32.resize(static_cast<std::size_t>(n));
                read(t.i32.data(), n * 4);
            }
            if (!fixture.records_.emplace(std::move(name), std::move(t)).second) {
                fail("duplicate record");
            }
        }
        if (in.peek() != std::char_traits<char>::eof()) fail("trailing bytes");
        fixture.path_ = path;
        return fixture;
    }

    [[nodiscard]] const FixtureTensor& at(std::string_view name) const {
        const auto it = records_.find(name);
        if (it == records_.end()) {
            throw std::runtime_error("reference fixture " + path_.string() + ": no record '" +
                                     std::string(name) + "'");
        }
        return it->second;
    }

    [[nodiscard]] bool has(std::string_view name) const { return records_.contains(name); }

  private:
    std::filesystem::path path_;
    std::map<std::string, FixtureTensor, std::less<>> records_;
};

// The fixture's model shape (its "config" record: maxT V Vp L NH C, then B T).
[[nodiscard]] inline ModelConfig fixture_config(const ReferenceFixture& fixture) {
    const auto& cfg = fixture.at("config").i32;
    return ModelConfig{cfg[0], cfg[1], cfg[2], cfg[3], cfg[4], cfg[5]};
}

// A model holding the fixture's "params".
[[nodiscard]] inline Model fixture_model(const ReferenceFixture& fixture) {
    Model model(fixture_config(fixture));
    const auto& params = fixture.at("params").f32;
    if (params.size() != model.params.size()) {
        throw std::runtime_error("reference fixture: params do not fit its config");
    }
    std::copy(params.begin(), params.end(), model.params.data());
    return model;
}

}  // namespace gpt2::test
