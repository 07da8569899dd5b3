// A corpus streamed into its train and val shards: pieces are read in batches of bounded size,
// encoded in parallel, and each goes, in corpus order, to its split's ShardWriter (which a resumed
// run has told what to skip). Memory stays bounded by a batch and a shard whatever the corpus.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "data/documents.hpp"
#include "data/prepare/shard_writer.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {

struct ShardStreamOptions {
    int threads = 1;
    EotInText eot_in_text = EotInText::Token;
    // The token each document starts with (llm.c's layout: the end-of-text token); none: the
    // documents are concatenated.
    std::optional<int> document_start;
    // Write a loss mask beside each shard (the writers are masked): each span of a piece
    // (DocumentPiece::spans) is encoded on its own, its tokens trained or not as the span is, and
    // the end-of-text token that starts a document is trained (it ends the example before it: the
    // model learns to stop after a response).
    bool loss_mask = false;
    // Whether a piece belongs to the validation split.
    std::function<bool(const DocumentPiece&)> is_val;
    // Called after each piece that completed a shard (to record progress); false stops the stream
    // there, as if interrupted.
    std::function<bool()> on_shard;
    // Called after each batch with the stored bytes read, the documents seen and the tokens in
    // shards so far (for a progress display).
    std::function<void(std::uint64_t stored_bytes, std::uint64_t documents, std::uint64_t tokens)>
        on_batch;
};

struct ShardStreamTotals {
    std::uint64_t documents = 0;       // seen, including those a resumed run skipped
    std::uint64_t text_bytes = 0;      // of those documents
    std::uint64_t tokens_added = 0;    // tokens this run gave the writers
    std::uint64_t trained_tokens = 0;  // of those, with a loss mask: the ones marked trained
    bool stopped = false;              // on_shard asked to stop; the rest of the corpus is unread
};

// Reads the reader to its end (or until on_shard says stop) into the writers; the last, partial
// shards stay buffered for the caller to flush. Throws what reading, encoding or writing throws;
// what reading throws (bad input) only after the pieces before it are in the writers, so that the
// shards they complete are written.
ShardStreamTotals stream_into_shards(DocumentReader& reader, const Tokenizer& tokenizer,
                                     ShardWriter& train, ShardWriter& val,
                                     const ShardStreamOptions& options);

}  // namespace gpt2
