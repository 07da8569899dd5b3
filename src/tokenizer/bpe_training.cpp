// BPE training: the merges, most frequent pair first, learned from a corpus's pre-tokens.
#include <algorithm>
#include <optional>
#include <queue>
#include <unordered_map>
#include <vector>

#include "core/error.hpp"
#include "tokenizer/pretokenizer.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {

using detail::kMaxTrainedVocab;
using detail::kNumBytes;
using detail::Merge;
using detail::pair_key;
using detail::Pretokenizer;
using detail::split_end_of_text;

namespace {

// Incremental BPE training state. Words are distinct pre-tokens with their counts; a merge only
// revisits the words that contain its pair (found through where_), and pair counts change by
// deltas, so no step recounts the corpus.
class BpeTrainer {
  public:
    explicit BpeTrainer(std::string_view corpus) {
        const Pretokenizer pretokenizer;
        std::unordered_map<std::string_view, std::int64_t> counts;
        split_end_of_text(
            corpus,
            [&](std::string_view text) {
                pretokenizer.split(text, [&](std::string_view piece) { ++counts[piece]; });
            },
            [] {});
        words_.reserve(counts.size());
        for (const auto& [piece, count] : counts) {
            Word word{{}, count};
            word.symbols.reserve(piece.size());
            for (const char c : piece)
                word.symbols.push_back(static_cast<unsigned char>(c));
            words_.push_back(std::move(word));
        }
        for (std::size_t w = 0; w < words_.size(); ++w) {
            const auto& symbols = words_[w].symbols;
            for (std::size_t i = 0; i + 1 < symbols.size(); ++i) {
                const std::uint64_t key = pair_key(symbols[i], symbols[i + 1]);
                pair_counts_[key] += words_[w].count;
                note_word(key, static_cast<std::int32_t>(w));
            }
        }
        for (const auto& [key, count] : pair_counts_)
            heap_.push({count, key});
    }

    // Highest count first; among equal counts the smallest (left, right) ids, so that training
    // never depends on hash-map iteration order.
    [[nodiscard]] std::optional<Merge> next_merge() {
        while (!heap_.empty()) {
            const Candidate top = heap_.top();
            heap_.pop();
            const auto it = pair_counts_.find(top.key);
            if (it == pair_counts_.end() || it->second != top.count) continue;
            return Merge{static_cast<std::int32_t>(top.key >> 32),
                         static_cast<std::int32_t>(top.key & 0xFFFFFFFF)};
        }
        return std::nullopt;
    }

    void apply(Merge merge, std::int32_t new_id) {
        const std::uint64_t merged_key = pair_key(merge.first, merge.second);
        const auto where_it = where_.find(merged_key);
        const std::vector<std::int32_t> affected = std::move(where_it->second);
        where_.erase(where_it);
        std::unordered_map<std::uint64_t, std::int64_t> delta;
        for (const std::int32_t w : affected) {
            auto& symbols = words_[w].symbols;
            const std::int64_t count = words_[w].count;
            bool found = false;
            for (std::size_t i = 0; i + 1 < symbols.size() && !found; ++i) {
                found = symbols[i] == merge.first && symbols[i + 1] == merge.second;
            }
            if (!found) continue;
            for (std::size_t i = 0; i + 1 < symbols.size(); ++i) {
                delta[pair_key(symbols[i], symbols[i + 1])] -= count;
            }
            std::size_t out = 0;
            for (std::size_t i = 0; i < symbols.size();) {
                if (i + 1 < symbols.size() && symbols[i] == merge.first &&
                    symbols[i + 1] == merge.second) {
                    symbols[out++] = new_id;
                    i += 2;
                } else {
                    symbols[out++] = symbols[i++];
                }
            }
            symbols.resize(out);
            for (std::size_t i = 0; i + 1 < symbols.size(); ++i) {
                const std::uint64_t key = pair_key(symbols[i], symbols[i + 1]);
                delta[key] += count;
                if (symbols[i] == new_id || symbols[i + 1] == new_id) note_word(key, w);
            }
        }
        for (const auto& [key, change] : delta) {
            if (change == 0) continue;
            const auto it = pair_counts_.find(key);
            const std::int64_t count = (it == pair_counts_.end() ? 0 : it->second) + change;
            if (count <= 0) {
                if (it != pair_counts_.end()) pair_counts_.erase(it);
                where_.erase(key);
            } else {
                pair_counts_[key] = count;
                heap_.push({count, key});
            }
        }
    }

  private:
    struct Word {
        std::vector<std::int32_t> symbols;
        std::int64_t count;
    };
    struct Candidate {
        std::int64_t count;
        std::uint64_t key;
        [[nodiscard]] bool operator<(const Candidate& other) const {
            return count != other.count ? count < other.count : key > other.key;
        }
    };

    void note_word(std::uint64_t key, std::int32_t w) {
        auto& list = where_[key];
        if (list.empty() || list.back() != w) list.push_back(w);
    }

    std::vector<Word> words_;
    std::unordered_map<std::uint64_t, std::int64_t> pair_counts_;
    std::unordered_map<std::uint64_t, std::vector<std::int32_t>> where_;
    std::priority_queue<Candidate> heap_;
};

}  // namespace

std::unique_ptr<Tokenizer> train_bpe_tokenizer(std::string_view corpus, int vocab_size) {
    if (vocab_size < kNumBytes + 1 || vocab_size > kMaxTrainedVocab) {
        throw InputError("bpe tokenizer: vocab size " + std::to_string(vocab_size) +
                         " must be in " + std::to_string(kNumBytes + 1) + ".." +
                         std::to_string(kMaxTrainedVocab) +
                         " (256 bytes + merges + <|endoftext|>)");
    }
    BpeTrainer trainer(corpus);
    std::vector<Merge> merges;
    const auto wanted = static_cast<std::size_t>(vocab_size - kNumBytes - 1);
    merges.reserve(wanted);
    while (merges.size() < wanted) {
        const std::optional<Merge> merge = trainer.next_merge();
        if (!merge) break;  // every pre-token is a single token already
        trainer.apply(*merge, static_cast<std::int32_t>(kNumBytes + merges.size()));
        merges.push_back(*merge);
    }
    return detail::make_trained_bpe(std::move(merges));
}

}  // namespace gpt2
