// prepare_data's preparation of shards: the tokenizer (loaded, or made from the corpus), --resume
// and the progress file, then the corpus streamed into train and val shards.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "apps/cli/cli.hpp"
#include "apps/prepare_data/prepare_data.hpp"
#include "apps/prepare_data/progress_line.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"
#include "data/prepare/preparation_progress.hpp"
#include "data/prepare/tokenizer_sample.hpp"

namespace gpt2::prepare_data {

namespace {

namespace fs = std::filesystem;

// Exit code of a run stopped as if interrupted (--stop-after-shards): 128 + SIGINT, as a shell
// reports a run stopped with Ctrl-C.
constexpr int kExitInterrupted = 130;

// `any_cut`: the tokenizer has no pre-tokenizer (char), so text may be cut anywhere. `log_files`:
// say which columns each Parquet file is read by (when they change from file to file).
gpt2::DocumentReader open_reader(const Options& o, const gpt2::CorpusSplit& corpus, bool any_cut,
                                 bool log_files = false) {
    gpt2::DocumentReaderOptions r;
    r.text_field = o.text_field;
    r.text_field_given = o.has("--text-field");
    r.skip_bad_lines = o.skip_bad_lines;
    r.require_responses = o.loss_on == "response";
    if (log_files) {
        r.on_parquet_file = [last = std::string()](const fs::path& file,
                                                   const std::string& columns) mutable {
            if (columns == last) {
                spdlog::debug("{}: Parquet, {}", file.string(), columns);
                return;
            }
            spdlog::info("{}: Parquet, {}{}", file.string(), columns,
                         last.empty() ? "" : " (the files before: " + last + ")");
            last = columns;
        };
    }
    if (!any_cut) {
        r.safe_cut = [](std::string_view text, std::size_t p) {
            return gpt2::is_safe_cut(text, p);
        };
    }
    if (corpus.rule() == gpt2::ValidationRule::LastBytes) {
        r.cut_document = corpus.val_document();
        r.cut_at_byte = corpus.val_from_byte();
    }
    return gpt2::DocumentReader(corpus.files(), r);
}

// The tokenizer: GPT-2's from its files (loaded before the corpus is counted, see run), char's
// alphabet from a pass over the whole corpus, BPE trained on the first --bpe-sample-mb of
// documents (the corpus may not fit in memory).
std::unique_ptr<gpt2::Tokenizer> make_tokenizer(const Options& o, const gpt2::CorpusSplit& corpus) {
    if (o.tokenizer == gpt2::TokenizerKind::Gpt2) return load_gpt2(o);
    gpt2::DocumentReader reader = open_reader(o, corpus, o.tokenizer == gpt2::TokenizerKind::Char);
    if (o.tokenizer == gpt2::TokenizerKind::Char)
        return gpt2::make_char_tokenizer(gpt2::read_alphabet(reader));
    const gpt2::BpeSample sample = gpt2::read_bpe_sample(
        reader, static_cast<std::size_t>(o.bpe_sample_mb * 1e6), !corpus.one_text());
    const auto start = Clock::now();
    auto tokenizer = gpt2::train_bpe_tokenizer(sample.text, o.vocab_size);
    spdlog::info("trained BPE to {} tokens in {:.2f} s on {} ({:.1f} MB, {})",
                 tokenizer->vocab_size(), seconds_since(start),
                 sample.whole ? "the whole corpus" : "the first --bpe-sample-mb of the corpus",
                 static_cast<double>(sample.text.size()) / 1e6,
                 count_of(sample.documents, "document"));
    if (tokenizer->vocab_size() < o.vocab_size) {
        spdlog::warn("the corpus ran out of pairs to merge: vocab size is {}, not {}",
                     tokenizer->vocab_size(), o.vocab_size);
    }
    return tokenizer;
}

// What --resume and the progress file check: the flags that decide the output, the corpus files
// and the tokenizer.bin the preparation wrote.
struct Record {
    std::string settings;  // record_settings()
    std::uint64_t tokenizer_checksum = 0;
};

gpt2::PreparationSettings settings_of(const Options& o) {
    gpt2::PreparationSettings s;
    s.tokenizer = gpt2::tokenizer_kind_name(o.tokenizer);
    if (o.tokenizer == gpt2::TokenizerKind::Bpe) {
        s.vocab_size = o.vocab_size;
        s.bpe_sample_mb = o.bpe_sample_mb;
    }
    s.eot_in_text = o.eot_in_text;
    s.text_field = o.text_field;
    s.val_fraction = o.val_fraction;
    s.val_documents = o.val_documents;
    s.shard_tokens = o.shard_tokens;
    s.loss_on = o.loss_on;
    return s;
}

// The progress of an earlier preparation of this name that this run continues (--resume), or
// nothing for a fresh start. Refuses, before any expensive work, a resume with other flags or
// files (naming the first that differs) and a fresh run over an unfinished preparation that has
// complete shards to lose.
std::optional<gpt2::PreparationProgress> find_earlier(const Options& o,
                                                      std::span<const gpt2::CorpusFile> files) {
    const fs::path progress_file = gpt2::progress_path(o.out_dir, o.name);
    std::optional<gpt2::PreparationProgress> earlier = gpt2::read_progress(progress_file);
    if (!o.resume) {
        if (earlier && !earlier->complete && earlier->shards() > 0) {
            throw gpt2::UsageError("an interrupted preparation named " + o.name + " is in " +
                                   o.out_dir.string() + ": --resume continues it (or remove " +
                                   progress_file.string() + " to start over)");
        }
        if (earlier && !earlier->complete) {
            spdlog::info("starting over: the earlier preparation named {} in {} completed no shard",
                         o.name, o.out_dir.string());
        }
        return std::nullopt;
    }
    if (!earlier) {
        // A run stopped before it wrote anything (by a bad line while reading the corpus for the
        // tokenizer, say): nothing to lose, and the result is the same as a fresh run's.
        spdlog::info(
            "--resume: no {} (nothing of a preparation named {} was kept): starting from "
            "the beginning",
            progress_file.string(), o.name);
        return std::nullopt;
    }
    const std::optional<std::string> difference =
        gpt2::settings_difference(earlier->settings, settings_of(o), files, o.data_flag);
    if (difference) {
        const std::string remedy =
            earlier->complete ? "it is complete: without --resume, a new preparation replaces it "
                                "(one with another tokenizer only with --replace)"
            : earlier->shards() == 0
                ? "it completed no shard: without --resume, a new preparation replaces it"
                : "resume it with the same flags and files, or remove " + progress_file.string() +
                      " to start over";
        throw gpt2::UsageError(
            "--resume: the preparation named " + o.name + " in " + o.out_dir.string() +
            " was made with other flags or files: " + *difference + "; " + remedy);
    }
    return earlier;
}

// The tokenizer a resumed preparation encodes with: the one it wrote, if it is still there.
std::unique_ptr<gpt2::Tokenizer> recorded_tokenizer(const Options& o,
                                                    const gpt2::PreparationProgress& earlier,
                                                    Record& record) {
    const fs::path path = o.out_dir / "tokenizer.bin";
    const std::vector<std::uint8_t> bytes = gpt2::read_file_bytes(path);
    record.tokenizer_checksum = gpt2::checksum64(bytes);
    if (earlier.tokenizer_checksum != 0 &&
        earlier.tokenizer_checksum != record.tokenizer_checksum) {
        throw gpt2::InputError(path.string() + " is not the tokenizer the preparation named " +
                               o.name + " started with (another preparation in " +
                               o.out_dir.string() +
                               " replaced it?): without --resume, a new preparation starts over");
    }
    return gpt2::deserialize_tokenizer(bytes);
}

// llm.c's tokenizer file (a decode table: each token's bytes, and the end-of-text token, which
// llm.c's programs start generating from) where it means what it says: GPT-2's is llm.c's own
// gpt2_tokenizer.bin, a BPE's gets a name of its own; the char tokenizer has no end-of-text
// token, so it gets none. A file of the other name, an earlier tokenizer's, is removed.
void write_llmc_tokenizer_file(const Options& o, const gpt2::Tokenizer& tokenizer) {
    const fs::path gpt2_path = o.out_dir / "gpt2_tokenizer.bin";
    const fs::path bpe_path = o.out_dir / "llmc_bpe_tokenizer.bin";
    const gpt2::TokenizerKind kind = tokenizer.kind();
    const fs::path* const path = kind == gpt2::TokenizerKind::Gpt2  ? &gpt2_path
                                 : kind == gpt2::TokenizerKind::Bpe ? &bpe_path
                                                                    : nullptr;
    for (const fs::path* stale : {&gpt2_path, &bpe_path}) {
        std::error_code ignored;
        if (stale != path && fs::remove(*stale, ignored)) {
            spdlog::info("removed {}, an earlier tokenizer's llm.c file", stale->string());
        }
    }
    if (path == nullptr) {
        spdlog::info(
            "no llm.c tokenizer file: its format needs an end-of-text token (llm.c starts "
            "generating from it), which the char tokenizer has not");
        return;
    }
    try {
        gpt2::write_llmc_tokenizer(tokenizer, *path);
    } catch (const gpt2::InputError& e) {
        // Only token length limits fail here; the shards and tokenizer.bin are still usable.
        spdlog::warn("skipped llm.c's tokenizer file: {}", e.what());
        return;
    }
    if (kind == gpt2::TokenizerKind::Gpt2) {
        spdlog::info("wrote {} (llm.c's tokenizer file)", path->string());
    } else {
        spdlog::info(
            "wrote {} (this BPE in llm.c's tokenizer format: llm.c's programs read it renamed "
            "gpt2_tokenizer.bin)",
            path->string());
    }
}

// The shards of every preparation in --out-dir are read with its one tokenizer.bin: a preparation
// of another name there (its progress file) must not see it replaced by a different tokenizer.
void check_shared_tokenizer(const Options& o, const gpt2::Tokenizer& tokenizer,
                            std::span<const std::uint8_t> bytes) {
    const fs::path path = o.out_dir / "tokenizer.bin";
    if (!fs::exists(path)) return;
    const std::vector<std::uint8_t> present = gpt2::read_file_bytes(path);
    if (std::equal(present.begin(), present.end(), bytes.begin(), bytes.end())) return;
    // The earlier preparation of this name was made with another tokenizer: a run trained on its
    // shards (which resumes by reading them again) would lose them. Replaced only when asked.
    const bool earlier = fs::exists(gpt2::progress_path(o.out_dir, o.name)) ||
                         gpt2::count_shards(o.out_dir, o.name) > 0;
    if (earlier && !o.replace) {
        std::string theirs = "unreadable";
        try {
            const std::unique_ptr<gpt2::Tokenizer> read = gpt2::deserialize_tokenizer(present);
            theirs = fmt::format("{}, {} tokens", gpt2::tokenizer_kind_name(read->kind()),
                                 read->vocab_size());
        } catch (const gpt2::InputError&) {  // unreadable: still not this run's
        }
        throw gpt2::UsageError(fmt::format(
            "--out-dir {} holds the shards of a preparation named {} made with another tokenizer "
            "(tokenizer.bin: {}; this run: {}, {} tokens), which a run trained on them needs: "
            "give another --out-dir or --name, or --replace to replace them",
            o.out_dir.string(), o.name, theirs, gpt2::tokenizer_kind_name(tokenizer.kind()),
            tokenizer.vocab_size()));
    }
    constexpr std::string_view kSuffix = ".progress.json";
    for (const auto& entry : fs::directory_iterator(o.out_dir)) {
        const std::string file = entry.path().filename().string();
        if (!file.ends_with(kSuffix)) continue;
        const std::string other = file.substr(0, file.size() - kSuffix.size());
        if (other == o.name) continue;
        throw gpt2::UsageError(fmt::format(
            "--out-dir {} holds the preparation named {}, whose shards need its tokenizer.bin, "
            "which this run's tokenizer ({} with {} tokens) would replace: give another --out-dir, "
            "or --name {} to replace that preparation",
            o.out_dir.string(), other, gpt2::tokenizer_kind_name(tokenizer.kind()),
            tokenizer.vocab_size(), other));
    }
}

// A fresh preparation first removes an earlier one of the same name, so that its shards can never
// sit beside this run's tokenizer, even if this run is interrupted; then it writes the tokenizer,
// so that a resumed run encodes with exactly this one.
void start_fresh(const Options& o, const gpt2::Tokenizer& tokenizer, Record& record) {
    const std::vector<std::uint8_t> bytes = tokenizer.serialize();
    check_shared_tokenizer(o, tokenizer, bytes);
    std::error_code ignored;
    fs::remove(gpt2::progress_path(o.out_dir, o.name), ignored);
    if (const int removed = gpt2::remove_shards(o.out_dir, o.name); removed > 0) {
        spdlog::info("removed {} of an earlier preparation named {} in {}",
                     count_of(static_cast<std::uint64_t>(removed), "shard"), o.name,
                     o.out_dir.string());
    }
    const fs::path tokenizer_path = o.out_dir / "tokenizer.bin";
    gpt2::write_file_atomically(tokenizer_path, bytes);
    record.tokenizer_checksum = gpt2::checksum64(bytes);
    spdlog::info("wrote {}", tokenizer_path.string());
    write_llmc_tokenizer_file(o, tokenizer);
}

gpt2::ShardWriter open_writer(const Options& o, const char* split,
                              const std::optional<gpt2::PreparationProgress>& progress) {
    gpt2::SplitProgress from;
    if (progress) from = std::string_view(split) == "train" ? progress->train : progress->val;
    return gpt2::ShardWriter(
        o.out_dir, o.name, split, o.shard_tokens, from.shards, from.tokens, from.next,
        [](const fs::path& file, std::size_t tokens) {
            spdlog::debug("wrote {} ({} tokens)", file.string(), tokens);
        },
        o.loss_on == "response");
}

// Streams the corpus into the writers, recording progress after every shard. An error after some
// shards were written says that they are kept.
gpt2::ShardStreamTotals stream_shards(const Options& o, const gpt2::CorpusSplit& corpus,
                                      const gpt2::Tokenizer& tokenizer, const Record& record,
                                      gpt2::DocumentReader& reader, gpt2::ShardWriter& train,
                                      gpt2::ShardWriter& val,
                                      gpt2::prepare_data::ProgressLine& display) {
    const fs::path progress_file = gpt2::progress_path(o.out_dir, o.name);
    gpt2::ShardStreamOptions stream;
    stream.threads = encoding_threads(o);
    stream.eot_in_text = gpt2::parse_eot_in_text(o.eot_in_text);
    stream.loss_mask = o.loss_on == "response";
    // llm.c: each document starts with the end-of-text token.
    if (!corpus.one_text()) stream.document_start = tokenizer.eot_id();
    stream.is_val = [&corpus](const gpt2::DocumentPiece& p) { return corpus.is_val(p); };
    stream.on_shard = [&] {
        gpt2::write_progress(progress_file, record.settings, record.tokenizer_checksum, train, val,
                             false);
        return o.stop_after_shards <= 0 || train.shards() + val.shards() < o.stop_after_shards;
    };
    stream.on_batch = [&](std::uint64_t bytes, std::uint64_t documents, std::uint64_t tokens) {
        display.update(bytes, documents, tokens);
    };
    try {
        return gpt2::stream_into_shards(reader, tokenizer, train, val, stream);
    } catch (const gpt2::InputError& e) {
        if (train.shards() + val.shards() == 0) throw;
        throw gpt2::InputError(std::string(e.what()) + "; " + kept_shards(o, train, val));
    }
}

// --loss-on when not given: response when the corpus's first document is a prompt/response or chat
// record (a loss mask beside each shard), all otherwise (no mask, the shards as llm.c's).
std::string default_loss_on(const Options& o, std::span<const gpt2::CorpusFile> files) {
    if (files.empty() || files.front().format == gpt2::CorpusFormat::Text) return "all";
    gpt2::DocumentReaderOptions r;
    r.text_field = o.text_field;
    r.text_field_given = o.has("--text-field");
    r.skip_bad_lines = true;  // the first good record decides; the real pass reports bad ones
    gpt2::DocumentReader reader(std::vector<gpt2::CorpusFile>(files.begin(), files.begin() + 1), r);
    gpt2::DocumentPiece first;
    if (!reader.next(first) || first.spans.empty()) return "all";
    spdlog::info(
        "{}: prompt/response or chat records: the loss is on the responses only, a mask beside "
        "each shard (--loss-on all trains on every token)",
        files.front().path.string());
    return "response";
}

}  // namespace

// The shards: returns the exit code (kExitInterrupted when --stop-after-shards stopped it).
int prepare_shards(Options o) {
    const auto started = Clock::now();
    std::vector<gpt2::CorpusFile> files = gpt2::list_corpus_files(o.inputs, o.glob, o.data_flag);
    check_flags_against_files(o, files);
    if (o.loss_on.empty()) o.loss_on = default_loss_on(o, files);
    create_out_dir(o.out_dir);
    const fs::path progress_file = gpt2::progress_path(o.out_dir, o.name);
    const std::optional<gpt2::PreparationProgress> earlier = find_earlier(o, files);
    if (earlier && earlier->complete) {
        spdlog::info("{}: this preparation is already complete", progress_file.string());
        return app::kExitOk;
    }
    Record record;
    record.settings = gpt2::record_settings(settings_of(o), files);
    // The tokenizers that need no pass over the corpus come first: a missing file is found at once.
    std::unique_ptr<gpt2::Tokenizer> tokenizer_owner;
    if (earlier) {
        tokenizer_owner = recorded_tokenizer(o, *earlier, record);
    } else if (o.tokenizer == gpt2::TokenizerKind::Gpt2) {
        tokenizer_owner = load_gpt2(o);
    }
    const gpt2::CorpusSplit corpus(std::move(files), {o.val_fraction, o.val_documents, o.text_field,
                                                      o.has("--text-field"), o.skip_bad_lines});
    if (corpus.documents() == 0u)
        throw gpt2::InputError(o.data_flag + ": the corpus has no documents");
    if (!tokenizer_owner) tokenizer_owner = make_tokenizer(o, corpus);
    const gpt2::Tokenizer& tokenizer = *tokenizer_owner;
    if (tokenizer.vocab_size() > 65536) {
        throw gpt2::InputError("--vocab-size: " + std::to_string(tokenizer.vocab_size()) +
                               " tokens do not fit llm.c's uint16 shards (at most 65536)");
    }
    spdlog::info("tokenizer: {} with {} tokens", gpt2::tokenizer_kind_name(tokenizer.kind()),
                 tokenizer.vocab_size());
    spdlog::info("{}", corpus.describe());
    if (!earlier) start_fresh(o, tokenizer, record);
    gpt2::ShardWriter train = open_writer(o, "train", earlier);
    gpt2::ShardWriter val = open_writer(o, "val", earlier);
    if (earlier) {
        spdlog::info("resuming after {} train and {} val shards", train.shards(), val.shards());
    } else {
        // From now on a stopped run (a bad line, Ctrl-C) leaves what --resume needs, even before
        // its first shard.
        gpt2::write_progress(progress_file, record.settings, record.tokenizer_checksum, train, val,
                             false);
    }
    if (!corpus.one_text() && !tokenizer.eot_id()) {
        spdlog::warn("the char tokenizer has no end-of-text token: documents are concatenated");
    }
    gpt2::DocumentReader reader =
        open_reader(o, corpus, tokenizer.kind() == gpt2::TokenizerKind::Char, true);
    gpt2::prepare_data::ProgressLine display(corpus.stored_bytes());
    const gpt2::ShardStreamTotals totals =
        stream_shards(o, corpus, tokenizer, record, reader, train, val, display);
    if (totals.stopped) {
        spdlog::warn("stopped as if interrupted (--stop-after-shards); {}",
                     kept_shards(o, train, val));
        return kExitInterrupted;
    }
    if (totals.documents == 0)
        throw gpt2::InputError(o.data_flag + ": the corpus has no documents");
    train.flush();
    val.flush();
    check_splits(o, corpus, totals.documents, train, val);
    gpt2::write_progress(progress_file, record.settings, record.tokenizer_checksum, train, val,
                         true);
    log_summary(o, corpus, totals, reader, train, val, started);
    return app::kExitOk;
}

}  // namespace gpt2::prepare_data
