// Loads GPT-2's tokenizer from OpenAI's encoder.json (token string -> id) and vocab.bpe (merges by
// rank), or Hugging Face's vocab.json and merges.txt (the same data under other names), undoing
// GPT-2's byte-to-printable-character mapping so tokens become raw bytes (or, for a char
// tokenizer's export, the char tokenizer); and spells a byte-level BPE back in that form for the
// exporters.
#include <array>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "tokenizer/kinds.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {
namespace {

// GPT-2 spells every byte as a printable code point: bytes that are printable Latin-1 stand for
// themselves, the other 68 become U+0100.. in byte order. Indexed by code point (all < 0x200).
constexpr std::array<std::int16_t, 0x200> make_unicode_to_byte() {
    std::array<std::int16_t, 0x200> table{};
    for (auto& entry : table)
        entry = -1;
    int next_extra = 0x100;
    for (int byte = 0; byte < 256; ++byte) {
        const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
                               (byte >= 0xAE && byte <= 0xFF);
        table[printable ? byte : next_extra++] = static_cast<std::int16_t>(byte);
    }
    return table;
}
constexpr std::array<std::int16_t, 0x200> kUnicodeToByte = make_unicode_to_byte();

// The inverse: the code point that spells each byte.
constexpr std::array<std::uint16_t, 256> make_byte_to_unicode() {
    std::array<std::uint16_t, 256> table{};
    for (std::size_t code_point = 0; code_point < kUnicodeToByte.size(); ++code_point) {
        if (kUnicodeToByte[code_point] >= 0) {
            table[static_cast<std::size_t>(kUnicodeToByte[code_point])] =
                static_cast<std::uint16_t>(code_point);
        }
    }
    return table;
}
constexpr std::array<std::uint16_t, 256> kByteToUnicode = make_byte_to_unicode();

// Raw bytes in GPT-2's printable spelling (UTF-8; every code point is below U+0200).
[[nodiscard]] std::string map_token(std::string_view bytes) {
    std::string spelled;
    spelled.reserve(bytes.size() * 2);
    for (const char c : bytes) {
        const std::uint16_t code_point = kByteToUnicode[static_cast<unsigned char>(c)];
        if (code_point < 0x80) {
            spelled += static_cast<char>(code_point);
        } else {
            spelled += static_cast<char>(0xC0 | (code_point >> 6));
            spelled += static_cast<char>(0x80 | (code_point & 0x3F));
        }
    }
    return spelled;
}

// Decodes one of GPT-2's token spellings (UTF-8) back to the bytes it stands for.
[[nodiscard]] std::string unmap_token(std::string_view spelled, const std::string& where) {
    std::string bytes;
    bytes.reserve(spelled.size());
    for (std::size_t i = 0; i < spelled.size();) {
        const auto lead = static_cast<unsigned char>(spelled[i]);
        std::uint32_t code_point = lead;
        std::size_t length = 1;
        if (lead >= 0xC0 && lead < 0xE0 && i + 1 < spelled.size()) {
            code_point = ((lead & 0x1F) << 6) | (static_cast<unsigned char>(spelled[i + 1]) & 0x3F);
            length = 2;
        } else if (lead >= 0x80) {
            code_point = 0xFFFFFFFF;  // nothing GPT-2 uses needs more than two bytes
        }
        if (code_point >= kUnicodeToByte.size() || kUnicodeToByte[code_point] < 0) {
            throw InputError(where + ": token \"" + std::string(spelled) +
                             "\" uses a character outside GPT-2's byte alphabet");
        }
        bytes += static_cast<char>(kUnicodeToByte[code_point]);
        i += length;
    }
    return bytes;
}

// The file's text; a missing file says where GPT-2's tokenizer files come from.
[[nodiscard]] std::string read_tokenizer_file(const std::filesystem::path& path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
        throw InputError(path.string() +
                         ": cannot open GPT-2 tokenizer file (scripts/get_gpt2_tokenizer.sh "
                         "downloads encoder.json and vocab.bpe)");
    }
    return read_text_file(path);
}

// What GPT-2's two files hold: each token's raw bytes by id (<|endoftext|> as its text), the
// end-of-text id if there is one, and the merges by rank.
struct BpeFiles {
    std::filesystem::path encoder_path;
    std::vector<std::string> vocab;
    std::optional<int> eot_id;
    std::vector<std::pair<std::int32_t, std::int32_t>> merges;
};

BpeFiles read_bpe_files(const std::filesystem::path& dir) {
    // OpenAI's names first; Hugging Face's where only those exist.
    const bool hugging_face = !std::filesystem::exists(dir / "encoder.json") &&
                              std::filesystem::exists(dir / "vocab.json");
    BpeFiles files;
    files.encoder_path = dir / (hugging_face ? "vocab.json" : "encoder.json");
    const std::filesystem::path& encoder_path = files.encoder_path;
    const std::filesystem::path merges_path = dir / (hugging_face ? "merges.txt" : "vocab.bpe");
    const std::string encoder_text = read_tokenizer_file(encoder_path);
    const std::string merges_text = read_tokenizer_file(merges_path);

    nlohmann::json encoder;
    try {
        encoder = nlohmann::json::parse(encoder_text);
    } catch (const nlohmann::json::exception& e) {
        throw InputError(encoder_path.string() + ": invalid JSON: " + e.what());
    }
    if (!encoder.is_object() || encoder.empty()) {
        throw InputError(encoder_path.string() + ": expected a JSON object of token -> id");
    }
    const std::size_t vocab_size = encoder.size();
    std::vector<std::string>& vocab = files.vocab;
    vocab.resize(vocab_size);
    std::vector<bool> assigned(vocab_size, false);
    std::unordered_map<std::string_view, std::int32_t> id_of_spelling;
    id_of_spelling.reserve(vocab_size);
    for (const auto& [spelling, value] : encoder.items()) {
        if (!value.is_number_integer() || value.get<std::int64_t>() < 0 ||
            value.get<std::int64_t>() >= static_cast<std::int64_t>(vocab_size)) {
            throw InputError(encoder_path.string() + ": token \"" + spelling + "\" has id " +
                             value.dump() + ", expected 0.." + std::to_string(vocab_size - 1));
        }
        const auto id = value.get<std::int32_t>();
        if (assigned[id]) {
            throw InputError(encoder_path.string() + ": id " + std::to_string(id) +
                             " is used by two tokens");
        }
        assigned[id] = true;
        if (spelling == detail::kEndOfText) {
            files.eot_id = id;
            vocab[id] = spelling;
        } else {
            vocab[id] = unmap_token(spelling, encoder_path.string());
        }
        id_of_spelling.emplace(spelling, id);
    }

    std::size_t line_number = 0;
    for (std::size_t pos = 0; pos < merges_text.size();) {
        std::size_t end = merges_text.find('\n', pos);
        if (end == std::string::npos) end = merges_text.size();
        std::string_view line(merges_text.data() + pos, end - pos);
        pos = end + 1;
        ++line_number;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.empty() || (line_number == 1 && line.starts_with("#version"))) continue;
        const std::string where = merges_path.string() + ":" + std::to_string(line_number);
        const std::size_t space = line.find(' ');
        if (space == std::string_view::npos ||
            line.find(' ', space + 1) != std::string_view::npos) {
            throw InputError(where + ": expected two tokens separated by one space");
        }
        const auto lookup = [&](std::string_view spelling) {
            const auto it = id_of_spelling.find(spelling);
            if (it == id_of_spelling.end()) {
                throw InputError(where + ": \"" + std::string(spelling) + "\" is not a token in " +
                                 encoder_path.filename().string());
            }
            return it->second;
        };
        files.merges.emplace_back(lookup(line.substr(0, space)), lookup(line.substr(space + 1)));
    }
    return files;
}

std::unique_ptr<Tokenizer> make_gpt2_style(BpeFiles files, const std::filesystem::path& dir,
                                           PreTokenizer pre = PreTokenizer::Gpt2) {
    if (!files.eot_id)
        throw InputError(files.encoder_path.string() + ": has no <|endoftext|> token");
    try {
        return detail::make_gpt2_style_bpe(std::move(files.vocab), std::move(files.merges),
                                           *files.eot_id, pre);
    } catch (const InputError& e) {
        throw InputError(dir.string() + ": " + e.what());
    }
}

}  // namespace

std::unique_ptr<Tokenizer> load_gpt2_tokenizer(const std::filesystem::path& dir) {
    return make_gpt2_style(read_bpe_files(dir), dir);
}

namespace {

// GPT-2's kind of BPE when the files have an end-of-text token or merges; otherwise, when every
// token is one byte, the char tokenizer they spell (in byte order, as a char tokenizer exports).
std::unique_ptr<Tokenizer> spelled_tokenizer(BpeFiles files, const std::filesystem::path& source,
                                             PreTokenizer pre) {
    if (files.eot_id || !files.merges.empty())
        return make_gpt2_style(std::move(files), source, pre);
    std::string alphabet;
    for (std::size_t id = 0; id < files.vocab.size(); ++id) {
        if (files.vocab[id].size() != 1) {
            throw InputError(files.encoder_path.string() +
                             ": has no <|endoftext|> token, and is not a char tokenizer's "
                             "vocabulary either (token " +
                             std::to_string(id) + " is " + std::to_string(files.vocab[id].size()) +
                             " bytes, not one)");
        }
        alphabet += files.vocab[id];
    }
    return detail::make_char_from_alphabet(std::move(alphabet), files.encoder_path.string());
}

}  // namespace

std::unique_ptr<Tokenizer> load_spelled_tokenizer(const std::filesystem::path& dir,
                                                  PreTokenizer pre) {
    return spelled_tokenizer(read_bpe_files(dir), dir, pre);
}

std::unique_ptr<Tokenizer> tokenizer_from_spelling(const SpelledBpe& spelled,
                                                   const std::string& source) {
    BpeFiles files;
    files.encoder_path = source;
    files.vocab.reserve(spelled.tokens.size());
    std::unordered_map<std::string_view, std::int32_t> id_of_spelling;
    for (std::size_t id = 0; id < spelled.tokens.size(); ++id) {
        const std::string& spelling = spelled.tokens[id];
        if (spelling == detail::kEndOfText) {
            files.eot_id = static_cast<int>(id);
            files.vocab.push_back(spelling);
        } else {
            files.vocab.push_back(unmap_token(spelling, source));
        }
        if (!id_of_spelling.emplace(spelling, static_cast<std::int32_t>(id)).second) {
            throw InputError(source + ": token " + std::to_string(id) + " \"" + spelling +
                             "\" is spelled as an earlier one");
        }
    }
    for (std::size_t rank = 0; rank < spelled.merges.size(); ++rank) {
        const std::string& merge = spelled.merges[rank];
        const std::size_t space = merge.find(' ');
        const auto lookup = [&](std::string_view spelling) {
            const auto it = id_of_spelling.find(spelling);
            if (it == id_of_spelling.end()) {
                throw InputError(source + ": merge " + std::to_string(rank) + " \"" + merge +
                                 "\": \"" + std::string(spelling) + "\" is not a token");
            }
            return it->second;
        };
        if (space == std::string::npos || merge.find(' ', space + 1) != std::string::npos) {
            throw InputError(source + ": merge " + std::to_string(rank) + " \"" + merge +
                             "\" is not two tokens separated by one space");
        }
        files.merges.emplace_back(lookup(std::string_view(merge).substr(0, space)),
                                  lookup(std::string_view(merge).substr(space + 1)));
    }
    return spelled_tokenizer(std::move(files), source, spelled.pre);
}

SpelledBpe spell_byte_level_bpe(const Tokenizer& tokenizer) {
    const std::string_view kind = tokenizer_kind_name(tokenizer.kind());
    if (tokenizer.kind() == TokenizerKind::Char) {
        // Each token one byte, no merges, no end-of-text: the BPE's initial symbols are the
        // tokens, whatever pieces the pre-tokenizer cuts.
        SpelledBpe spelled;
        for (int id = 0; id < tokenizer.vocab_size(); ++id) {
            const std::string raw = tokenizer.token_bytes(id);
            if (raw.size() != 1) {
                throw InputError("char tokenizer: token " + std::to_string(id) + " \"" + raw +
                                 "\" is " + std::to_string(raw.size()) +
                                 " bytes; a byte-level BPE without merges has one-byte tokens");
            }
            spelled.tokens.push_back(map_token(raw));
        }
        return spelled;
    }
    // The serialized form holds the merges (and, for gpt2, the vocabulary): read them back.
    const std::vector<std::uint8_t> bytes = tokenizer.serialize();
    detail::ByteReader reader(bytes, std::string(kind) + " tokenizer");
    reader.skip(2, "kind tag and format version");
    if (tokenizer.kind() == TokenizerKind::Gpt2) {
        const std::uint32_t vocab_size = reader.count("vocabulary size", 4);
        reader.skip(4, "<|endoftext|> id");
        for (std::uint32_t id = 0; id < vocab_size; ++id)
            reader.skip(reader.count("token length", 1), "token bytes");
    }
    SpelledBpe spelled;
    spelled.eot_id = *tokenizer.eot_id();
    spelled.pre = tokenizer.pre_tokenizer();
    const int vocab_size = tokenizer.vocab_size();
    spelled.tokens.reserve(static_cast<std::size_t>(vocab_size));
    std::unordered_map<std::string, int> id_of;
    for (int id = 0; id < vocab_size; ++id) {
        const std::string raw = tokenizer.token_bytes(id);
        const std::string token = id == *spelled.eot_id ? raw : map_token(raw);
        if (const auto [it, fresh] = id_of.emplace(token, id); !fresh) {
            // A trained BPE may make the same bytes by two merges; by-spelling formats cannot.
            throw InputError(std::string(kind) + " tokenizer: tokens " +
                             std::to_string(it->second) + " and " + std::to_string(id) +
                             " are the same bytes, which a vocabulary of spellings cannot hold");
        }
        spelled.tokens.push_back(token);
    }
    const std::uint32_t num_merges = reader.count("merge count", 8);
    spelled.merges.reserve(num_merges);
    for (std::uint32_t rank = 0; rank < num_merges; ++rank) {
        const auto left = static_cast<int>(reader.u32("merge"));
        const auto right = static_cast<int>(reader.u32("merge"));
        spelled.merges.push_back(spelled.tokens[static_cast<std::size_t>(left)] + " " +
                                 spelled.tokens[static_cast<std::size_t>(right)]);
    }
    return spelled;
}

}  // namespace gpt2
