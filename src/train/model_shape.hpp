// The model's shape for a run: the weights' it starts from (shape flags must agree) or the one the
// flags ask for; rank 0 decides and every rank receives it.
#pragma once

#include "model/model.hpp"
#include "parallel/comm.hpp"
#include "tokenizer/tokenizer.hpp"
#include "train/options.hpp"
#include "train/start_point.hpp"

namespace gpt2 {

// Rank 0, before the corpus is read: UsageError for shape flags that contradict the weights the
// run starts from, or a --seq-len beyond the block size of those weights (or, starting fresh, of
// the shape the flags ask for).
void check_flags_against_start(const TrainOptions& o, const StartPoint& start);

// Collective. Throws UsageError/InputError (on rank 0) for a vocabulary the tokenizer does not
// have, or a model shape that cannot be (check_flags_against_start has checked the flags).
[[nodiscard]] ModelConfig agree_on_model(const TrainOptions& o, const Communicator& comm,
                                         const StartPoint& start, const Tokenizer& tokenizer);

}  // namespace gpt2
