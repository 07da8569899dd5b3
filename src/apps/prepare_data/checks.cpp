// prepare_data's checks of the command line: flags the mode or the tokenizer does not use, flags
// the corpus files make pointless, and splits too small for the validation flags.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "apps/prepare_data/prepare_data.hpp"
#include "core/error.hpp"

namespace gpt2::prepare_data {

namespace fs = std::filesystem;

// Flags the mode or the tokenizer does not use: refused with --hellaswag, which prepares no shards
// (the user meant something else), warned about otherwise; two flags that choose the same thing
// are refused. Never silently ignored.
void check_flags(const Options& o) {
    if (!o.hellaswag.empty()) {
        for (const char* flag :
             {"--data", "--glob", "--text-field", "--skip-bad-lines", "--vocab-size",
              "--bpe-sample-mb", "--eot-in-text", "--val-fraction", "--val-documents",
              "--shard-tokens", "--resume", "--replace", "--stop-after-shards"}) {
            if (o.has(flag)) {
                throw gpt2::UsageError(std::string(flag) +
                                       " does not apply with --hellaswag, which writes only "
                                       "llm.c's evaluation file (prepare shards in a run of "
                                       "their own)");
            }
        }
        if (o.has("--threads")) spdlog::warn("--threads does not apply with --hellaswag; ignored");
        return;
    }
    if (o.inputs.empty()) throw gpt2::UsageError("--data is required (or --hellaswag)");
    if (o.name.empty() || o.name.find('/') != std::string::npos || o.name == "." ||
        o.name == "..") {
        throw gpt2::UsageError("--name '" + o.name +
                               "': a name for the shards, not a path (they go to --out-dir)");
    }
    if (o.has("--val-fraction") && o.has("--val-documents") && o.val_documents > 0) {
        throw gpt2::UsageError(fmt::format(
            "--val-fraction {} and --val-documents {} both choose the validation split: give one",
            o.val_fraction, o.val_documents));
    }
    for (const char* flag : {"--vocab-size", "--bpe-sample-mb"}) {
        if (o.tokenizer != gpt2::TokenizerKind::Bpe && o.has(flag)) {
            spdlog::warn("{} only applies to --tokenizer bpe; ignored", flag);
        }
    }
    if (o.tokenizer != gpt2::TokenizerKind::Gpt2 && o.has("--tokenizer-dir")) {
        spdlog::warn("--tokenizer-dir only applies to --tokenizer gpt2; ignored");
    }
    if (o.tokenizer == gpt2::TokenizerKind::Char && o.has("--eot-in-text")) {
        spdlog::warn(
            "--eot-in-text does not apply to --tokenizer char, which has no end-of-text token (a "
            "literal <|endoftext|> is its characters); ignored");
    }
}

// What the corpus files make of the flags: those for JSON Lines and Parquet with no such file,
// --glob with no directory, a .json or .ndjson file (read as plain text: JSON Lines must be named
// .jsonl).
void check_flags_against_files(const Options& o, std::span<const gpt2::CorpusFile> files) {
    const bool any_records = std::any_of(files.begin(), files.end(), [](const gpt2::CorpusFile& f) {
        return f.format != gpt2::CorpusFormat::Text;
    });
    for (const std::string& flag : {o.text_flag, std::string("--skip-bad-lines")}) {
        const std::string documented = flag == o.text_flag ? "--text-field" : flag;
        if (!any_records && o.has(documented)) {
            spdlog::warn(
                "{} only applies to JSON Lines and Parquet, and no input is either (their names "
                "end in .jsonl, .jsonl.gz, .jsonl.zst or .parquet); ignored",
                flag);
        }
    }
    if (o.loss_on == "response") {
        for (const gpt2::CorpusFile& f : files) {
            if (f.format == gpt2::CorpusFormat::Text) {
                throw gpt2::UsageError(
                    "--loss-on response: " + f.path.string() +
                    " is plain text, which has no response to train (prompt/response and chat "
                    "records come in .jsonl and .parquet files); --loss-on all trains on every "
                    "token");
            }
        }
    }
    if (o.has("--glob") &&
        std::none_of(o.inputs.begin(), o.inputs.end(),
                     [](const fs::path& input) { return fs::is_directory(input); })) {
        spdlog::warn("--glob only applies to directories given to {}; ignored", o.data_flag);
    }
    for (const gpt2::CorpusFile& f : files) {
        fs::path inner = f.path;
        if (inner.extension() == ".gz" || inner.extension() == ".zst") inner = inner.stem();
        if (f.format == gpt2::CorpusFormat::Text &&
            (inner.extension() == ".json" || inner.extension() == ".ndjson")) {
            spdlog::warn(
                "{} is read as plain text, one document (JSON Lines are read line by line only "
                "from files named .jsonl, .jsonl.gz or .jsonl.zst)",
                f.path.string());
        }
    }
}

// Refuses splits left empty by too small a corpus.
void check_splits(const Options& o, const gpt2::CorpusSplit& corpus, std::uint64_t documents,
                  const gpt2::ShardWriter& train, const gpt2::ShardWriter& val) {
    const bool wants_val = corpus.rule() != gpt2::ValidationRule::None;
    if (train.tokens() > 0 && (val.tokens() > 0 || !wants_val)) return;
    const std::string flag = o.val_documents > 0
                                 ? fmt::format("--val-documents {}", o.val_documents)
                                 : fmt::format("--val-fraction {}", o.val_fraction);
    std::string why;
    if (corpus.rule() == gpt2::ValidationRule::LastBytes) {
        why = fmt::format(
            " (the text has no place near its last {}% where it can be cut without changing its "
            "tokens: a newline between two characters that are not spaces); --val-fraction 0 "
            "prepares it without validation",
            o.val_fraction * 100);
    }
    throw gpt2::InputError(fmt::format(
        "{} ({}) {} too few to split with {}: no {} tokens{}", count_of(documents, "document"),
        count_of(static_cast<std::uint64_t>(train.tokens() + val.tokens()), "token"),
        documents == 1 ? "is" : "are", flag, train.tokens() == 0 ? "training" : "validation", why));
}

}  // namespace gpt2::prepare_data
