// The document stream: a DocumentReader goes through the corpus's files in order, cutting plain
// text into pieces where the tokens allow and a document where the validation split says (the
// records of JSON Lines and Parquet files are read in document_records.cpp).
#include <algorithm>
#include <cstring>
#include <utility>

#include "core/error.hpp"
#include "data/document_reader_state.hpp"
#include "data/documents.hpp"

namespace gpt2 {

namespace {

// Plain text with no safe cut in this much is refused rather than held whole.
constexpr std::size_t kMaxPieceBytes = std::size_t{64} << 20;

}  // namespace

bool DocumentReader::Impl::fill() {
    if (file_ended) return false;
    if (head > 0) {  // drop consumed lines once per read, not once per line
        pending.erase(0, head);
        head = 0;
    }
    const std::size_t old = pending.size();
    pending.resize(old + detail::kReadChunk);
    const std::size_t got = source->read(pending.data() + old, detail::kReadChunk);
    pending.resize(old + got);
    file_ended = got == 0;
    if (files[file].format == CorpusFormat::Text) {  // text inputs must be text
        if (const void* nul = std::memchr(pending.data() + old, '\0', got)) {
            const auto at =
                static_cast<std::size_t>(static_cast<const char*>(nul) - pending.data());
            throw InputError(files[file].path.string() + ": binary data (a NUL byte at byte " +
                             std::to_string(offset + at) + "), not text");
        }
    }
    return got > 0;
}

void DocumentReader::Impl::open_next_file() {
    if (source) stored_done += source->stored_read();
    source.reset();
    if (parquet) {
        stored_done += parquet->stored_bytes_read();
        parquet_null_rows += parquet->null_rows();
        parquet_null_messages += parquet->null_messages();
    }
    parquet.reset();
    if (file >= files.size()) return;
    if (files[file].format == CorpusFormat::Parquet) {
        ParquetReadOptions reading;
        reading.text_field = options.text_field;
        reading.text_field_given = options.text_field_given;
        parquet = std::make_unique<ParquetReader>(files[file].path, reading);
        if (options.on_parquet_file)
            options.on_parquet_file(files[file].path, parquet->layout().description);
        return;
    }
    source = std::make_unique<detail::ByteSource>(files[file].path);
    pending.clear();
    head = 0;
    scanned = 0;
    last_safe = 0;
    file_ended = false;
    line = 0;
    offset = 0;
    in_document = false;
    past_cut = false;
}

void DocumentReader::Impl::emit(DocumentPiece& out, std::size_t length, bool first) {
    out.text.assign(pending, 0, length);
    out.spans.clear();
    pending.erase(0, length);
    scanned = 0;
    last_safe = 0;
    out.document = document;
    out.index = piece++;
    out.first = first;
}

void DocumentReader::Impl::cut_document(DocumentPiece& whole) {
    const std::size_t size = whole.text.size();
    if (options.cut_at_byte == 0 || options.cut_at_byte >= size) return;
    const auto at = static_cast<std::size_t>(options.cut_at_byte);
    std::size_t p = at;
    while (p < size && !safe(whole.text, p))
        ++p;
    if (p == size) {  // none at or after it: the last one before it, or the start
        p = at - 1;
        while (p > 0 && !safe(whole.text, p))
            --p;
    }
    if (p == 0) {
        whole.after_cut = true;
        return;
    }
    DocumentPiece after;
    after.text = whole.text.substr(p);
    after.document = whole.document;
    after.index = piece++;
    after.first = false;
    after.offset = p;
    after.after_cut = true;
    // The spans on either side of the cut, in each piece's own bytes.
    std::vector<TextSpan> before;
    for (const TextSpan& span : whole.spans) {
        if (span.end <= p) {
            before.push_back(span);
            continue;
        }
        if (before.empty() || before.back().end < p) before.push_back(TextSpan{p, span.trained});
        after.spans.push_back(TextSpan{span.end - p, span.trained});
    }
    whole.spans = std::move(before);
    whole.text.resize(p);
    rest = std::move(after);
}

void DocumentReader::Impl::whole_document(DocumentPiece& out) {
    out.document = document++;
    out.index = piece++;
    out.first = true;
    out.offset = 0;
    out.after_cut = false;
    if (out.document == options.cut_document) cut_document(out);
}

bool DocumentReader::Impl::next_plain(DocumentPiece& out) {
    if (options.require_responses) {
        throw InputError(files[file].path.string() +
                         ": plain text, which has no response to train: the loss on the response "
                         "only needs prompt/response or chat records (JSON Lines or Parquet; "
                         "--loss-on all trains on every token)");
    }
    for (;;) {
        while (pending.size() < options.piece_bytes && fill()) {
        }
        const std::uint64_t at =
            document == options.cut_document && !past_cut ? options.cut_at_byte : 0;
        if (at > 0 && at <= offset) past_cut = true;  // a piece ended right at it
        const bool split_inside = at > offset && at < offset + pending.size();
        const std::size_t split = split_inside ? static_cast<std::size_t>(at - offset) : 0;
        // Only positions not checked before (each byte is looked at about once), the last few
        // again: the character after them may have been cut short by the read.
        std::size_t cut = 0;
        for (std::size_t p = std::max<std::size_t>(scanned, 1); p < pending.size(); ++p) {
            if (!safe(pending, p)) continue;
            if (split_inside && p >= split) {  // the first safe position at or after the split
                cut = p;
                break;
            }
            last_safe = p;
        }
        scanned = pending.size() > 4 ? pending.size() - 4 : 0;
        bool cut_is_forced = cut > 0;
        if (!split_inside) cut = last_safe;
        if (cut == 0 && !file_ended) {
            if (pending.size() >= kMaxPieceBytes) {
                throw InputError(files[file].path.string() + ": no place in " +
                                 std::to_string(kMaxPieceBytes >> 20) +
                                 " MB of text where it can be cut without changing its tokens (a "
                                 "newline between two characters that are not spaces); break its "
                                 "lines or make it JSON Lines");
            }
            fill();
            continue;
        }
        bool after_cut = past_cut;
        if (split_inside && !cut_is_forced) {
            // No safe position at or after the split before the document ends: the last one
            // before it, or (none in this piece) where this piece starts, a safe place too.
            if (last_safe > 0) {
                cut = last_safe;
                cut_is_forced = true;
            } else {
                after_cut = past_cut = true;
            }
        }
        if (cut == 0 || (file_ended && !split_inside)) cut = pending.size();  // the rest
        const bool first = !in_document;
        out.offset = offset;
        out.after_cut = after_cut;
        emit(out, cut, first);
        if (cut_is_forced) past_cut = true;
        offset += cut;
        in_document = true;
        if (file_ended && pending.empty()) {
            ++document;
            ++file;
            open_next_file();
        }
        return true;
    }
}

DocumentReader::DocumentReader(std::vector<CorpusFile> files, DocumentReaderOptions options)
    : impl_(std::make_unique<Impl>()) {
    impl_->files = std::move(files);
    impl_->options = std::move(options);
    impl_->open_next_file();
}

DocumentReader::~DocumentReader() = default;

bool DocumentReader::next(DocumentPiece& piece) {
    Impl& r = *impl_;
    if (r.rest) {
        piece = std::move(*r.rest);
        r.rest.reset();
        return true;
    }
    while (r.file < r.files.size()) {
        switch (r.files[r.file].format) {
            case CorpusFormat::JsonLines:
                if (r.next_jsonl(piece)) return true;
                break;
            case CorpusFormat::Parquet:
                if (r.next_parquet(piece)) return true;
                break;
            case CorpusFormat::Text:
                return r.next_plain(piece);
        }
    }
    return false;
}

std::uint64_t DocumentReader::stored_bytes_read() const {
    const Impl& r = *impl_;
    return r.stored_done + (r.source ? r.source->stored_read() : 0) +
           (r.parquet ? r.parquet->stored_bytes_read() : 0);
}
std::uint64_t DocumentReader::null_rows() const {
    return impl_->parquet_null_rows + (impl_->parquet ? impl_->parquet->null_rows() : 0);
}
std::uint64_t DocumentReader::null_messages() const {
    return impl_->parquet_null_messages + (impl_->parquet ? impl_->parquet->null_messages() : 0);
}
std::uint64_t DocumentReader::skipped_lines() const {
    return impl_->skipped;
}
const std::string& DocumentReader::first_skipped() const {
    return impl_->first_skipped;
}

}  // namespace gpt2
