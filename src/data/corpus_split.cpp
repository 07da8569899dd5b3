#include "data/corpus_split.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.hpp"

namespace gpt2 {

CorpusSplit::CorpusSplit(std::vector<CorpusFile> files, double val_fraction,
                         std::int64_t val_documents)
    : files_(std::move(files)),
      val_documents_(static_cast<std::uint64_t>(std::max<std::int64_t>(0, val_documents))) {
    for (const CorpusFile& f : files_)
        stored_bytes_ += f.bytes;
    one_text_ = files_.size() == 1 && !files_[0].jsonl;
    if (one_text_ && val_fraction > 0 && val_documents == 0) {
        const std::uint64_t bytes = uncompressed_bytes(files_[0]);
        if (bytes == 0) throw InputError(files_[0].path.string() + ": input file is empty");
        val_from_byte_ = std::max<std::uint64_t>(
            1, static_cast<std::uint64_t>(
                   std::llround(static_cast<double>(bytes) * (1.0 - val_fraction))));
    }
    if (val_fraction > 0) {
        val_every_ = std::max<std::uint64_t>(
            1, static_cast<std::uint64_t>(std::llround(1.0 / val_fraction)));
    }
}

bool CorpusSplit::is_val(const DocumentPiece& piece) const {
    if (val_documents_ > 0) return piece.document < val_documents_;
    if (one_text_) return val_from_byte_ > 0 && piece.offset >= val_from_byte_;
    return val_every_ > 0 && piece.document % val_every_ == 0;
}

}  // namespace gpt2
