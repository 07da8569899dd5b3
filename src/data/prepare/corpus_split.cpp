#include "data/prepare/corpus_split.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "core/error.hpp"
#include "data/parquet/parquet.hpp"

namespace gpt2 {

namespace {

// Documents are counted up to this many at most: past it one document is at most 0.001% of the
// corpus, so every N-th document is as close to the fraction as whole documents can be.
constexpr std::uint64_t kMaxCounted = 100'000;

std::string ordinal(std::uint64_t n) {
    const std::uint64_t tens = n % 100;
    const char* suffix = "th";
    if (tens < 11 || tens > 13) {
        if (n % 10 == 1) suffix = "st";
        if (n % 10 == 2) suffix = "nd";
        if (n % 10 == 3) suffix = "rd";
    }
    return std::to_string(n) + suffix;
}

std::string number(double value) {
    std::ostringstream out;
    out << value;
    return out.str();
}

std::string documents_word(std::uint64_t n) {
    return std::to_string(n) + (n == 1 ? " document" : " documents");
}

}  // namespace

CorpusSplit::CorpusSplit(std::vector<CorpusFile> files, const CorpusSplitOptions& options)
    : files_(std::move(files)),
      val_fraction_(options.val_fraction),
      val_documents_(static_cast<std::uint64_t>(std::max<std::int64_t>(0, options.val_documents))) {
    ParquetReadOptions parquet;
    parquet.text_field = options.text_field;
    parquet.text_field_given = options.text_field_given;
    for (const CorpusFile& f : files_) {
        stored_bytes_ += f.bytes;
        // Every Parquet footer and its columns are checked now, before any expensive work.
        if (f.format == CorpusFormat::Parquet) (void)ParquetReader(f.path, parquet);
    }
    one_text_ = files_.size() == 1 && files_[0].format == CorpusFormat::Text;
    if (val_fraction_ > 0) {
        val_every_ = std::max<std::uint64_t>(
            1, static_cast<std::uint64_t>(std::llround(1.0 / val_fraction_)));
    }
    rule_ = val_documents_ > 0 ? ValidationRule::FirstDocuments
            : val_every_ > 0   ? ValidationRule::EveryNth
                               : ValidationRule::None;
    const std::uint64_t wanted = rule_ == ValidationRule::FirstDocuments ? val_documents_ + 1
                                 : rule_ == ValidationRule::EveryNth     ? val_every_
                                                                         : 1;
    count_documents(std::clamp<std::uint64_t>(wanted, 1, kMaxCounted), options);
    if (documents_ == 0u) return;  // nothing to split: the caller says so
    if (rule_ == ValidationRule::FirstDocuments && documents_ && *documents_ <= val_documents_) {
        throw UsageError("--val-documents " + std::to_string(val_documents_) + ": the corpus has " +
                         (*documents_ < val_documents_ ? "only " : "") +
                         documents_word(*documents_) + ", which leaves none for training" +
                         (one_text_ ? " (--val-fraction splits one text file by bytes)" : ""));
    }
    if (rule_ != ValidationRule::EveryNth) return;
    if (one_text_ || (documents_ && *documents_ < val_every_)) {
        rule_ = ValidationRule::LastBytes;
        split_last_bytes();
    } else if (val_every_ == 1) {
        throw UsageError("--val-fraction " + number(val_fraction_) +
                         ": every document would be validation (of documents, every "
                         "round(1/F)-th is, here every one); give at most 0.66, or "
                         "--val-documents N");
    }
}

void CorpusSplit::count_documents(std::uint64_t limit, const CorpusSplitOptions& options) {
    std::uint64_t counted = 0;
    for (std::size_t i = 0; i < files_.size() && counted < limit; ++i) {
        if (files_[i].format == CorpusFormat::Text) {  // one document, sized only if needed
            document_bytes_.push_back(0);
            document_file_.push_back(i);
            ++counted;
            continue;
        }
        DocumentReaderOptions reading;
        reading.text_field = options.text_field;
        reading.text_field_given = options.text_field_given;
        reading.skip_bad_lines = options.skip_bad_lines;
        DocumentReader reader({files_[i]}, reading);
        DocumentPiece piece;
        while (counted < limit && reader.next(piece)) {
            document_bytes_.push_back(piece.text.size());
            document_file_.push_back(i);
            ++counted;
        }
    }
    if (counted < limit) documents_ = counted;
}

void CorpusSplit::split_last_bytes() {
    for (std::size_t d = 0; d < document_bytes_.size(); ++d) {
        const CorpusFile& file = files_[document_file_[d]];
        if (file.format == CorpusFormat::Text) document_bytes_[d] = uncompressed_bytes(file);
        total_bytes_ += document_bytes_[d];
    }
    if (one_text_ && total_bytes_ == 0) {
        throw InputError(files_[0].path.string() + ": input file is empty");
    }
    const std::uint64_t from = std::max<std::uint64_t>(
        1, static_cast<std::uint64_t>(
               std::llround(static_cast<double>(total_bytes_) * (1.0 - val_fraction_))));
    val_document_ = document_bytes_.size();  // none, unless `from` is inside the text
    std::uint64_t before = 0;
    for (std::size_t d = 0; d < document_bytes_.size(); ++d) {
        if (from < before + document_bytes_[d]) {
            val_document_ = d;
            val_from_byte_ = from - before;
            break;
        }
        before += document_bytes_[d];
    }
}

bool CorpusSplit::is_val(const DocumentPiece& piece) const {
    switch (rule_) {
        case ValidationRule::None:
            return false;
        case ValidationRule::FirstDocuments:
            return piece.document < val_documents_;
        case ValidationRule::EveryNth:
            return piece.document % val_every_ == 0;
        case ValidationRule::LastBytes:
            return piece.document > val_document_ ||
                   (piece.document == val_document_ && (val_from_byte_ == 0 || piece.after_cut));
    }
    return false;
}

std::string CorpusSplit::describe() const {
    const std::string fraction = "--val-fraction " + number(val_fraction_);
    switch (rule_) {
        case ValidationRule::None:
            return "validation: none (--val-fraction 0)";
        case ValidationRule::FirstDocuments:
            return "validation: the first " + documents_word(val_documents_) +
                   " (--val-documents " + std::to_string(val_documents_) + ")";
        case ValidationRule::EveryNth:
            return "validation: every " + ordinal(val_every_) +
                   " document, starting with the first (" + fraction + ")";
        case ValidationRule::LastBytes:
            break;
    }
    std::string text =
        "validation: the last " + number(val_fraction_ * 100) + "% of the text (" + fraction + ")";
    if (val_document_ >= document_bytes_.size()) return text + ": too few bytes to have any";
    const std::string cut = ", cut where the tokens cannot change";
    if (one_text_) return text + ", from about byte " + std::to_string(val_from_byte_) + cut;
    const std::string where = "document " + std::to_string(val_document_ + 1) + " of " +
                              std::to_string(document_bytes_.size()) + " (" +
                              files_[document_file_[val_document_]].path.string() + ")";
    text += val_from_byte_ > 0
                ? ", from about byte " + std::to_string(val_from_byte_) + " of " + where + cut
                : ", from the start of " + where;
    return text + ": " + documents_word(document_bytes_.size()) +
           (document_bytes_.size() == 1 ? " is" : " are") + " too few to take every " +
           ordinal(val_every_) + " whole";
}

}  // namespace gpt2
