// Kind-independent tokenizer code: deserialization dispatch, block-parallel encoding and llm.c's
// gpt2_tokenizer.bin file.
#include <algorithm>
#include <array>
#include <atomic>
#include <exception>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <thread>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "tokenizer/kinds.hpp"
#include "tokenizer/tokenizer.hpp"

#include "core/file_kinds.hpp"

namespace gpt2 {
namespace detail {

std::string describe_id(long long id, int vocab_size) {
    return "token id " + std::to_string(id) + " is out of range for a vocabulary of " +
           std::to_string(vocab_size) + " tokens";
}

}  // namespace detail

std::map<std::string, TokenizerKind> tokenizer_kinds_by_name() {
    std::map<std::string, TokenizerKind> kinds;
    for (const TokenizerKind kind : {TokenizerKind::Char, TokenizerKind::Bpe, TokenizerKind::Gpt2})
        kinds.emplace(std::string(tokenizer_kind_name(kind)), kind);
    return kinds;
}

std::string_view pre_tokenizer_name(PreTokenizer pre) {
    return pre == PreTokenizer::DigitsThenGpt2 ? "digits, gpt-2" : "gpt-2";
}

std::string_view tokenizer_kind_name(TokenizerKind kind) {
    switch (kind) {
        case TokenizerKind::Char:
            return "char";
        case TokenizerKind::Bpe:
            return "bpe";
        case TokenizerKind::Gpt2:
            return "gpt2";
    }
    return "unknown";
}

std::unique_ptr<Tokenizer> deserialize_tokenizer(std::span<const std::uint8_t> bytes) {
    detail::ByteReader reader(bytes, "serialized tokenizer");
    const std::uint8_t tag = reader.u8("kind tag");
    const std::uint8_t version = reader.u8("format version");
    if (version != detail::kSerialFormatVersion && version != detail::kSerialFormatVersionPre) {
        reader.fail("unsupported format version " + std::to_string(version) + " (expected " +
                    std::to_string(detail::kSerialFormatVersion) + " or " +
                    std::to_string(detail::kSerialFormatVersionPre) + ")");
    }
    std::unique_ptr<Tokenizer> tokenizer;
    switch (tag) {
        case static_cast<std::uint8_t>(TokenizerKind::Char):
            if (version != detail::kSerialFormatVersion)
                reader.fail("a char tokenizer of version 2");
            tokenizer = detail::deserialize_char(reader);
            break;
        case static_cast<std::uint8_t>(TokenizerKind::Bpe):
            tokenizer = detail::deserialize_bpe(reader, TokenizerKind::Bpe, version);
            break;
        case static_cast<std::uint8_t>(TokenizerKind::Gpt2):
            tokenizer = detail::deserialize_bpe(reader, TokenizerKind::Gpt2, version);
            break;
        default:
            reader.fail("unknown tokenizer kind tag " + std::to_string(tag));
    }
    reader.expect_end();
    return tokenizer;
}

namespace {

// Cut points where the pre-tokenizer always splits, whatever follows or precedes the cut: "x\nY"
// with x and Y characters that are not whitespace (is_safe_cut). A lone '\n' between two such
// characters is its own pre-token both in the whole text and at the end of a block, and
// <|endoftext|> contains no '\n'. (A cut
// after a longer whitespace run would not be safe: "  \n" ends a block as one pre-token but is
// "  " + "\n" before a letter.) The char tokenizer has no pre-tokenizer, so any cut is safe.
[[nodiscard]] std::vector<std::size_t> block_cuts(std::string_view text, std::size_t block_size) {
    std::vector<std::size_t> cuts{0};
    std::size_t pos = block_size;
    while (pos < text.size()) {
        while (pos < text.size() && !is_safe_cut(text, pos)) {
            ++pos;
        }
        if (pos >= text.size()) break;
        cuts.push_back(pos);
        pos += block_size;
    }
    cuts.push_back(text.size());
    return cuts;
}

}  // namespace

namespace {
// The UTF-8 character occupying text[begin, end) as a code point, if it is one well-formed
// character (no overlong form, no surrogate).
std::optional<char32_t> code_point(std::string_view text, std::size_t begin, std::size_t end) {
    const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
    const std::size_t n = end - begin;
    const unsigned char lead = byte(begin);
    const std::size_t expected = lead < 0x80                   ? 1
                                 : lead >= 0xC2 && lead < 0xE0 ? 2
                                 : lead >= 0xE0 && lead < 0xF0 ? 3
                                 : lead >= 0xF0 && lead < 0xF5 ? 4
                                                               : 0;
    if (expected == 0 || expected != n) return std::nullopt;
    char32_t c = expected == 1 ? lead : lead & (0x7F >> expected);
    for (std::size_t i = begin + 1; i < end; ++i) {
        if ((byte(i) & 0xC0) != 0x80) return std::nullopt;
        c = (c << 6) | (byte(i) & 0x3F);
    }
    const char32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < smallest[expected] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return std::nullopt;
    return c;
}

// Characters that may belong to a run of whitespace for GPT-2's pre-tokenizer (PCRE2's \s with
// UCP), taken generously: controls, separators and the invisible spaces.
bool may_be_space(char32_t c) {
    return c <= 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0x1680 || c == 0x180E ||
           (c >= 0x2000 && c <= 0x200B) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000 || c == 0xFEFF;
}
}  // namespace

bool is_safe_cut(std::string_view text, std::size_t p) {
    // "X\nY" with X and Y characters that are not whitespace: the lone '\n' is a pre-token of its
    // own whatever surrounds the cut, and no pre-token reaches across it.
    if (p < 2 || p >= text.size() || text[p - 1] != '\n') return false;
    const auto continuation = [&](std::size_t i) {
        return (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80;
    };
    std::size_t before = p - 2;  // the first byte of the character ending at p - 2
    while (before > 0 && p - 2 - before < 3 && continuation(before))
        --before;
    std::size_t after = p + 1;  // one past the character starting at p
    while (after < text.size() && after - p < 4 && continuation(after))
        ++after;
    const auto x = code_point(text, before, p - 1);
    const auto y = code_point(text, p, after);
    return x && y && !may_be_space(*x) && !may_be_space(*y);
}

EotInText parse_eot_in_text(std::string_view word) {
    if (word == "token") return EotInText::Token;
    if (word == "text") return EotInText::Text;
    throw InputError("--eot-in-text must be token or text, not '" + std::string(word) + "'");
}

void encode_texts(const Tokenizer& tokenizer, std::span<const std::string_view> texts,
                  std::vector<std::vector<std::int32_t>>& out, int threads, EotInText eot,
                  std::span<const bool> wanted,
                  const std::function<void(std::size_t bytes_done)>& on_progress) {
    out.assign(texts.size(), {});
    std::atomic<std::size_t> next{0};
    std::atomic<std::size_t> bytes_done{0};
    std::atomic<bool> failed{false};
    std::exception_ptr error;
    const auto work = [&](bool reports) {
        for (std::size_t i; !failed && (i = next++) < texts.size();) {
            if (wanted.empty() || wanted[i]) {
                try {
                    out[i] = tokenizer.encode(texts[i], eot);
                } catch (...) {
                    if (!failed.exchange(true)) error = std::current_exception();
                }
            }
            const std::size_t done = bytes_done += texts[i].size();
            if (reports && on_progress) on_progress(done);
        }
    };
    const std::size_t helpers =
        std::min<std::size_t>(static_cast<std::size_t>(std::max(threads, 1)), texts.size());
    std::vector<std::jthread> pool;
    for (std::size_t t = 1; t < helpers; ++t)
        pool.emplace_back(work, false);
    work(true);
    pool.clear();  // joins
    if (error) std::rethrow_exception(error);
    // The calling thread's last report may come before a helper's last text: the total, once.
    if (on_progress && bytes_done != 0 && helpers > 1) on_progress(bytes_done);
}

std::vector<std::int32_t> encode_blocks(const Tokenizer& tokenizer, std::string_view text,
                                        int threads,
                                        const std::function<void(std::size_t)>& on_progress,
                                        EotInText eot) {
    constexpr std::size_t kBlockSize = std::size_t{1} << 20;
    const std::vector<std::size_t> cuts = block_cuts(text, kBlockSize);
    std::vector<std::string_view> blocks;
    for (std::size_t i = 0; i + 1 < cuts.size(); ++i)
        blocks.push_back(text.substr(cuts[i], cuts[i + 1] - cuts[i]));
    std::vector<std::vector<std::int32_t>> results;
    encode_texts(tokenizer, blocks, results, threads, eot, {}, on_progress);

    std::size_t total = 0;
    for (const auto& ids : results)
        total += ids.size();
    std::vector<std::int32_t> ids;
    ids.reserve(total);
    for (const auto& part : results)
        ids.insert(ids.end(), part.begin(), part.end());
    return ids;
}

namespace {

constexpr auto kLlmcTokenizerFileMagic = static_cast<std::uint32_t>(kLlmcTokenizerMagic);
constexpr std::uint32_t kLlmcTokenizerVersion = 2;
constexpr std::uint32_t kLlmcNoEot = 0xFFFFFFFF;
constexpr std::size_t kLlmcHeaderWords = 256;

}  // namespace

void write_llmc_tokenizer(const Tokenizer& tokenizer, const std::filesystem::path& path) {
    const int vocab_size = tokenizer.vocab_size();
    detail::ByteWriter out;
    std::array<std::uint32_t, kLlmcHeaderWords> header{};
    header[0] = kLlmcTokenizerFileMagic;
    header[1] = kLlmcTokenizerVersion;
    header[2] = static_cast<std::uint32_t>(vocab_size);
    header[3] = tokenizer.eot_id() ? static_cast<std::uint32_t>(*tokenizer.eot_id()) : kLlmcNoEot;
    for (const std::uint32_t word : header)
        out.u32(word);
    for (int id = 0; id < vocab_size; ++id) {
        const std::string bytes = tokenizer.token_bytes(id);
        // llm.c stores lengths in one byte and rejects empty tokens.
        if (bytes.empty() || bytes.size() > 255) {
            throw InputError(path.string() + ": token " + std::to_string(id) + " is " +
                             std::to_string(bytes.size()) +
                             " bytes long; llm.c's tokenizer format allows 1..255");
        }
        out.u8(static_cast<std::uint8_t>(bytes.size()));
        out.raw(bytes);
    }
    write_file_atomically(path, out.take());
}

std::vector<std::string> read_llmc_tokenizer(const std::filesystem::path& path) {
    const std::vector<std::uint8_t> bytes = read_file_bytes(path);

    detail::ByteReader reader(bytes, path.string());
    std::array<std::uint32_t, kLlmcHeaderWords> header{};
    for (std::uint32_t& word : header)
        word = reader.u32("header");
    if (header[0] != kLlmcTokenizerFileMagic) {
        reader.fail("bad magic " + std::to_string(header[0]) + " (expected " +
                    std::to_string(kLlmcTokenizerFileMagic) + "): not an llm.c tokenizer file");
    }
    // Version 1 is the same layout without an EOT id.
    if (header[1] != 1 && header[1] != kLlmcTokenizerVersion) {
        reader.fail("unsupported version " + std::to_string(header[1]) + " (expected 1 or 2)");
    }
    const std::uint32_t vocab_size = header[2];
    // Each token takes at least 2 bytes, so a corrupt size fails here instead of in reserve().
    if (vocab_size == 0 || vocab_size > (bytes.size() - kLlmcHeaderWords * 4) / 2) {
        reader.fail("vocab size " + std::to_string(vocab_size) + " does not fit the file size " +
                    std::to_string(bytes.size()));
    }
    if (header[1] == 2 && header[3] != kLlmcNoEot && header[3] >= vocab_size) {
        reader.fail("EOT id " + std::to_string(header[3]) + " is not below the vocab size " +
                    std::to_string(vocab_size));
    }
    std::vector<std::string> tokens;
    tokens.reserve(vocab_size);
    for (std::uint32_t id = 0; id < vocab_size; ++id) {
        const std::uint8_t length = reader.u8("token length");
        if (length == 0) reader.fail("token " + std::to_string(id) + " has length 0");
        tokens.emplace_back(reader.raw(length, "token bytes"));
    }
    reader.expect_end();
    return tokens;
}

std::vector<std::int32_t> text_bytes_per_token(const Tokenizer& tokenizer) {
    std::vector<std::int32_t> lengths(static_cast<std::size_t>(tokenizer.vocab_size()));
    for (int id = 0; id < tokenizer.vocab_size(); ++id) {
        lengths[static_cast<std::size_t>(id)] =
            id == tokenizer.eot_id() ? 0
                                     : static_cast<std::int32_t>(tokenizer.token_bytes(id).size());
    }
    return lengths;
}

}  // namespace gpt2
