// inference's samples of one prompt: each rank generates its share, and rank 0 prints every sample
// in order (sample 0 as it is made, the others when their rank has sent them).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "apps/inference/options.hpp"
#include "model/kv_cache.hpp"
#include "parallel/comm.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2::inference {

// Generates this rank's samples for one prompt; rank 0 prints all of them in order (each after
// `prompt_text`, which only rank 0 needs). Sample m (of this prompt, numbered `prompt_index`) is
// made by rank m % size with the random stream derived from (seed, m, prompt_index). A sample
// ends after --max-new-tokens, at the end-of-text token (unless --ignore-eot), at the first of
// `stops` (neither printed), or at a stop signal, after which no further sample starts. Returns
// sample 0's text where it was made (rank 0 when the ranks share nothing).
std::string run_prompt(const Options& o, const Communicator& comm, KvCacheSession& session,
                       const Tokenizer& tokenizer, std::span<const std::int32_t> prompt,
                       std::string_view prompt_text, std::uint64_t prompt_index,
                       const std::vector<std::string>& stops);

}  // namespace gpt2::inference
