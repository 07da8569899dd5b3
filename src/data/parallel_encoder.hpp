// Encodes a batch of corpus pieces on several threads: each piece whole, in any order, so the
// tokens are those of encoding the pieces one after another.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "data/documents.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {

// out[i] = tokenizer.encode(pieces[i].text, eot) for every i with wanted[i] (the others empty), on
// `threads` threads (the calling one among them). The first exception a piece throws stops the
// others and is rethrown.
void encode_pieces(const Tokenizer& tokenizer, std::span<const DocumentPiece> pieces,
                   std::span<const bool> wanted, std::vector<std::vector<std::int32_t>>& out,
                   int threads, EotInText eot);

}  // namespace gpt2
