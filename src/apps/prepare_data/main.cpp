// prepare_data: tokenizes a corpus (text files, JSON Lines, directories of them, gzip/zstd) into
// llm.c token shards, streaming: memory stays bounded by a few shards whatever the corpus size,
// each shard is written atomically as soon as it is full, and --resume continues an interrupted
// preparation after its last complete shard. The tokenizer goes next to the shards, serialized
// (tokenizer.bin) and in llm.c's gpt2_tokenizer.bin format.
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "apps/common/cli.hpp"
#include "core/clock.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"
#include "data/documents.hpp"
#include "data/multiple_choice.hpp"
#include "data/shard.hpp"
#include "tokenizer/tokenizer.hpp"

namespace fs = std::filesystem;

namespace {

using gpt2::Clock;
using gpt2::seconds_since;

struct Options {
    std::vector<fs::path> inputs;
    std::string glob = "*";
    std::string jsonl_field = "text";
    bool skip_bad_lines = false;
    std::string tokenizer;
    int vocab_size = 4096;
    fs::path tokenizer_dir = "data/gpt2";
    double bpe_sample_mb = 256;
    fs::path out_dir;
    std::string name;
    double val_fraction = 0.1;
    std::int64_t val_documents = 0;
    std::int64_t shard_tokens = 100'000'000;
    bool resume = false;
    std::int64_t stop_after_shards = 0;  // testing: act as if interrupted after N shards
    fs::path hellaswag;                  // HellaSwag's JSONL to turn into llm.c's eval file
    int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    std::string eot_in_text = "token";
    std::string log_level = "info";
};

// The corpus as the run sees it: its files, whether it is one plain text (whose validation split
// is its last bytes) or documents (separated by the end-of-text token, split by document).
struct Corpus {
    std::vector<gpt2::CorpusFile> files;
    std::uint64_t stored_bytes = 0;
    bool one_text = false;
    std::uint64_t val_from_byte = 0;  // one text: validation starts at the first safe cut here
};

Corpus describe_corpus(const Options& o) {
    Corpus c;
    c.files = gpt2::list_corpus_files(o.inputs, o.glob);
    for (const gpt2::CorpusFile& f : c.files)
        c.stored_bytes += f.bytes;
    c.one_text = c.files.size() == 1 && !c.files[0].jsonl;
    if (c.one_text && o.val_fraction > 0 && o.val_documents == 0) {
        const std::uint64_t bytes = gpt2::uncompressed_bytes(c.files[0]);
        if (bytes == 0) throw gpt2::InputError(c.files[0].path.string() + ": input file is empty");
        c.val_from_byte = std::max<std::uint64_t>(
            1, static_cast<std::uint64_t>(
                   std::llround(static_cast<double>(bytes) * (1.0 - o.val_fraction))));
    }
    return c;
}

// `any_cut`: the tokenizer has no pre-tokenizer (char), so text may be cut anywhere.
gpt2::DocumentReader open_reader(const Options& o, const Corpus& c, bool any_cut) {
    gpt2::DocumentReaderOptions r;
    r.jsonl_field = o.jsonl_field;
    r.skip_bad_lines = o.skip_bad_lines;
    if (!any_cut) {
        r.safe_cut = [](std::string_view text, std::size_t p) {
            return gpt2::is_safe_cut(text, p);
        };
    }
    r.cut_at_byte = c.val_from_byte;
    return gpt2::DocumentReader(c.files, r);
}

// The tokenizer: GPT-2's from its files, char's alphabet from a pass over the whole corpus, BPE
// trained on the first --bpe-sample-mb of documents (the corpus may not fit in memory).
std::unique_ptr<gpt2::Tokenizer> make_tokenizer(const Options& o, const Corpus& c) {
    if (o.tokenizer == "gpt2") return gpt2::load_gpt2_tokenizer(o.tokenizer_dir);
    gpt2::DocumentReader reader = open_reader(o, c, o.tokenizer == "char");
    gpt2::DocumentPiece piece;
    if (o.tokenizer == "char") {
        std::array<bool, 256> seen{};
        while (reader.next(piece)) {
            for (const char ch : piece.text)
                seen[static_cast<unsigned char>(ch)] = true;
        }
        std::string alphabet;
        for (int byte = 0; byte < 256; ++byte) {
            if (seen[static_cast<std::size_t>(byte)]) alphabet += static_cast<char>(byte);
        }
        return gpt2::make_char_tokenizer(alphabet);
    }
    const auto limit = static_cast<std::size_t>(o.bpe_sample_mb * 1e6);
    std::string sample;
    std::uint64_t documents = 0;
    bool whole = true;
    while (reader.next(piece)) {
        if (sample.size() >= limit) {
            whole = false;
            break;
        }
        // BPE training treats the literal end-of-text text as a document boundary.
        if (piece.first && !c.one_text && !sample.empty()) sample += "<|endoftext|>";
        sample += piece.text;
        if (piece.first) ++documents;
    }
    const auto start = Clock::now();
    auto tokenizer = gpt2::train_bpe_tokenizer(sample, o.vocab_size);
    spdlog::info("trained BPE to {} tokens in {:.2f} s on {} ({:.1f} MB, {} documents)",
                 tokenizer->vocab_size(), seconds_since(start),
                 whole ? "the whole corpus" : "the first --bpe-sample-mb of the corpus",
                 static_cast<double>(sample.size()) / 1e6, documents);
    if (tokenizer->vocab_size() < o.vocab_size) {
        spdlog::warn("the corpus ran out of pairs to merge: vocab size is {}, not {}",
                     tokenizer->vocab_size(), o.vocab_size);
    }
    return tokenizer;
}

struct Interrupted {};

// Where a split's next unwritten token is: the piece and how many of its tokens are already in
// shards (what --resume skips).
struct Position {
    std::uint64_t piece = 0;
    std::uint64_t skip = 0;
};

// One split's shards: tokens collect in a buffer of at most about --shard-tokens, and each full
// shard is written (atomically) at once.
class ShardWriter {
  public:
    ShardWriter(const Options& o, std::string split, std::int64_t shards, std::int64_t tokens,
                Position resume)
        : o_(o),
          split_(std::move(split)),
          shards_(shards),
          written_(tokens),
          resume_(resume),
          next_(resume) {}

    // Whether this piece's tokens are all in shards already (a resumed run skips it unread).
    [[nodiscard]] bool done_before(std::uint64_t piece) const { return piece < resume_.piece; }

    // Returns whether a shard was written.
    bool add(std::uint64_t piece, std::span<const std::int32_t> tokens) {
        const std::size_t skip = piece == resume_.piece ? resume_.skip : 0;
        if (skip > tokens.size()) throw std::logic_error("resume position past the piece");
        marks_.push_back(Mark{piece, buffered_total_, skip});
        for (std::size_t i = skip; i < tokens.size(); ++i)
            buffer_.push_back(static_cast<std::uint16_t>(tokens[i]));
        buffered_total_ += tokens.size() - skip;
        last_piece_ = piece;
        bool wrote = false;
        while (buffer_.size() >= static_cast<std::size_t>(o_.shard_tokens)) {
            write(static_cast<std::size_t>(o_.shard_tokens));
            wrote = true;
        }
        return wrote;
    }
    void flush() {
        if (!buffer_.empty()) write(buffer_.size());
    }
    [[nodiscard]] std::int64_t shards() const { return shards_; }
    [[nodiscard]] std::int64_t tokens() const { return written_; }
    [[nodiscard]] Position next() const { return next_; }
    [[nodiscard]] fs::path path(std::int64_t index) const {
        return o_.out_dir / fmt::format("{}_{}_{:06d}.bin", o_.name, split_, index);
    }

  private:
    struct Mark {
        std::uint64_t piece;
        std::uint64_t start;  // in this run's buffered tokens
        std::uint64_t skip;   // tokens of the piece before it
    };
    void write(std::size_t count) {
        const fs::path file = path(shards_);
        gpt2::write_shard(file, std::span<const std::uint16_t>(buffer_.data(), count));
        spdlog::debug("wrote {} ({} tokens)", file.string(), count);
        buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<std::ptrdiff_t>(count));
        ++shards_;
        written_ += static_cast<std::int64_t>(count);
        flushed_total_ += count;
        // The first unwritten token: in the last piece that starts at or before it, or the
        // piece after the last one seen.
        while (marks_.size() > 1 && marks_[1].start <= flushed_total_)
            marks_.pop_front();
        if (flushed_total_ >= buffered_total_) {
            next_ = Position{last_piece_ + 1, 0};
            marks_.clear();
        } else {
            next_ = Position{marks_[0].piece, marks_[0].skip + (flushed_total_ - marks_[0].start)};
        }
    }

    const Options& o_;
    std::string split_;
    std::int64_t shards_;
    std::int64_t written_;
    Position resume_;
    Position next_;
    std::vector<std::uint16_t> buffer_;
    std::deque<Mark> marks_;
    std::uint64_t buffered_total_ = 0;
    std::uint64_t flushed_total_ = 0;
    std::uint64_t last_piece_ = 0;
};

// What --resume needs, rewritten (atomically) after every shard: the options and files it must
// match, and where each split goes on.
fs::path progress_path(const Options& o) {
    return o.out_dir / (o.name + ".progress.json");
}

std::string fingerprint(const Options& o, const Corpus& c, const gpt2::Tokenizer& tokenizer) {
    nlohmann::json j;
    j["tokenizer"] = gpt2::tokenizer_kind_name(tokenizer.kind());
    j["vocab_size"] = tokenizer.vocab_size();
    j["eot_in_text"] = o.eot_in_text;
    j["jsonl_field"] = o.jsonl_field;
    // Not --skip-bad-lines: a run stopped by a bad line can go on with it (the lines before were
    // read the same way).
    j["val_fraction"] = o.val_fraction;
    j["val_documents"] = o.val_documents;
    j["shard_tokens"] = o.shard_tokens;
    for (const gpt2::CorpusFile& f : c.files)
        j["files"].push_back({f.path.string(), f.bytes});
    return j.dump();
}

void save_progress(const Options& o, const std::string& print, const ShardWriter& train,
                   const ShardWriter& val, bool complete) {
    nlohmann::json j;
    j["fingerprint"] = print;
    j["complete"] = complete;
    for (const ShardWriter* w : {&train, &val}) {
        j[w == &train ? "train" : "val"] = {{"shards", w->shards()},
                                            {"tokens", w->tokens()},
                                            {"piece", w->next().piece},
                                            {"skip", w->next().skip}};
    }
    const std::string text = j.dump(1) + "\n";
    gpt2::write_file_atomically(
        progress_path(o),
        std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
}

// A one-line progress display redrawn in place, only on a terminal (logs never see it).
class Progress {
  public:
    explicit Progress(std::uint64_t total_bytes)
        : total_(total_bytes), enabled_(::isatty(STDERR_FILENO) == 1), start_(Clock::now()) {}
    Progress(const Progress&) = delete;
    Progress& operator=(const Progress&) = delete;
    ~Progress() {
        if (enabled_ && drawn_) std::fputc('\n', stderr);
    }
    void update(std::uint64_t bytes, std::uint64_t documents, std::uint64_t tokens) {
        if (!enabled_) return;
        const double seconds = seconds_since(start_);
        const double rate = seconds > 0 ? static_cast<double>(bytes) / 1e6 / seconds : 0.0;
        const double left =
            rate > 0 ? static_cast<double>(total_ - std::min(total_, bytes)) / 1e6 / rate : 0.0;
        std::fprintf(
            stderr,
            "\r%.0f / %.0f MB (%.1f%%) | %llu documents | %llu tokens | %.1f MB/s | ETA %.0f s   ",
            static_cast<double>(bytes) / 1e6, static_cast<double>(total_) / 1e6,
            total_ > 0 ? 100.0 * static_cast<double>(bytes) / static_cast<double>(total_) : 100.0,
            static_cast<unsigned long long>(documents), static_cast<unsigned long long>(tokens),
            rate, left);
        std::fflush(stderr);
        drawn_ = true;
    }

  private:
    std::uint64_t total_;
    bool enabled_;
    bool drawn_ = false;
    Clock::time_point start_;
};

// Encodes a batch of pieces on `threads` threads (each piece whole, in any order).
void encode_pieces(const gpt2::Tokenizer& tokenizer, std::span<const gpt2::DocumentPiece> pieces,
                   std::span<const bool> wanted, std::vector<std::vector<std::int32_t>>& out,
                   int threads, gpt2::EotInText eot) {
    out.assign(pieces.size(), {});
    std::atomic<std::size_t> next{0};
    std::exception_ptr error;
    std::atomic<bool> failed{false};
    const auto work = [&] {
        for (std::size_t i; !failed && (i = next++) < pieces.size();) {
            if (!wanted[i]) continue;
            try {
                out[i] = tokenizer.encode(pieces[i].text, eot);
            } catch (...) {
                if (!failed.exchange(true)) error = std::current_exception();
            }
        }
    };
    std::vector<std::jthread> pool;
    for (int t = 1; t < threads; ++t)
        pool.emplace_back(work);
    work();
    pool.clear();
    if (error) std::rethrow_exception(error);
}

// HellaSwag's JSONL (ctx, endings, label per line) to llm.c's evaluation file, tokenized as llm.c's
// dev/data/hellaswag.py does: the context as is, each ending after a space, no special tokens.
void build_hellaswag(const Options& o) {
    if (o.tokenizer != "gpt2") {
        throw gpt2::UsageError("--hellaswag needs --tokenizer gpt2 (the models it evaluates)");
    }
    const auto tokenizer = gpt2::load_gpt2_tokenizer(o.tokenizer_dir);
    const std::string text = gpt2::read_text_file(o.hellaswag);
    std::vector<gpt2::MultipleChoiceExample> examples;
    std::size_t line_number = 0;
    for (std::size_t begin = 0; begin < text.size();) {
        std::size_t end = text.find('\n', begin);
        if (end == std::string::npos) end = text.size();
        const std::string_view line(text.data() + begin, end - begin);
        begin = end + 1;
        ++line_number;
        if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
        const std::string where = o.hellaswag.string() + ":" + std::to_string(line_number);
        gpt2::MultipleChoiceExample example;
        try {
            const nlohmann::json record = nlohmann::json::parse(line);
            example.index = static_cast<int>(examples.size());
            example.label = record.at("label").get<int>();
            example.context =
                tokenizer->encode(record.at("ctx").get<std::string>(), gpt2::EotInText::Text);
            for (const auto& ending : record.at("endings")) {
                example.endings.push_back(
                    tokenizer->encode(" " + ending.get<std::string>(), gpt2::EotInText::Text));
            }
        } catch (const nlohmann::json::exception& e) {
            throw gpt2::InputError(where + ": not a HellaSwag example (" + e.what() + ")");
        }
        if (example.endings.empty() || example.label < 0 ||
            example.label >= static_cast<int>(example.endings.size())) {
            throw gpt2::InputError(where + ": label " + std::to_string(example.label) + " of " +
                                   std::to_string(example.endings.size()) + " endings");
        }
        examples.push_back(std::move(example));
    }
    if (examples.empty()) throw gpt2::InputError(o.hellaswag.string() + ": no examples");
    std::error_code ec;
    fs::create_directories(o.out_dir, ec);
    if (ec) throw gpt2::InputError("--out-dir " + o.out_dir.string() + ": " + ec.message());
    fs::path name = o.hellaswag.filename();
    name.replace_extension(".bin");
    const fs::path out = o.out_dir / name;
    gpt2::write_multiple_choice_file(out, examples);
    spdlog::info("wrote {} ({} examples; train_gpt2 --hellaswag {})", out.string(), examples.size(),
                 out.string());
}

void run(Options o) {
    if (o.name.empty()) {
        fs::path stem = o.inputs[0];
        while (stem.has_extension() && (stem.extension() == ".gz" || stem.extension() == ".zst" ||
                                        stem.extension() == ".jsonl" || stem.extension() == ".txt"))
            stem = stem.stem();
        o.name = stem.filename().string();
        if (o.name.empty()) o.name = "corpus";
    }
    const auto start = Clock::now();
    const Corpus corpus = describe_corpus(o);
    std::error_code ec;
    fs::create_directories(o.out_dir, ec);
    if (ec) throw gpt2::InputError("--out-dir " + o.out_dir.string() + ": " + ec.message());

    // A fresh run or the continuation of an interrupted one (same options, same files).
    nlohmann::json progress;
    const fs::path progress_file = progress_path(o);
    if (fs::exists(progress_file)) {
        const std::vector<std::uint8_t> bytes = gpt2::read_file_bytes(progress_file);
        progress = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
        if (progress.is_discarded() || !progress.contains("fingerprint")) {
            throw gpt2::InputError(progress_file.string() + ": not a prepare_data progress file");
        }
    }
    if (o.resume && progress.is_null()) {
        throw gpt2::UsageError("--resume: no " + progress_file.string() + " to continue from");
    }
    if (!o.resume && !progress.is_null() && !progress.value("complete", false)) {
        throw gpt2::UsageError("an interrupted preparation named " + o.name + " is in " +
                               o.out_dir.string() + ": --resume continues it (or remove " +
                               progress_file.string() + " to start over)");
    }
    const fs::path tokenizer_path = o.out_dir / "tokenizer.bin";
    std::unique_ptr<gpt2::Tokenizer> tokenizer =
        o.resume ? gpt2::deserialize_tokenizer(gpt2::read_file_bytes(tokenizer_path))
                 : make_tokenizer(o, corpus);
    if (tokenizer->vocab_size() > 65536) {
        throw gpt2::InputError("--vocab-size: " + std::to_string(tokenizer->vocab_size()) +
                               " tokens do not fit llm.c's uint16 shards (at most 65536)");
    }
    const std::string print = fingerprint(o, corpus, *tokenizer);
    if (o.resume && progress["fingerprint"].get<std::string>() != print) {
        throw gpt2::UsageError("--resume: the inputs or options differ from those of " +
                               progress_file.string() + " (the same files and flags are needed)");
    }
    if (o.resume && progress.value("complete", false)) {
        spdlog::info("{}: this preparation is already complete", progress_file.string());
        return;
    }
    spdlog::info("tokenizer: {} with {} tokens", gpt2::tokenizer_kind_name(tokenizer->kind()),
                 tokenizer->vocab_size());
    if (!o.resume) {
        // A fresh preparation first removes an earlier one of the same name, so that its shards
        // can never sit beside this run's tokenizer, even if this run is interrupted.
        std::error_code ignored;
        fs::remove(progress_file, ignored);
        int removed = 0;
        for (const char* split : {"train", "val"}) {
            for (int i = 0;; ++i) {
                const fs::path old = o.out_dir / fmt::format("{}_{}_{:06d}.bin", o.name, split, i);
                if (!fs::remove(old, ignored)) break;
                ++removed;
            }
        }
        if (removed > 0) {
            spdlog::info("removed {} shards of an earlier preparation named {} in {}", removed,
                         o.name, o.out_dir.string());
        }
        // Then the tokenizer, so that a resumed run encodes with exactly this one.
        gpt2::write_file_atomically(tokenizer_path, tokenizer->serialize());
        spdlog::info("wrote {}", tokenizer_path.string());
        const fs::path llmc_path = o.out_dir / "gpt2_tokenizer.bin";
        try {
            gpt2::write_llmc_tokenizer(*tokenizer, llmc_path);
            spdlog::info("wrote {}", llmc_path.string());
        } catch (const gpt2::InputError& e) {
            // Only token length limits fail here; the shards and tokenizer.bin are still usable.
            spdlog::warn("skipped llm.c's tokenizer file: {}", e.what());
        }
    }

    const auto resumed = [&](const char* split) {
        return progress.is_null() ? Position{}
                                  : Position{progress[split]["piece"].get<std::uint64_t>(),
                                             progress[split]["skip"].get<std::uint64_t>()};
    };
    const auto count = [&](const char* split, const char* what) {
        return progress.is_null() || !o.resume ? std::int64_t{0}
                                               : progress[split][what].get<std::int64_t>();
    };
    ShardWriter train(o, "train", count("train", "shards"), count("train", "tokens"),
                      o.resume ? resumed("train") : Position{});
    ShardWriter val(o, "val", count("val", "shards"), count("val", "tokens"),
                    o.resume ? resumed("val") : Position{});
    if (o.resume) {
        spdlog::info("resuming after {} train and {} val shards", train.shards(), val.shards());
    }
    const std::optional<int> eot = tokenizer->eot_id();
    const bool separate = !corpus.one_text && eot.has_value();
    if (!corpus.one_text && !eot) {
        spdlog::warn("the char tokenizer has no end-of-text token: documents are concatenated");
    }
    const std::uint64_t every =
        o.val_fraction > 0 ? std::max<std::uint64_t>(
                                 1, static_cast<std::uint64_t>(std::llround(1.0 / o.val_fraction)))
                           : 0;
    const auto is_val = [&](const gpt2::DocumentPiece& p) {
        if (o.val_documents > 0) return p.document < static_cast<std::uint64_t>(o.val_documents);
        if (corpus.one_text) return corpus.val_from_byte > 0 && p.offset >= corpus.val_from_byte;
        return every > 0 && p.document % every == 0;
    };
    const gpt2::EotInText eot_mode = gpt2::parse_eot_in_text(o.eot_in_text);

    gpt2::DocumentReader reader =
        open_reader(o, corpus, tokenizer->kind() == gpt2::TokenizerKind::Char);
    Progress display(corpus.stored_bytes);
    constexpr std::size_t kBatchBytes = std::size_t{32} << 20;
    constexpr std::size_t kBatchPieces = 16384;
    std::vector<gpt2::DocumentPiece> batch;
    std::vector<std::vector<std::int32_t>> encoded;
    std::vector<std::int32_t> tokens;
    std::uint64_t documents = 0, text_bytes = 0;
    const auto kept_shards = [&] {
        return fmt::format("{} complete shards are kept in {}: --resume continues after them",
                           train.shards() + val.shards(), o.out_dir.string());
    };
    try {
        for (bool more = true; more;) {
            batch.clear();
            std::size_t bytes = 0;
            while (bytes < kBatchBytes && batch.size() < kBatchPieces) {
                batch.emplace_back();
                if (!reader.next(batch.back())) {
                    batch.pop_back();
                    more = false;
                    break;
                }
                bytes += batch.back().text.size();
            }
            std::unique_ptr<bool[]> wanted = std::make_unique<bool[]>(batch.size());
            for (std::size_t i = 0; i < batch.size(); ++i) {
                const ShardWriter& w = is_val(batch[i]) ? val : train;
                wanted[i] = !w.done_before(batch[i].index);
            }
            encode_pieces(*tokenizer, batch, std::span<const bool>(wanted.get(), batch.size()),
                          encoded, o.threads, eot_mode);
            for (std::size_t i = 0; i < batch.size(); ++i) {
                const gpt2::DocumentPiece& p = batch[i];
                if (p.first) ++documents;
                text_bytes += p.text.size();
                if (!wanted[i]) continue;
                tokens.clear();
                if (separate && p.first)
                    tokens.push_back(*eot);  // llm.c: each document starts with it
                tokens.insert(tokens.end(), encoded[i].begin(), encoded[i].end());
                ShardWriter& w = is_val(p) ? val : train;
                if (w.add(p.index, tokens)) {
                    save_progress(o, print, train, val, false);
                    if (o.stop_after_shards > 0 &&
                        train.shards() + val.shards() >= o.stop_after_shards) {
                        throw Interrupted{};
                    }
                }
            }
            display.update(reader.stored_bytes_read(), documents,
                           static_cast<std::uint64_t>(train.tokens() + val.tokens()));
        }
    } catch (const gpt2::InputError& e) {
        if (train.shards() + val.shards() == 0) throw;
        throw gpt2::InputError(std::string(e.what()) + "; " + kept_shards());
    } catch (const Interrupted&) {
        spdlog::warn("stopped as if interrupted (--stop-after-shards); {}", kept_shards());
        std::exit(130);
    }
    if (documents == 0) throw gpt2::InputError("--input: the corpus has no documents");
    train.flush();
    val.flush();
    if (train.tokens() == 0 || (val.tokens() == 0 && (o.val_fraction > 0 || o.val_documents > 0))) {
        throw gpt2::InputError(fmt::format(
            "{} documents ({} tokens) are too few to split with --val-{} {}: no {} tokens",
            documents, train.tokens() + val.tokens(),
            o.val_documents > 0 ? "documents" : "fraction",
            o.val_documents > 0 ? std::to_string(o.val_documents)
                                : fmt::format("{}", o.val_fraction),
            train.tokens() == 0 ? "training" : "validation"));
    }
    save_progress(o, print, train, val, true);
    if (reader.skipped_lines() > 0) {
        spdlog::warn("skipped {} bad lines (--skip-bad-lines); the first: {}",
                     reader.skipped_lines(), reader.first_skipped());
    }
    const double seconds = seconds_since(start);
    spdlog::info(
        "prepared {} documents from {} files ({:.1f} MB as stored, {:.1f} MB of text) in {:.2f} s "
        "({:.2f} MB/s): train {} tokens in {} shards, val {} tokens in {} shards, in {}",
        documents, corpus.files.size(), static_cast<double>(corpus.stored_bytes) / 1e6,
        static_cast<double>(text_bytes) / 1e6, seconds,
        seconds > 0 ? static_cast<double>(text_bytes) / 1e6 / seconds : 0.0, train.tokens(),
        train.shards(), val.tokens(), val.shards(), o.out_dir.string());
}

}  // namespace

int main(int argc, char** argv) {
    namespace app = gpt2::app;
    CLI::App cli{
        "Tokenizes a corpus (text files, JSON Lines, directories of them; gzip or zstd) "
        "into llm.c token shards plus the tokenizer files, streaming.",
        "prepare_data"};
    cli.option_defaults()->always_capture_default();
    Options options;
    app::add_common_flags(cli, options.log_level);
    cli.add_option("--data,--input", options.inputs,
                   "text or .jsonl files (.gz/.zst too) and directories (recursive, sorted); "
                   "repeat or list several (--input is the older name)")
        ->default_str("");
    cli.add_option("--glob", options.glob, "in directories: only file names matching this");
    cli.add_option("--jsonl-field", options.jsonl_field, "the text field of each .jsonl line");
    cli.add_flag("--skip-bad-lines", options.skip_bad_lines,
                 "skip (and count) .jsonl lines that are not JSON objects with the text field, "
                 "instead of stopping");
    cli.add_option("--tokenizer", options.tokenizer, "char | bpe | gpt2")
        ->required()
        ->check(CLI::IsMember({"char", "bpe", "gpt2"}).description(""))
        ->type_name("NAME");
    cli.add_option("--vocab-size", options.vocab_size,
                   "BPE vocabulary: 256 bytes + merges + <|endoftext|> (257..65536)")
        ->check(app::at_least(257))
        ->check(CLI::Validator(
            [](std::string& value) {
                return std::stod(value) <= 65536 ? std::string()
                                                 : "must be <= 65536 (llm.c's uint16 shards)";
            },
            "", ""));
    cli.add_option("--bpe-sample-mb", options.bpe_sample_mb,
                   "BPE is trained on the corpus's first this many MB")
        ->check(app::positive());
    cli.add_option("--tokenizer-dir", options.tokenizer_dir,
                   "directory with GPT-2's encoder.json and vocab.bpe");
    cli.add_option("--eot-in-text", options.eot_in_text,
                   "a literal <|endoftext|> in the text: token (the end-of-text token) | text "
                   "(ordinary characters, as llm.c's encode_ordinary)")
        ->check(CLI::IsMember({"token", "text"}).description(""))
        ->type_name("MODE");
    cli.add_option("--out-dir", options.out_dir, "output directory")->required();
    cli.add_option("--name", options.name,
                   "shard name prefix (default: the first input's name without extensions)");
    cli.add_option("--val-fraction", options.val_fraction,
                   "validation share (0..0.99): of one text file, its last bytes; of documents, "
                   "every round(1/F)-th document starting with the first")
        ->check(app::at_least(0))
        ->check(CLI::Validator(
            [](std::string& value) {
                return std::stod(value) <= 0.99 ? std::string() : "must be <= 0.99";
            },
            "", ""));
    cli.add_option("--val-documents", options.val_documents,
                   "validation: the first N documents instead (0: use --val-fraction)")
        ->check(app::at_least(0));
    cli.add_option("--shard-tokens", options.shard_tokens, "maximum tokens per shard")
        ->check(app::positive());
    cli.add_flag("--resume", options.resume,
                 "continue an interrupted preparation (same inputs and flags) after its last "
                 "complete shard");
    cli.add_option("--threads", options.threads, "encoding threads")->check(app::positive());
    cli.add_option("--hellaswag", options.hellaswag,
                   "instead of shards: HellaSwag's JSONL (hellaswag_val.jsonl) to llm.c's "
                   "evaluation file in --out-dir, for train_gpt2 --hellaswag");
    cli.add_option("--stop-after-shards", options.stop_after_shards,
                   "testing: stop as if interrupted after writing N shards")
        ->group("");
    if (const std::optional<int> code = app::parse_command_line(cli, argc, argv)) return *code;
    app::setup_logging(options.log_level, app::LogStream::Stderr);
    try {
        if (options.tokenizer != "bpe" && cli.count("--vocab-size") > 0) {
            spdlog::warn("--vocab-size only applies to --tokenizer bpe; ignored");
        }
        if (options.tokenizer != "bpe" && cli.count("--bpe-sample-mb") > 0) {
            spdlog::warn("--bpe-sample-mb only applies to --tokenizer bpe; ignored");
        }
        if (!options.hellaswag.empty()) {
            build_hellaswag(options);
        } else if (options.inputs.empty()) {
            std::cerr << app::error_line("--data is required (or --hellaswag)") << std::endl;
            return app::kExitBadFlags;
        } else {
            run(options);
        }
    } catch (const gpt2::UsageError& e) {
        std::cerr << app::error_line(e.what()) << std::endl;
        return app::kExitBadFlags;
    } catch (const std::exception& e) {
        std::cerr << app::error_line(e.what()) << std::endl;
        return app::kExitRuntimeError;
    }
    return app::kExitOk;
}
