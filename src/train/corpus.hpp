// The run's tokenizer and tokens, identical on every rank: from a text file (rank 0 reads and
// tokenizes, then broadcasts) or from llm.c token shards and their loss masks (every rank maps
// them).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "data/shard.hpp"
#include "data/windows.hpp"
#include "parallel/comm.hpp"
#include "tokenizer/tokenizer.hpp"
#include "train/options.hpp"
#include "train/start_point.hpp"

namespace gpt2 {

struct Corpus {
    std::unique_ptr<Tokenizer> tokenizer;
    std::vector<std::int32_t> train;  // text mode: the tokens themselves
    std::vector<std::int32_t> val;
    std::vector<MappedShard> train_shards;  // shard mode: memory-mapped by every rank
    std::vector<MappedShard> val_shards;
    // Their loss masks (SHARD.mask), when the shards have them: then every shard has one.
    std::vector<MappedShardMask> train_masks;
    std::vector<MappedShardMask> val_masks;
    TokenStore train_store;
    TokenStore val_store;
    // --attention-within-documents: the token each document begins with (the tokenizer's
    // end-of-text), which attention's document masking cuts the windows at; none: off.
    std::optional<std::int32_t> document_start;
};

// Fills `corpus` on every rank (collective) from --data or --train-data/--val-data, with the
// tokenizer rank 0 chose.
void prepare_corpus(const TrainOptions& o, const Communicator& comm, const TokenizerChoice& choice,
                    Corpus& corpus);

}  // namespace gpt2
