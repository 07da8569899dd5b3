// Byte-level BPE shared by the bpe and gpt2 kinds: merge-rank encoding over GPT-2's pre-tokens and
// validation of merge tables (the pre-tokenizer is in pretokenizer.hpp, training in
// bpe_training.cpp).
#include <algorithm>
#include <array>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <queue>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.hpp"
#include "tokenizer/kinds.hpp"
#include "tokenizer/pretokenizer.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {
namespace {

using namespace detail;  // the shared pieces of pretokenizer.hpp

// Scratch space for merging one piece, reused across pieces to avoid allocations.
struct MergeScratch {
    struct Candidate {
        std::int32_t rank;
        std::int32_t pos;
        std::int32_t left;
        std::int32_t right;
        [[nodiscard]] bool operator>(const Candidate& other) const {
            return rank != other.rank ? rank > other.rank : pos > other.pos;
        }
    };
    std::vector<std::int32_t> ids;
    std::vector<std::int32_t> next;
    std::vector<std::int32_t> prev;
    std::vector<Candidate> heap;
};

class BpeTokenizer final : public Tokenizer {
  public:
    // Arguments are validated by make_trained_bpe / make_gpt2_style_bpe.
    BpeTokenizer(TokenizerKind kind, std::vector<std::string> vocab, std::vector<Merge> merges,
                 std::vector<std::int32_t> merge_results, std::array<std::int32_t, 256> byte_ids,
                 int eot_id, PreTokenizer pre = PreTokenizer::Gpt2)
        : kind_(kind),
          pre_(pre),
          vocab_(std::move(vocab)),
          merges_(std::move(merges)),
          results_(std::move(merge_results)),
          byte_ids_(byte_ids),
          eot_id_(eot_id) {
        if (pre_ == PreTokenizer::DigitsThenGpt2) digits_.emplace(kDigitPattern);
        rank_of_.reserve(merges_.size());
        for (std::size_t rank = 0; rank < merges_.size(); ++rank) {
            rank_of_.emplace(pair_key(merges_[rank].first, merges_[rank].second),
                             static_cast<std::int32_t>(rank));
        }
        // A piece that is itself a token is usually encoded as that token; remember exactly the
        // tokens for which merging gives that answer, so the shortcut never changes a result.
        // (All of GPT-2's do; a trained BPE may hold two merges that spell the same bytes.)
        whole_tokens_.reserve(results_.size());
        MergeScratch scratch;
        std::vector<std::int32_t> ids;
        for (const std::int32_t id : results_) {
            ids.clear();
            merge_piece(vocab_[id], scratch, ids);
            if (ids.size() == 1 && ids[0] == id) whole_tokens_.emplace(vocab_[id], id);
        }
    }

    [[nodiscard]] TokenizerKind kind() const override { return kind_; }
    [[nodiscard]] PreTokenizer pre_tokenizer() const override { return pre_; }
    [[nodiscard]] int vocab_size() const override { return static_cast<int>(vocab_.size()); }
    [[nodiscard]] std::optional<int> eot_id() const override { return eot_id_; }

    [[nodiscard]] std::vector<std::int32_t> encode(std::string_view text,
                                                   EotInText eot) const override {
        std::vector<std::int32_t> out;
        out.reserve(text.size() / 3 + 16);
        PieceCache cache;
        MergeScratch scratch;
        const auto encode_ordinary = [&](std::string_view ordinary) {
            const auto gpt2_pieces = [&](std::string_view text) {
                pretokenizer_.split(text, [&](std::string_view piece) {
                    encode_piece(piece, cache, scratch, out);
                });
            };
            if (!digits_) {
                gpt2_pieces(ordinary);
                return;
            }
            // Every numeric character a piece of its own, GPT-2's pattern on the text between.
            digits_->scan(ordinary, [&](std::string_view piece, bool digit) {
                if (digit) {
                    encode_piece(piece, cache, scratch, out);
                } else {
                    gpt2_pieces(piece);
                }
            });
        };
        if (eot == EotInText::Text) {
            encode_ordinary(text);
        } else {
            split_end_of_text(text, encode_ordinary, [&] { out.push_back(eot_id_); });
        }
        return out;
    }

    [[nodiscard]] std::string decode(std::span<const std::int32_t> ids) const override {
        std::string text;
        for (const std::int32_t id : ids)
            text += vocab_[index(id)];
        return text;
    }

    [[nodiscard]] std::string token_bytes(int id) const override { return vocab_[index(id)]; }

    [[nodiscard]] std::vector<std::uint8_t> serialize() const override {
        detail::ByteWriter out;
        const bool gpt2_pattern = pre_ == PreTokenizer::Gpt2;
        out.u8(static_cast<std::uint8_t>(kind_));
        out.u8(gpt2_pattern ? detail::kSerialFormatVersion : detail::kSerialFormatVersionPre);
        if (kind_ == TokenizerKind::Gpt2) {
            out.u32(static_cast<std::uint32_t>(vocab_.size()));
            out.u32(static_cast<std::uint32_t>(eot_id_));
            for (const std::string& token : vocab_) {
                out.u32(static_cast<std::uint32_t>(token.size()));
                out.raw(token);
            }
        }
        out.u32(static_cast<std::uint32_t>(merges_.size()));
        for (const auto& [left, right] : merges_) {
            out.u32(static_cast<std::uint32_t>(left));
            out.u32(static_cast<std::uint32_t>(right));
        }
        if (!gpt2_pattern) out.u8(static_cast<std::uint8_t>(pre_));
        return out.take();
    }

  private:
    using PieceCache =
        std::unordered_map<std::string_view, std::vector<std::int32_t>, TransparentHash>;
    // Bounds the per-call cache when one call encodes a huge text.
    static constexpr std::size_t kMaxCachedPieces = std::size_t{1} << 18;

    [[nodiscard]] std::size_t index(std::int32_t id) const {
        if (id < 0 || static_cast<std::size_t>(id) >= vocab_.size()) {
            throw InputError(std::string(tokenizer_kind_name(kind_)) +
                             " tokenizer: " + detail::describe_id(id, vocab_size()));
        }
        return static_cast<std::size_t>(id);
    }

    void encode_piece(std::string_view piece, PieceCache& cache, MergeScratch& scratch,
                      std::vector<std::int32_t>& out) const {
        if (piece.size() == 1) {
            out.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
            return;
        }
        if (const auto it = whole_tokens_.find(piece); it != whole_tokens_.end()) {
            out.push_back(it->second);
            return;
        }
        if (const auto it = cache.find(piece); it != cache.end()) {
            out.insert(out.end(), it->second.begin(), it->second.end());
            return;
        }
        const std::size_t first = out.size();
        merge_piece(piece, scratch, out);
        if (cache.size() >= kMaxCachedPieces) cache.clear();
        cache.emplace(piece, std::vector<std::int32_t>(out.begin() + first, out.end()));
    }

    // Applies merges lowest rank first (leftmost first among equal ranks), as GPT-2 does, in
    // O(n log n): a doubly linked list of parts and a heap of candidate pairs whose stale entries
    // are skipped when popped.
    void merge_piece(std::string_view piece, MergeScratch& s,
                     std::vector<std::int32_t>& out) const {
        const auto n = static_cast<std::int32_t>(piece.size());
        s.ids.resize(n);
        s.next.resize(n);
        s.prev.resize(n);
        s.heap.clear();
        for (std::int32_t i = 0; i < n; ++i) {
            s.ids[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
            s.next[i] = i + 1 < n ? i + 1 : -1;
            s.prev[i] = i - 1;
        }
        const auto consider = [&](std::int32_t pos) {
            if (pos < 0) return;
            const std::int32_t right = s.next[pos];
            if (right < 0) return;
            const auto it = rank_of_.find(pair_key(s.ids[pos], s.ids[right]));
            if (it == rank_of_.end()) return;
            s.heap.push_back({it->second, pos, s.ids[pos], s.ids[right]});
            std::push_heap(s.heap.begin(), s.heap.end(), std::greater<>{});
        };
        for (std::int32_t i = 0; i + 1 < n; ++i)
            consider(i);
        while (!s.heap.empty()) {
            std::pop_heap(s.heap.begin(), s.heap.end(), std::greater<>{});
            const MergeScratch::Candidate top = s.heap.back();
            s.heap.pop_back();
            const std::int32_t right = s.next[top.pos];
            // Dead nodes are unlinked by setting their id to -1, so this rejects them too.
            if (right < 0 || s.ids[top.pos] != top.left || s.ids[right] != top.right) continue;
            s.ids[top.pos] = results_[top.rank];
            s.ids[right] = -1;
            s.next[top.pos] = s.next[right];
            if (s.next[right] >= 0) s.prev[s.next[right]] = top.pos;
            consider(s.prev[top.pos]);
            consider(top.pos);
        }
        for (std::int32_t i = 0; i >= 0; i = s.next[i])
            out.push_back(s.ids[i]);
    }

    TokenizerKind kind_;
    PreTokenizer pre_;
    std::vector<std::string> vocab_;
    std::vector<Merge> merges_;
    std::vector<std::int32_t> results_;  // the token each merge makes, by rank
    std::array<std::int32_t, 256> byte_ids_;
    std::int32_t eot_id_;
    std::unordered_map<std::uint64_t, std::int32_t> rank_of_;
    std::unordered_map<std::string, std::int32_t, TransparentHash, std::equal_to<>> whole_tokens_;
    Pretokenizer pretokenizer_;
    std::optional<Pretokenizer> digits_;  // DigitsThenGpt2: the numeric characters first
};

}  // namespace

namespace detail {

std::unique_ptr<Tokenizer> make_trained_bpe(std::vector<Merge> merges) {
    if (merges.size() > static_cast<std::size_t>(kMaxTrainedVocab)) {
        throw InputError("bpe tokenizer: " + std::to_string(merges.size()) + " merges is too many");
    }
    std::vector<std::string> vocab;
    vocab.reserve(kNumBytes + merges.size() + 1);
    std::array<std::int32_t, 256> byte_ids{};
    for (int byte = 0; byte < kNumBytes; ++byte) {
        vocab.emplace_back(1, static_cast<char>(byte));
        byte_ids[byte] = byte;
    }
    std::vector<std::int32_t> results;
    results.reserve(merges.size());
    std::unordered_map<std::uint64_t, std::size_t> seen;
    constexpr std::size_t kMaxTokenBytes = std::size_t{1} << 16;
    constexpr std::size_t kMaxVocabularyBytes = std::size_t{1} << 26;
    std::size_t total_bytes = kNumBytes;
    for (std::size_t rank = 0; rank < merges.size(); ++rank) {
        const auto [left, right] = merges[rank];
        const auto available = static_cast<std::int32_t>(kNumBytes + rank);
        // A merge may only join tokens that exist before it: bytes or results of earlier merges.
        if (left < 0 || right < 0 || left >= available || right >= available) {
            throw InputError("bpe tokenizer: merge " + std::to_string(rank) + " (" +
                             std::to_string(left) + ", " + std::to_string(right) +
                             ") refers to a token not created before it");
        }
        if (const auto [it, fresh] = seen.emplace(pair_key(left, right), rank); !fresh) {
            throw InputError("bpe tokenizer: merge " + std::to_string(rank) + " repeats merge " +
                             std::to_string(it->second));
        }
        // Merges can double a token's length each time: a few hundred bytes of merges could
        // ask for terabytes. Real vocabularies are far below these bounds.
        const std::size_t length = vocab[static_cast<std::size_t>(left)].size() +
                                   vocab[static_cast<std::size_t>(right)].size();
        total_bytes += length;
        if (length > kMaxTokenBytes || total_bytes > kMaxVocabularyBytes) {
            throw InputError("bpe tokenizer: merge " + std::to_string(rank) +
                             " makes the vocabulary implausibly long (token of " +
                             std::to_string(length) + " bytes, " + std::to_string(total_bytes) +
                             " bytes in all): corrupt tokenizer");
        }
        results.push_back(available);
        vocab.push_back(vocab[static_cast<std::size_t>(left)] +
                        vocab[static_cast<std::size_t>(right)]);
    }
    const auto eot = static_cast<int>(vocab.size());
    vocab.emplace_back(kEndOfText);
    return std::make_unique<BpeTokenizer>(TokenizerKind::Bpe, std::move(vocab), std::move(merges),
                                          std::move(results), byte_ids, eot);
}

std::unique_ptr<Tokenizer> make_gpt2_style_bpe(std::vector<std::string> vocab,
                                               std::vector<Merge> merges, int eot_id,
                                               PreTokenizer pre) {
    const std::string context = "gpt2 tokenizer: ";
    const auto vocab_size = static_cast<std::int64_t>(vocab.size());
    if (vocab_size <= kNumBytes || vocab_size > std::numeric_limits<std::int32_t>::max()) {
        throw InputError(context + "vocabulary of " + std::to_string(vocab_size) +
                         " tokens cannot hold the 256 bytes and <|endoftext|>");
    }
    if (eot_id < 0 || eot_id >= vocab_size) {
        throw InputError(context + "<|endoftext|> id: " + describe_id(eot_id, vocab_size));
    }
    std::unordered_map<std::string_view, std::int32_t> id_of;
    id_of.reserve(vocab.size());
    for (std::size_t id = 0; id < vocab.size(); ++id) {
        if (vocab[id].empty()) {
            throw InputError(context + "token " + std::to_string(id) + " is empty");
        }
        if (static_cast<int>(id) == eot_id) continue;
        if (const auto [it, fresh] = id_of.emplace(vocab[id], static_cast<std::int32_t>(id));
            !fresh) {
            throw InputError(context + "tokens " + std::to_string(it->second) + " and " +
                             std::to_string(id) + " have the same bytes");
        }
    }
    std::array<std::int32_t, 256> byte_ids{};
    // Tokens that exist before merge r: the bytes, then the results of merges 0..r-1.
    std::vector<bool> available(vocab.size(), false);
    for (int byte = 0; byte < kNumBytes; ++byte) {
        const auto it = id_of.find(std::string_view(std::string(1, static_cast<char>(byte))));
        if (it == id_of.end()) {
            throw InputError(context + "no token for the single byte " + std::to_string(byte));
        }
        byte_ids[byte] = it->second;
        available[it->second] = true;
    }
    std::vector<std::int32_t> results;
    results.reserve(merges.size());
    std::unordered_map<std::uint64_t, std::size_t> seen;
    for (std::size_t rank = 0; rank < merges.size(); ++rank) {
        const auto [left, right] = merges[rank];
        const std::string where = context + "merge " + std::to_string(rank) + " (" +
                                  std::to_string(left) + ", " + std::to_string(right) + ")";
        if (left < 0 || right < 0 || left >= vocab_size || right >= vocab_size ||
            !available[left] || !available[right]) {
            throw InputError(where + " refers to a token not created before it");
        }
        if (const auto [it, fresh] = seen.emplace(pair_key(left, right), rank); !fresh) {
            throw InputError(where + " repeats merge " + std::to_string(it->second));
        }
        const std::string joined = vocab[left] + vocab[right];
        const auto it = id_of.find(std::string_view(joined));
        if (it == id_of.end()) throw InputError(where + " makes bytes that are not a token");
        if (available[it->second]) {
            throw InputError(where + " makes token " + std::to_string(it->second) +
                             " which already exists");
        }
        available[it->second] = true;
        results.push_back(it->second);
    }
    return std::make_unique<BpeTokenizer>(TokenizerKind::Gpt2, std::move(vocab), std::move(merges),
                                          std::move(results), byte_ids, eot_id, pre);
}

std::unique_ptr<Tokenizer> deserialize_bpe(ByteReader& reader, TokenizerKind kind,
                                           std::uint8_t version) {
    std::vector<std::string> vocab;
    std::uint32_t eot_id = 0;
    if (kind == TokenizerKind::Gpt2) {
        const std::uint32_t vocab_size = reader.count("vocabulary size", 4);
        eot_id = reader.u32("<|endoftext|> id");
        vocab.reserve(vocab_size);
        for (std::uint32_t id = 0; id < vocab_size; ++id) {
            const std::uint32_t length = reader.count("token length", 1);
            vocab.emplace_back(reader.raw(length, "token bytes"));
        }
    }
    const std::uint32_t num_merges = reader.count("merge count", 8);
    std::vector<Merge> merges;
    merges.reserve(num_merges);
    for (std::uint32_t rank = 0; rank < num_merges; ++rank) {
        const std::uint32_t left = reader.u32("merge");
        const std::uint32_t right = reader.u32("merge");
        // Ids that do not fit int32 are out of range anyway; clamp so validation reports them.
        const auto clamp = [](std::uint32_t id) {
            return static_cast<std::int32_t>(std::min<std::uint32_t>(id, 0x7FFFFFFF));
        };
        merges.emplace_back(clamp(left), clamp(right));
    }
    PreTokenizer pre = PreTokenizer::Gpt2;
    if (version == kSerialFormatVersionPre) {
        const std::uint8_t value = reader.u8("pre-tokenizer");
        if (kind != TokenizerKind::Gpt2 ||
            value != static_cast<std::uint8_t>(PreTokenizer::DigitsThenGpt2)) {
            reader.fail("unknown pre-tokenizer " + std::to_string(value) + " for a " +
                        std::string(tokenizer_kind_name(kind)) + " tokenizer");
        }
        pre = PreTokenizer::DigitsThenGpt2;
    }
    try {
        if (kind == TokenizerKind::Bpe) return make_trained_bpe(std::move(merges));
        return make_gpt2_style_bpe(std::move(vocab), std::move(merges),
                                   static_cast<int>(std::min<std::uint32_t>(eot_id, 0x7FFFFFFF)),
                                   pre);
    } catch (const InputError& e) {
        reader.fail(e.what());
    }
}

}  // namespace detail

}  // namespace gpt2
