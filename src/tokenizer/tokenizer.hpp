// Tokenizers: text bytes <-> token ids behind one interface (char, trained byte-level BPE, GPT-2's
// BPE); each serializes to bytes so rank 0 can broadcast it and checkpoints can embed it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gpt2 {

enum class TokenizerKind : std::uint8_t { Char = 1, Bpe = 2, Gpt2 = 3 };

// How a byte-level BPE splits text before merging: GPT-2's regex, or first every numeric
// character on its own and then GPT-2's regex on what lies between (tokenizer.json's
// Sequence[Digits(individual_digits), ByteLevel]: SmolLM2's, llama.cpp's pre-tokenizer "smollm").
enum class PreTokenizer : std::uint8_t { Gpt2 = 0, DigitsThenGpt2 = 1 };
[[nodiscard]] std::string_view pre_tokenizer_name(PreTokenizer pre);  // "gpt-2", "digits, gpt-2"

// What a literal "<|endoftext|>" in the text becomes (bpe and gpt2; char has no end-of-text token).
// Token: the end-of-text token (tiktoken's encode(text, allowed_special="all")), so documents can
// be separated in plain text. Text: ordinary characters (tiktoken's encode_ordinary, as llm.c's
// data scripts encode documents), so user text can never inject the control token.
enum class EotInText { Token, Text };

class Tokenizer {
  public:
    virtual ~Tokenizer() = default;
    [[nodiscard]] virtual TokenizerKind kind() const = 0;
    [[nodiscard]] virtual int vocab_size() const = 0;
    // The end-of-text token, if the vocabulary has one (the char tokenizer has none).
    [[nodiscard]] virtual std::optional<int> eot_id() const = 0;
    [[nodiscard]] virtual std::vector<std::int32_t> encode(
        std::string_view text, EotInText eot = EotInText::Token) const = 0;
    [[nodiscard]] virtual std::string decode(std::span<const std::int32_t> ids) const = 0;
    // The raw bytes of one token (possibly a partial UTF-8 sequence): lets generation stream.
    [[nodiscard]] virtual std::string token_bytes(int id) const = 0;
    // Self-describing bytes (kind tag first) that deserialize_tokenizer() turns back into an equal
    // tokenizer.
    [[nodiscard]] virtual std::vector<std::uint8_t> serialize() const = 0;
    // How gpt2's kind of BPE splits text before merging (GPT-2's regex for the others).
    [[nodiscard]] virtual PreTokenizer pre_tokenizer() const { return PreTokenizer::Gpt2; }
};

[[nodiscard]] std::string_view tokenizer_kind_name(TokenizerKind kind);
// The kinds by the names the programs' --tokenizer flags take (char, bpe, gpt2): the one place a
// name becomes a kind (the programs hand it to their command-line parser).
[[nodiscard]] std::map<std::string, TokenizerKind> tokenizer_kinds_by_name();

// The sorted set of bytes that occur in the corpus (65 symbols for tinyshakespeare).
[[nodiscard]] std::unique_ptr<Tokenizer> make_char_tokenizer(std::string_view corpus);
// Byte-level BPE trained on the corpus: 256 byte tokens + merges + <|endoftext|> = vocab_size.
[[nodiscard]] std::unique_ptr<Tokenizer> train_bpe_tokenizer(std::string_view corpus,
                                                             int vocab_size);
// The size of GPT-2's vocabulary (50000 merges, 256 bytes, <|endoftext|>): a model file of this
// vocabulary without a tokenizer is taken to be GPT-2's.
inline constexpr int kGpt2VocabSize = 50257;

// GPT-2's tokenizer from encoder.json and vocab.bpe in dir, or from Hugging Face's vocab.json and
// merges.txt (the same data) where dir has no encoder.json.
[[nodiscard]] std::unique_ptr<Tokenizer> load_gpt2_tokenizer(const std::filesystem::path& dir);
// The tokenizer those files spell (what a Hugging Face directory carries): GPT-2's kind of BPE as
// load_gpt2_tokenizer reads it, splitting text as `pre` says, or, for files without <|endoftext|>
// and without merges whose tokens are single bytes in byte order (how a char tokenizer is
// exported), that char tokenizer.
[[nodiscard]] std::unique_ptr<Tokenizer> load_spelled_tokenizer(
    const std::filesystem::path& dir, PreTokenizer pre = PreTokenizer::Gpt2);

// A byte-level BPE as GPT-2's files, Hugging Face and GGUF spell it: each token's bytes in GPT-2's
// printable alphabet (<|endoftext|> as itself), indexed by id, and the merges by rank as
// "left right". Exact: a tokenizer loaded from these spellings encodes every text the same.
struct SpelledBpe {
    std::vector<std::string> tokens;
    std::vector<std::string> merges;
    std::optional<int> eot_id;  // none for a char tokenizer
    PreTokenizer pre = PreTokenizer::Gpt2;
};
// For gpt2 and trained bpe tokenizers, and for a char tokenizer, which is a byte-level BPE without
// merges or end-of-text (each of its tokens is one byte: any text of its alphabet splits into the
// same ids whatever the pre-tokenizer does). InputError saying why for a trained bpe in which two
// merges make the same bytes (spellings cannot tell such tokens apart).
[[nodiscard]] SpelledBpe spell_byte_level_bpe(const Tokenizer& tokenizer);
// Its inverse, for a tokenizer embedded as spellings (a GGUF file's tokenizer.ggml.tokens and
// merges): GPT-2's kind of BPE, or a char tokenizer when there is neither an end-of-text token
// nor a merge and every token is one byte in byte order. InputError naming `source` otherwise.
[[nodiscard]] std::unique_ptr<Tokenizer> tokenizer_from_spelling(const SpelledBpe& spelled,
                                                                 const std::string& source);
[[nodiscard]] std::unique_ptr<Tokenizer> deserialize_tokenizer(std::span<const std::uint8_t> bytes);
// Each token id's length in bytes of text, 0 for the end-of-text token (it spells no text): what
// bits per byte divides by.
[[nodiscard]] std::vector<std::int32_t> text_bytes_per_token(const Tokenizer& tokenizer);

// Conventions of the implementations:
// - char: the alphabet is the sorted set of corpus BYTES (not code points); no EOT; encoding a byte
//   outside the alphabet throws InputError naming the byte.
// - bpe and gpt2 pre-tokenize with GPT-2's regex (PCRE2, UTF + UCP); gpt2 with DigitsThenGpt2
//   first splits off every \p{N} character. Invalid UTF-8 matches no pattern item: each run of it
//   becomes a pre-token of its own, so any byte string round-trips.
// - bpe and gpt2 encode the literal text <|endoftext|> as the EOT token by default (like tiktoken's
//   encode(text, allowed_special="all")), or as ordinary text with EotInText::Text (like
//   encode_ordinary), and decode EOT back to that text.
//   bpe training treats it as a document separator. bpe's EOT is its last id; gpt2's is 50256.
// - bpe training picks the most frequent pair, ties broken by the smallest (left id, right id);
//   it stops early (a smaller vocabulary) if no pair is left to merge.
// - encode() is const and thread-safe.

// The one pool that encodes on several threads: out[i] = tokenizer.encode(texts[i], eot) for every
// i (with `wanted`, only where wanted[i]; the others are left empty), on up to `threads` threads,
// the calling one among them. The first exception a text throws stops the others and is rethrown.
// on_progress, if set, is called on the calling thread with the bytes of the texts encoded so far.
void encode_texts(const Tokenizer& tokenizer, std::span<const std::string_view> texts,
                  std::vector<std::vector<std::int32_t>>& out, int threads, EotInText eot,
                  std::span<const bool> wanted = {},
                  const std::function<void(std::size_t bytes_done)>& on_progress = {});

// Encodes text as a sequence of independently encoded blocks (cut only where the pre-tokenizer
// always splits, so the result equals tokenizer.encode(text)), on up to `threads` threads.
// on_progress, if set, is called on the calling thread with the number of bytes encoded so far.
[[nodiscard]] std::vector<std::int32_t> encode_blocks(
    const Tokenizer& tokenizer, std::string_view text, int threads,
    const std::function<void(std::size_t bytes_done)>& on_progress = {},
    EotInText eot = EotInText::Token);

// Whether text may be cut before position p (0 < p < text.size()) without changing the tokens of
// any of these tokenizers: the cut points encode_blocks uses, so pieces of a long text can be
// encoded separately.
[[nodiscard]] bool is_safe_cut(std::string_view text, std::size_t p);

// "token" or "text" (the --eot-in-text flag's words) to the enum; InputError otherwise.
[[nodiscard]] EotInText parse_eot_in_text(std::string_view word);

// llm.c's decode-only tokenizer file (gpt2_tokenizer.bin): uint32 header[256] = {20240328, 2,
// vocab size, EOT id (0xFFFFFFFF when there is none)}, then per token a uint8 length and its bytes.
void write_llmc_tokenizer(const Tokenizer& tokenizer, const std::filesystem::path& path);
// The token byte strings of such a file, indexed by id.
[[nodiscard]] std::vector<std::string> read_llmc_tokenizer(const std::filesystem::path& path);

}  // namespace gpt2
