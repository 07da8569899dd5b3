// The model's shape for a run: the weights' it starts from (shape flags must agree) or the one the
// flags ask for; rank 0 decides and every rank receives it.
#pragma once

#include "model/model.hpp"
#include "parallel/comm.hpp"
#include "tokenizer/tokenizer.hpp"
#include "train/options.hpp"
#include "train/start_point.hpp"

namespace gpt2 {

// Collective. Throws UsageError/InputError (on rank 0) for flags that contradict the weights, a
// vocabulary the tokenizer does not have, or a --seq-len beyond the block size.
[[nodiscard]] ModelConfig agree_on_model(const TrainOptions& o, const Communicator& comm,
                                         const StartPoint& start, const Tokenizer& tokenizer);

}  // namespace gpt2
