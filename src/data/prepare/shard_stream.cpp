#include "data/prepare/shard_stream.hpp"

#include <algorithm>
#include <exception>
#include <memory>
#include <vector>

#include "core/error.hpp"

namespace gpt2 {

namespace {

// A batch: enough text to keep the encoding threads busy, little enough to bound memory.
constexpr std::size_t kBatchBytes = std::size_t{32} << 20;
constexpr std::size_t kBatchPieces = 16384;

// Fills `batch` with the next pieces; false when the reader is at its end. A read error (a bad
// line) ends the batch there and is kept in `error`, to be thrown once the pieces before it are in
// shards: what was complete before bad input is kept, whatever the size of the batch.
bool read_batch(DocumentReader& reader, std::vector<DocumentPiece>& batch,
                std::exception_ptr& error) {
    batch.clear();
    std::size_t bytes = 0;
    while (bytes < kBatchBytes && batch.size() < kBatchPieces) {
        batch.emplace_back();
        bool more = false;
        try {
            more = reader.next(batch.back());
        } catch (const InputError&) {
            error = std::current_exception();
        }
        if (!more) {
            batch.pop_back();
            return false;
        }
        bytes += batch.back().text.size();
    }
    return true;
}

}  // namespace

ShardStreamTotals stream_into_shards(DocumentReader& reader, const Tokenizer& tokenizer,
                                     ShardWriter& train, ShardWriter& val,
                                     const ShardStreamOptions& options) {
    ShardStreamTotals totals;
    std::vector<DocumentPiece> batch;
    std::vector<std::string_view> texts;
    std::vector<std::vector<std::int32_t>> encoded;
    std::vector<std::int32_t> tokens;
    std::vector<std::uint8_t> mask;
    std::vector<std::size_t> first_text;
    std::exception_ptr read_error;
    for (bool more = true; more;) {
        more = read_batch(reader, batch, read_error);
        std::unique_ptr<bool[]> wanted = std::make_unique<bool[]>(batch.size());
        for (std::size_t i = 0; i < batch.size(); ++i) {
            const ShardWriter& w = options.is_val(batch[i]) ? val : train;
            wanted[i] = !w.done_before(batch[i].index);
        }
        // One text per piece; with a loss mask, one per span (first_text[i]: piece i's first).
        texts.clear();
        first_text.assign(1, 0);
        for (std::size_t i = 0; i < batch.size(); ++i) {
            const DocumentPiece& piece = batch[i];
            if (!options.loss_mask) {
                texts.push_back(piece.text);
            } else {
                std::size_t begin = 0;
                for (const TextSpan& span : piece.spans) {
                    texts.push_back(std::string_view(piece.text).substr(begin, span.end - begin));
                    begin = span.end;
                }
            }
            first_text.push_back(texts.size());
        }
        const std::unique_ptr<bool[]> text_wanted = std::make_unique<bool[]>(texts.size());
        for (std::size_t i = 0; i < batch.size(); ++i)
            std::fill(text_wanted.get() + first_text[i], text_wanted.get() + first_text[i + 1],
                      wanted[i]);
        encode_texts(tokenizer, texts, encoded, options.threads, options.eot_in_text,
                     std::span<const bool>(text_wanted.get(), texts.size()));
        for (std::size_t i = 0; i < batch.size(); ++i) {
            const DocumentPiece& p = batch[i];
            if (p.first) ++totals.documents;
            totals.text_bytes += p.text.size();
            if (!wanted[i]) continue;
            tokens.clear();
            mask.clear();
            if (options.document_start && p.first) {
                tokens.push_back(*options.document_start);
                mask.push_back(1);
            }
            for (std::size_t t = first_text[i]; t < first_text[i + 1]; ++t) {
                tokens.insert(tokens.end(), encoded[t].begin(), encoded[t].end());
                const std::uint8_t trained =
                    options.loss_mask && p.spans[t - first_text[i]].trained ? 1 : 0;
                mask.resize(tokens.size(), trained);
            }
            ShardWriter& w = options.is_val(p) ? val : train;
            totals.tokens_added += tokens.size();
            if (options.loss_mask) {
                for (const std::uint8_t m : mask)
                    totals.trained_tokens += m;
            }
            const bool wrote =
                options.loss_mask ? w.add(p.index, tokens, mask) : w.add(p.index, tokens);
            if (wrote && options.on_shard && !options.on_shard()) {
                totals.stopped = true;
                return totals;
            }
        }
        if (options.on_batch) {
            options.on_batch(reader.stored_bytes_read(), totals.documents,
                             static_cast<std::uint64_t>(train.tokens() + val.tokens()));
        }
    }
    if (read_error) std::rethrow_exception(read_error);
    return totals;
}

}  // namespace gpt2
