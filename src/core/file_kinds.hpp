// What a file is, judged by its first bytes: the magic numbers of the file formats the programs
// read and write, named once, so that a program given the wrong kind of file says what it got.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gpt2 {

// The first int32 of llm.c's binary files (little-endian).
inline constexpr std::int32_t kLlmcModelMagic = 20240326;      // model file, and our checkpoints
inline constexpr std::int32_t kLlmcTokenizerMagic = 20240328;  // gpt2_tokenizer.bin
inline constexpr std::int32_t kLlmcShardMagic = 20240520;      // token shards
inline constexpr std::int32_t kLlmcEvalMagic = 20240522;       // multiple-choice (HellaSwag)

// What the bytes a file starts with (`head`: its first bytes, 8 or more where it has them) make
// it, in a few words ("an llm.c token shard", "a train_gpt2 resume state", "a GGUF file",
// "gzip-compressed data", ...), or nothing for bytes of no format named here.
[[nodiscard]] std::optional<std::string> known_file_kind(std::string_view head);

// The first bytes of `path` (up to `count`; fewer, or none, when it is shorter or unreadable).
[[nodiscard]] std::string file_head(const std::string& path, std::size_t count = 64);

}  // namespace gpt2
