#include "core/file_kinds.hpp"

#include <cstring>
#include <fstream>

namespace gpt2 {

std::optional<std::string> known_file_kind(std::string_view head) {
    const auto starts = [&](std::string_view magic) { return head.starts_with(magic); };
    if (starts("GGUF")) return "a GGUF file";
    if (starts("GPT2STA")) return "a train_gpt2 resume state (optimizer moments)";
    if (starts("PAR1")) return "a Parquet file";
    if (starts("PARE")) return "an encrypted Parquet file";
    if (starts("\x1f\x8b")) return "gzip-compressed data";
    if (starts("\x28\xb5\x2f\xfd")) return "zstd-compressed data";
    if (starts("PK\x03\x04")) return "a zip archive (a PyTorch .pt/.bin file is one)";
    if (head.size() >= 4) {
        std::int32_t magic = 0;
        std::memcpy(&magic, head.data(), 4);
        if (magic == kLlmcModelMagic) return "an llm.c model file";
        if (magic == kLlmcTokenizerMagic) return "llm.c's tokenizer file";
        if (magic == kLlmcShardMagic) return "an llm.c token shard";
        if (magic == kLlmcEvalMagic) return "llm.c's multiple-choice evaluation file (HellaSwag)";
    }
    // safetensors: a little-endian u64 header length, then its JSON object.
    if (head.size() >= 9 && head[8] == '{') return "a safetensors file";
    return std::nullopt;
}

std::string file_head(const std::string& path, std::size_t count) {
    std::ifstream in(path, std::ios::binary);
    std::string head(count, '\0');
    in.read(head.data(), static_cast<std::streamsize>(count));
    head.resize(static_cast<std::size_t>(std::max<std::streamsize>(in.gcount(), 0)));
    return head;
}

}  // namespace gpt2
