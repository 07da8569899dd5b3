// The corpus's files: listing the inputs (directories, glob patterns) in their fixed order, each
// file's format, and refusing a text input whose bytes are binary (documents.hpp).
#include <fnmatch.h>
#include <glob.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "core/error.hpp"
#include "data/byte_source.hpp"
#include "data/documents.hpp"
#include "data/multiple_choice.hpp"
#include "data/shard.hpp"

namespace gpt2 {

namespace fs = std::filesystem;

namespace {

using detail::ByteSource;
using detail::Compression;
using detail::compression_of;

CorpusFormat format_of(const fs::path& path) {
    if (path.extension() == ".parquet") return CorpusFormat::Parquet;
    const fs::path inner = compression_of(path) == Compression::None ? path : path.stem();
    return inner.extension() == ".jsonl" ? CorpusFormat::JsonLines : CorpusFormat::Text;
}

// How much of a text input is looked at for a binary file's signature when the corpus is listed.
constexpr std::size_t kSniffBytes = 64;

std::int32_t le32_at(std::string_view bytes) {
    std::int32_t value = 0;
    std::memcpy(&value, bytes.data(), sizeof(value));
    return value;
}

// Refuses a text or JSON Lines file whose first (decompressed) bytes are binary.
void check_text(const CorpusFile& file) {
    if (file.format == CorpusFormat::Parquet || file.bytes == 0) return;
    ByteSource source(file.path, 4096);
    std::string head(kSniffBytes, '\0');
    std::size_t got = 0;
    try {
        for (std::size_t n;
             got < head.size() && (n = source.read(head.data() + got, head.size() - got)) > 0;)
            got += n;
    } catch (const InputError&) {
        return;  // corrupt compressed data: reading it says so, with the whole story
    }
    head.resize(got);
    if (const std::optional<std::string> what = binary_content(head))
        throw InputError(file.path.string() + ": " + *what);
}

CorpusFile corpus_file(const fs::path& path) {
    std::error_code ec;
    const std::uintmax_t bytes = fs::file_size(path, ec);
    if (ec) throw InputError(path.string() + ": " + ec.message());
    CorpusFile file{path, format_of(path), bytes};
    check_text(file);
    return file;
}

bool is_glob_pattern(const std::string& text) {
    return text.find_first_of("*?[") != std::string::npos;
}

// The paths a glob(3) pattern matches, sorted (none: empty).
std::vector<fs::path> glob_matches(const std::string& pattern, const std::string& flag) {
    glob_t matches{};
    const int rc = ::glob(pattern.c_str(), 0, nullptr, &matches);
    const std::unique_ptr<glob_t, decltype(&::globfree)> guard(&matches, &::globfree);
    if (rc != 0 && rc != GLOB_NOMATCH)
        throw InputError(flag + " '" + pattern + "': " +
                         (rc == GLOB_ABORTED ? "a directory could not be read" : "out of memory"));
    std::vector<fs::path> paths(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
    std::sort(paths.begin(), paths.end());
    return paths;
}

}  // namespace

std::optional<std::string> binary_content(std::string_view head) {
    const auto starts = [&](std::string_view magic) { return head.starts_with(magic); };
    if (starts("PAR1"))
        return "a Parquet file (it starts with PAR1), not text: Parquet is read from files named "
               "*.parquet";
    if (starts("PARE")) return "an encrypted Parquet file (it starts with PARE), not text";
    if (starts("\x1f\x8b"))
        return "gzip-compressed data, not text: name it .gz to have it decompressed";
    if (starts("\x28\xb5\x2f\xfd"))
        return "zstd-compressed data, not text: name it .zst to have it decompressed";
    if (starts("GGUF")) return "a GGUF model file, not text";
    if (starts("GPT2STA")) return "a train_gpt2 resume state file, not text";
    if (head.size() >= 4) {
        const std::int32_t magic = le32_at(head);
        if (magic == kShardMagic)
            return "an llm.c token shard (magic " + std::to_string(kShardMagic) +
                   "), not text: train on shards with --train-data";
        if (magic == kMultipleChoiceMagic)
            return "llm.c's multiple-choice evaluation file (magic " +
                   std::to_string(kMultipleChoiceMagic) + "), not text";
        // llm.c's model files and this project's checkpoints, and llm.c's tokenizer file.
        if (magic == kLlmcModelMagic) {
            return "a model checkpoint (llm.c's magic " + std::to_string(kLlmcModelMagic) +
                   "), not text";
        }
        if (magic == kLlmcTokenizerMagic) {
            return "llm.c's tokenizer file (magic " + std::to_string(kLlmcTokenizerMagic) +
                   "), not text";
        }
    }
    if (const std::size_t nul = head.find('\0'); nul != std::string_view::npos)
        return "binary data (a NUL byte at byte " + std::to_string(nul) + "), not text";
    return std::nullopt;
}

std::vector<CorpusFile> list_corpus_files(std::span<const fs::path> inputs, const std::string& glob,
                                          std::string_view input_flag) {
    const std::string flag(input_flag);
    std::vector<CorpusFile> files;
    std::vector<fs::path> expanded;
    for (const fs::path& input : inputs) {
        std::error_code ec;
        if (fs::exists(input, ec) || !is_glob_pattern(input.string())) {
            expanded.push_back(input);
            continue;
        }
        const std::vector<fs::path> matches = glob_matches(input.string(), flag);
        if (matches.empty())
            throw InputError(flag + " '" + input.string() + "': no files match the pattern");
        expanded.insert(expanded.end(), matches.begin(), matches.end());
    }
    for (const fs::path& input : expanded) {
        std::error_code ec;
        const fs::file_status status = fs::status(input, ec);
        if (ec || !fs::exists(status))
            throw InputError(flag + " " + input.string() + ": no such file or directory");
        if (!fs::is_directory(status)) {
            files.push_back(corpus_file(input));
            continue;
        }
        std::vector<fs::path> found;
        for (fs::recursive_directory_iterator it(input, ec), end; !ec && it != end;
             it.increment(ec)) {
            if (!it->is_regular_file()) continue;
            if (::fnmatch(glob.c_str(), it->path().filename().c_str(), 0) == 0)
                found.push_back(it->path());
        }
        if (ec) throw InputError(flag + " " + input.string() + ": " + ec.message());
        if (found.empty()) {
            throw InputError(flag + " " + input.string() + ": no files" +
                             (glob == "*" ? std::string() : " matching --glob '" + glob + "'"));
        }
        std::sort(found.begin(), found.end());
        for (const fs::path& path : found)
            files.push_back(corpus_file(path));
    }
    return files;
}

std::uint64_t uncompressed_bytes(const CorpusFile& file) {
    if (compression_of(file.path) == Compression::None) return file.bytes;
    ByteSource source(file.path);
    std::vector<char> buffer(detail::kReadChunk);
    std::uint64_t total = 0;
    for (std::size_t got; (got = source.read(buffer.data(), buffer.size())) > 0;)
        total += got;
    return total;
}

}  // namespace gpt2
