#include "data/prepare/tokenizer_sample.hpp"

#include <array>

namespace gpt2 {

std::string read_alphabet(DocumentReader& reader) {
    DocumentPiece piece;
    std::array<bool, 256> seen{};
    while (reader.next(piece)) {
        for (const char ch : piece.text)
            seen[static_cast<unsigned char>(ch)] = true;
    }
    std::string alphabet;
    for (int byte = 0; byte < 256; ++byte) {
        if (seen[static_cast<std::size_t>(byte)]) alphabet += static_cast<char>(byte);
    }
    return alphabet;
}

BpeSample read_bpe_sample(DocumentReader& reader, std::size_t limit, bool separate_documents) {
    BpeSample sample;
    DocumentPiece piece;
    while (reader.next(piece)) {
        if (sample.text.size() >= limit) {
            sample.whole = false;
            break;
        }
        if (piece.first && separate_documents && !sample.text.empty()) {
            sample.text += "<|endoftext|>";
        }
        sample.text += piece.text;
        if (piece.first) ++sample.documents;
    }
    return sample;
}

}  // namespace gpt2
