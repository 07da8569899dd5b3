#include "data/prepare/shard_stream.hpp"

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
    std::exception_ptr read_error;
    for (bool more = true; more;) {
        more = read_batch(reader, batch, read_error);
        std::unique_ptr<bool[]> wanted = std::make_unique<bool[]>(batch.size());
        for (std::size_t i = 0; i < batch.size(); ++i) {
            const ShardWriter& w = options.is_val(batch[i]) ? val : train;
            wanted[i] = !w.done_before(batch[i].index);
        }
        texts.clear();
        for (const DocumentPiece& piece : batch)
            texts.push_back(piece.text);
        encode_texts(tokenizer, texts, encoded, options.threads, options.eot_in_text,
                     std::span<const bool>(wanted.get(), batch.size()));
        for (std::size_t i = 0; i < batch.size(); ++i) {
            const DocumentPiece& p = batch[i];
            if (p.first) ++totals.documents;
            totals.text_bytes += p.text.size();
            if (!wanted[i]) continue;
            tokens.clear();
            if (options.document_start && p.first) tokens.push_back(*options.document_start);
            tokens.insert(tokens.end(), encoded[i].begin(), encoded[i].end());
            ShardWriter& w = options.is_val(p) ? val : train;
            if (w.add(p.index, tokens) && options.on_shard && !options.on_shard()) {
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
