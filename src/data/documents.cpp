#include "data/documents.hpp"

#include <fnmatch.h>
#include <glob.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "core/error.hpp"
#include "data/multiple_choice.hpp"
#include "data/parquet/parquet.hpp"
#include "data/shard.hpp"

namespace gpt2 {

namespace fs = std::filesystem;

namespace {

enum class Compression { None, Gzip, Zstd };

Compression compression_of(const fs::path& path) {
    const std::string ext = path.extension().string();
    if (ext == ".gz") return Compression::Gzip;
    if (ext == ".zst") return Compression::Zstd;
    return Compression::None;
}

CorpusFormat format_of(const fs::path& path) {
    if (path.extension() == ".parquet") return CorpusFormat::Parquet;
    const fs::path inner = compression_of(path) == Compression::None ? path : path.stem();
    return inner.extension() == ".jsonl" ? CorpusFormat::JsonLines : CorpusFormat::Text;
}

// The bytes of one file, decompressed; counts what it consumed of the file as stored.
class ByteSource {
  public:
    // `input_bytes`: how much of a compressed file is read at a time.
    explicit ByteSource(const fs::path& path, std::size_t input_bytes = std::size_t{1} << 20)
        : path_(path), compression_(compression_of(path)), in_(input_bytes) {
        file_.reset(std::fopen(path.c_str(), "rb"));
        if (!file_) fail(std::strerror(errno));
        if (compression_ == Compression::Gzip) {
            gz_ = inflateInit2(&z_, 15 + 32) == Z_OK;  // 32: gzip or zlib header
            if (!gz_) fail("cannot start zlib");
        } else if (compression_ == Compression::Zstd) {
            zstd_ = ZSTD_createDStream();
            if (zstd_ == nullptr) fail("cannot start zstd");
        }
    }
    ~ByteSource() {
        if (gz_) inflateEnd(&z_);
        if (zstd_ != nullptr) ZSTD_freeDStream(zstd_);
    }
    ByteSource(const ByteSource&) = delete;
    ByteSource& operator=(const ByteSource&) = delete;

    // Up to `capacity` bytes into `out`; 0 at the end.
    std::size_t read(char* out, std::size_t capacity) {
        if (compression_ == Compression::None) return read_stored(out, capacity);
        for (;;) {
            if (in_begin_ == in_end_ && !eof_) {
                in_begin_ = 0;
                in_end_ = read_stored(in_.data(), in_.size());
                eof_ = in_end_ == 0;
            }
            const std::size_t made = compression_ == Compression::Gzip ? inflate_some(out, capacity)
                                                                       : zstd_some(out, capacity);
            if (made > 0) return made;
            if (eof_ && in_begin_ == in_end_) {
                if (!stream_ended_) fail("truncated compressed data");
                return 0;
            }
        }
    }
    [[nodiscard]] std::uint64_t stored_read() const { return stored_; }

  private:
    [[noreturn]] void fail(const std::string& why) const {
        throw InputError(path_.string() + ": " + why);
    }
    std::size_t read_stored(char* out, std::size_t capacity) {
        const std::size_t got = std::fread(out, 1, capacity, file_.get());
        if (got < capacity && std::ferror(file_.get())) fail(std::strerror(errno));
        stored_ += got;
        return got;
    }
    std::size_t inflate_some(char* out, std::size_t capacity) {
        if (stream_ended_) {
            if (in_begin_ == in_end_) return 0;
            // Concatenated gzip members (as `cat a.gz b.gz`) continue the stream.
            if (inflateReset(&z_) != Z_OK) fail("corrupt gzip data");
            stream_ended_ = false;
        }
        z_.next_in = reinterpret_cast<Bytef*>(in_.data() + in_begin_);
        z_.avail_in = static_cast<uInt>(in_end_ - in_begin_);
        z_.next_out = reinterpret_cast<Bytef*>(out);
        z_.avail_out = static_cast<uInt>(std::min<std::size_t>(capacity, 1u << 30));
        const int code = inflate(&z_, Z_NO_FLUSH);
        if (code != Z_OK && code != Z_STREAM_END && code != Z_BUF_ERROR) {
            fail(std::string("corrupt gzip data") +
                 (z_.msg != nullptr ? ": " + std::string(z_.msg) : ""));
        }
        in_begin_ = in_end_ - z_.avail_in;
        if (code == Z_STREAM_END) stream_ended_ = true;
        return static_cast<std::size_t>(reinterpret_cast<char*>(z_.next_out) - out);
    }
    std::size_t zstd_some(char* out, std::size_t capacity) {
        ZSTD_inBuffer input{in_.data() + in_begin_, in_end_ - in_begin_, 0};
        ZSTD_outBuffer output{out, capacity, 0};
        const std::size_t code = ZSTD_decompressStream(zstd_, &output, &input);
        if (ZSTD_isError(code) != 0)
            fail("corrupt zstd data: " + std::string(ZSTD_getErrorName(code)));
        in_begin_ += input.pos;
        // A frame is complete (a call that consumed and produced nothing says nothing new).
        if (input.pos > 0 || output.pos > 0) stream_ended_ = code == 0;
        return output.pos;
    }

    fs::path path_;
    Compression compression_;
    // Members, so that a constructor failing after fopen still closes the file.
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> file_{nullptr, &std::fclose};
    z_stream z_{};
    bool gz_ = false;
    ZSTD_DStream* zstd_ = nullptr;
    std::vector<char> in_;
    std::size_t in_begin_ = 0, in_end_ = 0;
    bool eof_ = false;
    bool stream_ended_ = false;
    std::uint64_t stored_ = 0;
};

constexpr std::size_t kReadChunk = std::size_t{1} << 20;
// Plain text with no safe cut in this much is refused rather than held whole.
constexpr std::size_t kMaxPieceBytes = std::size_t{64} << 20;
// How much of a text input is looked at for a binary file's signature when the corpus is listed.
constexpr std::size_t kSniffBytes = 64;

std::int32_t le32_at(std::string_view bytes) {
    std::int32_t value = 0;
    std::memcpy(&value, bytes.data(), sizeof(value));
    return value;
}

// Refuses a text or JSON Lines file whose first (decompressed) bytes are binary.
void check_text(const CorpusFile& file) {
    if (file.format == CorpusFormat::Parquet || file.bytes == 0) return;
    ByteSource source(file.path, 4096);
    std::string head(kSniffBytes, '\0');
    std::size_t got = 0;
    try {
        for (std::size_t n;
             got < head.size() && (n = source.read(head.data() + got, head.size() - got)) > 0;)
            got += n;
    } catch (const InputError&) {
        return;  // corrupt compressed data: reading it says so, with the whole story
    }
    head.resize(got);
    if (const std::optional<std::string> what = binary_content(head))
        throw InputError(file.path.string() + ": " + *what);
}

CorpusFile corpus_file(const fs::path& path) {
    std::error_code ec;
    const std::uintmax_t bytes = fs::file_size(path, ec);
    if (ec) throw InputError(path.string() + ": " + ec.message());
    CorpusFile file{path, format_of(path), bytes};
    check_text(file);
    return file;
}

bool is_glob_pattern(const std::string& text) {
    return text.find_first_of("*?[") != std::string::npos;
}

// The paths a glob(3) pattern matches, sorted (none: empty).
std::vector<fs::path> glob_matches(const std::string& pattern, const std::string& flag) {
    glob_t matches{};
    const int rc = ::glob(pattern.c_str(), 0, nullptr, &matches);
    const std::unique_ptr<glob_t, decltype(&::globfree)> guard(&matches, &::globfree);
    if (rc != 0 && rc != GLOB_NOMATCH)
        throw InputError(flag + " '" + pattern + "': " +
                         (rc == GLOB_ABORTED ? "a directory could not be read" : "out of memory"));
    std::vector<fs::path> paths(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
    std::sort(paths.begin(), paths.end());
    return paths;
}

}  // namespace

std::optional<std::string> binary_content(std::string_view head) {
    const auto starts = [&](std::string_view magic) { return head.starts_with(magic); };
    if (starts("PAR1"))
        return "a Parquet file (it starts with PAR1), not text: Parquet is read from files named "
               "*.parquet";
    if (starts("PARE")) return "an encrypted Parquet file (it starts with PARE), not text";
    if (starts("\x1f\x8b"))
        return "gzip-compressed data, not text: name it .gz to have it decompressed";
    if (starts("\x28\xb5\x2f\xfd"))
        return "zstd-compressed data, not text: name it .zst to have it decompressed";
    if (starts("GGUF")) return "a GGUF model file, not text";
    if (starts("GPT2STA")) return "a train_gpt2 resume state file, not text";
    if (head.size() >= 4) {
        const std::int32_t magic = le32_at(head);
        if (magic == kShardMagic)
            return "an llm.c token shard (magic " + std::to_string(kShardMagic) +
                   "), not text: train on shards with --train-data";
        if (magic == kMultipleChoiceMagic)
            return "llm.c's multiple-choice evaluation file (magic " +
                   std::to_string(kMultipleChoiceMagic) + "), not text";
        // llm.c's model files and this project's checkpoints (formats/checkpoint.hpp, a later
        // layer), and llm.c's tokenizer file.
        if (magic == 20240326) return "a model checkpoint (llm.c's magic 20240326), not text";
        if (magic == 20240328) return "llm.c's tokenizer file (magic 20240328), not text";
    }
    if (const std::size_t nul = head.find('\0'); nul != std::string_view::npos)
        return "binary data (a NUL byte at byte " + std::to_string(nul) + "), not text";
    return std::nullopt;
}

std::vector<CorpusFile> list_corpus_files(std::span<const fs::path> inputs, const std::string& glob,
                                          std::string_view input_flag) {
    const std::string flag(input_flag);
    std::vector<CorpusFile> files;
    std::vector<fs::path> expanded;
    for (const fs::path& input : inputs) {
        std::error_code ec;
        if (fs::exists(input, ec) || !is_glob_pattern(input.string())) {
            expanded.push_back(input);
            continue;
        }
        const std::vector<fs::path> matches = glob_matches(input.string(), flag);
        if (matches.empty())
            throw InputError(flag + " '" + input.string() + "': no files match the pattern");
        expanded.insert(expanded.end(), matches.begin(), matches.end());
    }
    for (const fs::path& input : expanded) {
        std::error_code ec;
        const fs::file_status status = fs::status(input, ec);
        if (ec || !fs::exists(status))
            throw InputError(flag + " " + input.string() + ": no such file or directory");
        if (!fs::is_directory(status)) {
            files.push_back(corpus_file(input));
            continue;
        }
        std::vector<fs::path> found;
        for (fs::recursive_directory_iterator it(input, ec), end; !ec && it != end;
             it.increment(ec)) {
            if (!it->is_regular_file()) continue;
            if (::fnmatch(glob.c_str(), it->path().filename().c_str(), 0) == 0)
                found.push_back(it->path());
        }
        if (ec) throw InputError(flag + " " + input.string() + ": " + ec.message());
        if (found.empty()) {
            throw InputError(flag + " " + input.string() + ": no files" +
                             (glob == "*" ? std::string() : " matching --glob '" + glob + "'"));
        }
        std::sort(found.begin(), found.end());
        for (const fs::path& path : found)
            files.push_back(corpus_file(path));
    }
    return files;
}

std::uint64_t uncompressed_bytes(const CorpusFile& file) {
    if (compression_of(file.path) == Compression::None) return file.bytes;
    ByteSource source(file.path);
    std::vector<char> buffer(kReadChunk);
    std::uint64_t total = 0;
    for (std::size_t got; (got = source.read(buffer.data(), buffer.size())) > 0;)
        total += got;
    return total;
}

struct DocumentReader::Impl {
    std::vector<CorpusFile> files;
    DocumentReaderOptions options;
    std::size_t file = 0;                // the file being read
    std::unique_ptr<ByteSource> source;  // of files[file]
    std::uint64_t stored_done = 0;       // stored bytes of the files before it
    std::string pending;                 // read, not yet returned
    std::size_t head = 0;                // JSON Lines: bytes of pending already consumed
    std::size_t scanned = 0;             // plain text: positions of pending checked for a cut
    std::size_t last_safe = 0;           // plain text: the largest safe one found (0: none)
    bool file_ended = false;             // source has nothing more
    std::uint64_t line = 0;              // JSONL: lines taken from this file
    std::uint64_t document = 0;          // next document's index
    std::uint64_t piece = 0;             // next piece's index
    std::uint64_t offset = 0;            // plain text: bytes of the document already returned
    bool in_document = false;            // plain text: a piece of this file was returned
    bool past_cut = false;               // plain text: the next piece starts after the forced cut
    std::uint64_t skipped = 0;
    std::string first_skipped;
    std::optional<DocumentPiece> rest;       // JSON Lines: the part of a cut document after the cut
    std::unique_ptr<ParquetReader> parquet;  // of files[file] when it is Parquet
    ParquetRecord record;                    // the Parquet row or JSON line being read
    std::uint64_t parquet_null_rows = 0;     // of the Parquet files before this one
    std::uint64_t parquet_null_messages = 0;

    bool fill() {  // reads one more chunk into pending; false at the end of the file
        if (file_ended) return false;
        if (head > 0) {  // drop consumed lines once per read, not once per line
            pending.erase(0, head);
            head = 0;
        }
        const std::size_t old = pending.size();
        pending.resize(old + kReadChunk);
        const std::size_t got = source->read(pending.data() + old, kReadChunk);
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
    void open_next_file() {
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
        source = std::make_unique<ByteSource>(files[file].path);
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
    bool safe(std::string_view text, std::size_t p) const {
        return !options.safe_cut || options.safe_cut(text, p);
    }
    void emit(DocumentPiece& out, std::size_t length, bool first) {
        out.text.assign(pending, 0, length);
        out.spans.clear();
        pending.erase(0, length);
        scanned = 0;
        last_safe = 0;
        out.document = document;
        out.index = piece++;
        out.first = first;
    }
    // Cuts a whole JSON Lines document where the options say (see DocumentReaderOptions), keeping
    // the part after the cut as the next piece.
    void cut_document(DocumentPiece& whole) {
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
            if (before.empty() || before.back().end < p)
                before.push_back(TextSpan{p, span.trained});
            after.spans.push_back(TextSpan{span.end - p, span.trained});
        }
        whole.spans = std::move(before);
        whole.text.resize(p);
        rest = std::move(after);
    }
    // `out`, its text set, as the next whole document (JSON Lines or Parquet), cut where the
    // options say.
    void whole_document(DocumentPiece& out) {
        out.document = document++;
        out.index = piece++;
        out.first = true;
        out.offset = 0;
        out.after_cut = false;
        if (out.document == options.cut_document) cut_document(out);
    }
    bool next_plain(DocumentPiece& out);
    bool next_jsonl(DocumentPiece& out);
    bool next_parquet(DocumentPiece& out);
    // A JSON Lines object as a record (its string field; without one, unless the field was given,
    // prompt/response, prompt/completion or a chat), or why it is none.
    [[nodiscard]] std::string jsonl_record(const nlohmann::json& object, ParquetRecord& out) const;
    // Counts a bad line or row, or (not skipping) stops with it.
    void bad_input(const std::string& where) {
        if (!options.skip_bad_lines) {
            throw InputError(where + " (--skip-bad-lines skips such " +
                             (files[file].format == CorpusFormat::Parquet ? "rows" : "lines") +
                             ", counted)");
        }
        if (skipped++ == 0) first_skipped = where;
    }
};

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

std::string DocumentReader::Impl::jsonl_record(const nlohmann::json& object,
                                               ParquetRecord& out) const {
    const auto string_field = [&object](const char* name) -> const nlohmann::json* {
        const auto field = object.find(name);
        return field != object.end() && field->is_string() ? &*field : nullptr;
    };
    out.messages.clear();
    if (const auto field = object.find(options.text_field);
        field != object.end() && field->is_string()) {
        out.kind = ParquetRecordKind::Text;
        out.text = field->get<std::string>();
        return {};
    }
    const std::string none = "no string field '" + options.text_field + "'";
    if (options.text_field_given) return none;
    const nlohmann::json* prompt = string_field("prompt");
    if (prompt != nullptr) {
        if (const nlohmann::json* response = string_field("response")) {
            out.kind = ParquetRecordKind::PromptResponse;
            out.prompt = prompt->get<std::string>();
            out.response = response->get<std::string>();
            return {};
        }
        if (const nlohmann::json* completion = string_field("completion")) {
            out.kind = ParquetRecordKind::PromptCompletion;
            out.prompt = prompt->get<std::string>();
            out.response = completion->get<std::string>();
            return {};
        }
    }
    auto chat = object.find("messages");
    if (chat == object.end()) chat = object.find("conversations");
    if (chat == object.end() || !chat->is_array()) {
        return none + " (nor prompt/response, prompt/completion, or a chat's \"messages\")";
    }
    for (std::size_t i = 0; i < chat->size(); ++i) {
        const nlohmann::json& message = (*chat)[i];
        const auto field = [&message](const char* a, const char* b) -> const nlohmann::json* {
            if (!message.is_object()) return nullptr;
            for (const char* name : {a, b}) {
                const auto it = message.find(name);
                if (it != message.end() && it->is_string()) return &*it;
            }
            return nullptr;
        };
        const nlohmann::json* role = field("role", "from");
        const nlohmann::json* content = field("content", "value");
        if (role == nullptr || content == nullptr) {
            return "message " + std::to_string(i + 1) +
                   " of the chat has no string role and content (or from and value)";
        }
        out.messages.push_back(ChatMessage{role->get<std::string>(), content->get<std::string>()});
    }
    if (out.messages.empty()) return "the chat has no messages";
    out.kind = ParquetRecordKind::Chat;
    return {};
}

bool DocumentReader::Impl::next_jsonl(DocumentPiece& out) {
    for (;;) {
        std::size_t newline = pending.find('\n', head);
        while (newline == std::string::npos) {
            const std::size_t searched = pending.size() - head;  // fill() moves it to the front
            if (!fill()) break;
            newline = pending.find('\n', searched);
        }
        if (newline == std::string::npos && head == pending.size()) {
            ++file;
            open_next_file();
            return false;  // caller moves on to the next file
        }
        const std::size_t length = (newline == std::string::npos ? pending.size() : newline) - head;
        ++line;
        std::string_view text(pending.data() + head, length);
        head = std::min(pending.size(), head + length + 1);
        if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
        if (text.find_first_not_of(" \t") == std::string_view::npos) continue;  // blank line
        std::string reason;
        try {
            const nlohmann::json object = nlohmann::json::parse(text);
            if (!object.is_object()) {
                reason = "not a JSON object";
            } else {
                reason = jsonl_record(object, record);
            }
        } catch (const nlohmann::json::exception& e) {
            // nlohmann's message names the byte; invalid UTF-8 in a string is one of these.
            reason = std::string("not valid JSON (") + e.what() + ")";
        }
        if (!reason.empty()) {
            bad_input(files[file].path.string() + ":" + std::to_string(line) + ": " + reason);
            continue;
        }
        if (options.require_responses && record.kind == ParquetRecordKind::Text) {
            throw InputError(files[file].path.string() + ":" + std::to_string(line) +
                             ": a plain text document (field '" + options.text_field +
                             "'), which has no response to train: the loss on the response only "
                             "needs prompt/response or chat records (--loss-on all trains on "
                             "every token)");
        }
        record_text(record, out.text);
        record_spans(record, out.spans);
        whole_document(out);
        return true;
    }
}

bool DocumentReader::Impl::next_parquet(DocumentPiece& out) {
    while (parquet->next(record)) {
        if (!record.problem.empty()) {
            bad_input(files[file].path.string() + ": row " + std::to_string(record.row + 1) + ": " +
                      record.problem);
            continue;
        }
        if (options.require_responses && record.kind == ParquetRecordKind::Text) {
            throw InputError(files[file].path.string() + ": " + parquet->layout().description +
                             " holds plain text, which has no response to train: the loss on "
                             "the response only needs prompt/response or chat records (--loss-on "
                             "all trains on every token)");
        }
        record_text(record, out.text);
        record_spans(record, out.spans);
        whole_document(out);
        return true;
    }
    ++file;
    open_next_file();
    return false;  // caller moves on to the next file
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
