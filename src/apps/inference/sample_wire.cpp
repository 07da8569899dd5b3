#include "apps/inference/sample_wire.hpp"

namespace gpt2::inference {

void serialize(const Sample& s, ByteWriter& out) {
    out.put(s.index);
    out.put(s.stats.prompt_tokens);
    out.put(s.stats.generated_tokens);
    out.put(s.stats.slides);
    out.put(s.stats.prefill_seconds);
    out.put(s.stats.generate_seconds);
    out.put(static_cast<std::uint64_t>(s.text.size()));
    out.raw(s.text);
}

std::vector<Sample> deserialize_samples(std::span<const std::uint8_t> bytes) {
    std::vector<Sample> samples;
    ByteReader in(bytes, "inference: sample message");
    while (in.remaining() > 0) {
        Sample s;
        s.index = in.get<std::uint32_t>("index");
        s.stats.prompt_tokens = in.get<int>("prompt tokens");
        s.stats.generated_tokens = in.get<int>("generated tokens");
        s.stats.slides = in.get<int>("slides");
        s.stats.prefill_seconds = in.get<double>("prefill seconds");
        s.stats.generate_seconds = in.get<double>("generate seconds");
        const auto size = in.get<std::uint64_t>("text size");
        if (size > in.remaining()) in.fail("short sample message");
        s.text = std::string(in.raw(static_cast<std::size_t>(size), "text"));
        samples.push_back(std::move(s));
    }
    return samples;
}

}  // namespace gpt2::inference
