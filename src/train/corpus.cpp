#include "train/corpus.hpp"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/clock.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"
#include "data/documents.hpp"
#include "train/text_format.hpp"

namespace gpt2 {

namespace {

std::unique_ptr<Tokenizer> build_tokenizer(const TrainOptions& o, const TokenizerChoice& choice,
                                           std::string_view text) {
    if (!choice.from_checkpoint.empty()) return deserialize_tokenizer(choice.from_checkpoint);
    if (choice.kind == TokenizerKind::Gpt2) return load_gpt2_tokenizer(o.data.tokenizer_dir);
    if (choice.kind == TokenizerKind::Bpe) return train_bpe_tokenizer(text, o.data.vocab_size);
    return make_char_tokenizer(text);
}

// The tokenizer a GPT-2 preset brought without --tokenizer, which the user did not name.
void log_implied_tokenizer(const TrainOptions& o, const TokenizerChoice& choice) {
    if (!choice.preset_implies) return;
    spdlog::info("tokenizer: {} from {}, as --model {} implies (GPT-2's vocabulary)",
                 tokenizer_kind_name(choice.kind), o.data.tokenizer_dir, o.model.preset);
}

// --attention-within-documents needs an end-of-text token to begin documents with: refused (rank
// 0, before any tokenizing) for a tokenizer without one.
void check_document_masking(const TrainOptions& o, const Tokenizer& tokenizer) {
    if (!o.data.attention_within_documents || tokenizer.eot_id()) return;
    throw UsageError("--attention-within-documents: the " +
                     std::string(tokenizer_kind_name(tokenizer.kind())) +
                     " tokenizer has no end-of-text token to begin documents at (use --tokenizer "
                     "bpe or gpt2)");
}

// What a --data file that prepare_data reads but train_gpt2 does not is ("a Parquet file", "JSON
// Lines", ...), from its name and first bytes; nothing for a plain-text file.
std::optional<std::string> prepared_data_kind(const std::filesystem::path& path) {
    std::string name = path.filename().string();
    std::string compression;
    for (const char* suffix : {".gz", ".zst"}) {
        if (name.ends_with(suffix)) {
            compression = std::string(suffix) == ".gz" ? "gzip-compressed " : "zstd-compressed ";
            name.resize(name.size() - std::string_view(suffix).size());
        }
    }
    if (name.ends_with(".parquet")) return "a Parquet file";
    if (name.ends_with(".jsonl") || name.ends_with(".ndjson") || name.ends_with(".json"))
        return compression + "JSON Lines";
    if (!compression.empty()) return compression + "text";
    std::ifstream in(path, std::ios::binary);
    std::string head(4096, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<std::size_t>(in.gcount()));
    if (head.starts_with("PAR1")) return "a Parquet file";
    if (head.starts_with("\x1f\x8b")) return "gzip-compressed data";
    if (head.starts_with("\x28\xb5\x2f\xfd")) return "zstd-compressed data";
    // JSON Lines: its first line a JSON object (text rarely begins so).
    const std::size_t first = head.find_first_not_of(" \t\r\n");
    if (first != std::string::npos && head[first] == '{') {
        const std::size_t end = head.find('\n', first);
        if (end != std::string::npos &&
            nlohmann::json::accept(std::string_view(head).substr(first, end - first))) {
            return "JSON Lines (its first line is a JSON object)";
        }
    }
    return std::nullopt;
}

std::string read_corpus(const TrainOptions& o) {
    const std::string& path = o.data.data;
    std::error_code ec;
    if (!std::filesystem::exists(path, ec) && !o.was_given("data")) {
        // The default is relative: a program installed elsewhere, or run from another directory.
        throw InputError("--data " + path + " (the default): no such file in " +
                         std::filesystem::current_path(ec).string() +
                         ": give --data FILE (a plain-text corpus), or run from the repository "
                         "root, where scripts/setup.sh places the corpus");
    }
    // Corpora prepare_data reads are never tokenized as characters: their JSON, markup or bytes
    // would become the vocabulary, without the loss masks of prompt/response records.
    if (const std::optional<std::string> kind = prepared_data_kind(path)) {
        std::string stem = std::filesystem::path(path).filename().string();
        stem = stem.substr(0, stem.find('.'));
        if (stem.empty()) stem = "shards";
        throw InputError("--data " + path + " is " + *kind +
                         ": --data reads one plain-text file; build/prepare_data turns such "
                         "files into token shards (with loss masks for prompt/response and chat "
                         "records): build/prepare_data --data " +
                         path + " --tokenizer gpt2 --out-dir data/" + stem +
                         ", then train with --train-data 'data/" + stem +
                         "/*_train_*.bin' --val-data 'data/" + stem +
                         "/*_val_*.bin' (docs/data.md)");
    }
    std::string text = read_text_file(path);
    if (text.empty()) throw InputError("--data " + path + ": the corpus is empty");
    // Text inputs must be text: a Parquet file, a shard or a checkpoint is refused, not tokenized.
    if (const std::optional<std::string> what = binary_content(text))
        throw InputError("--data " + path + ": " + *what);
    return text;
}

// Rank 0 reads and tokenizes; the others receive the tokenizer and the tokens.
void prepare_text_corpus(const TrainOptions& o, const Communicator& comm,
                         const TokenizerChoice& choice, Corpus& corpus) {
    std::vector<std::uint8_t> tokenizer_bytes;
    // 64-bit counts: a corpus may hold more than 2^31 tokens.
    std::vector<std::int64_t> counts(2, 0);
    if (comm.is_root()) {
        const auto start = Clock::now();
        const std::string text = read_corpus(o);
        corpus.tokenizer = build_tokenizer(o, choice, text);
        log_implied_tokenizer(o, choice);
        check_document_masking(o, *corpus.tokenizer);
        std::vector<std::int32_t> tokens;
        try {
            tokens = corpus.tokenizer->encode(text, parse_eot_in_text(o.data.eot_in_text));
        } catch (const InputError& e) {  // a byte outside a char model's alphabet
            throw InputError("--data " + o.data.data + ": " + e.what());
        }
        TokenSplit split = split_tokens(std::move(tokens), o.data.val_fraction);
        corpus.train = std::move(split.train);
        corpus.val = std::move(split.val);
        tokenizer_bytes = corpus.tokenizer->serialize();
        spdlog::info(
            "corpus {}: {} bytes -> {} train + {} val tokens ({} tokenizer, vocab {}) in {:.2f} s",
            o.data.data, with_commas(static_cast<double>(text.size())),
            with_commas(static_cast<double>(corpus.train.size())),
            with_commas(static_cast<double>(corpus.val.size())),
            tokenizer_kind_name(corpus.tokenizer->kind()), corpus.tokenizer->vocab_size(),
            seconds_since(start));
        // A validation split too short for one window only turns validation off (the training
        // loop says so).
        if (corpus.train.size() <= static_cast<std::size_t>(o.batch.seq_len)) {
            throw InputError("--data " + o.data.data +
                             ": too short: " + std::to_string(corpus.train.size()) +
                             " train tokens, training needs more than --seq-len " +
                             std::to_string(o.batch.seq_len));
        }
        counts = {static_cast<std::int64_t>(corpus.train.size()),
                  static_cast<std::int64_t>(corpus.val.size())};
    }
    comm.broadcast_vector(tokenizer_bytes);
    comm.broadcast(std::span<std::int64_t>(counts));
    if (!comm.is_root()) {
        corpus.tokenizer = deserialize_tokenizer(tokenizer_bytes);
        corpus.train.resize(static_cast<std::size_t>(counts[0]));
        corpus.val.resize(static_cast<std::size_t>(counts[1]));
    }
    comm.broadcast(std::span<std::int32_t>(corpus.train));
    comm.broadcast(std::span<std::int32_t>(corpus.val));
    const auto as_bytes = [](std::span<const std::int32_t> v) {
        return std::span(reinterpret_cast<const std::uint8_t*>(v.data()), v.size_bytes());
    };
    spdlog::debug("rank {}: tokenizer {:016x} ({} bytes), train tokens {:016x}, val tokens {:016x}",
                  comm.rank(), checksum64(corpus.tokenizer->serialize()), tokenizer_bytes.size(),
                  checksum64(as_bytes(corpus.train)), checksum64(as_bytes(corpus.val)));
    corpus.train_store.add(std::span<const std::int32_t>(corpus.train));
    corpus.val_store.add(std::span<const std::int32_t>(corpus.val));
}

// Maps the shards' loss masks (SHARD.mask) when they have them; returns whether they do. Either
// every shard, train and validation, has a mask or none: a missing one is refused, naming it.
bool map_masks(Corpus& corpus) {
    const MappedShard* with = nullptr;
    const MappedShard* without = nullptr;
    for (const auto* shards : {&corpus.train_shards, &corpus.val_shards}) {
        for (const MappedShard& shard : *shards)
            (std::filesystem::exists(mask_path(shard.path())) ? with : without) = &shard;
    }
    if (with == nullptr) return false;
    if (without != nullptr) {
        throw InputError(mask_path(without->path()).string() +
                         ": missing, but other shards have a loss mask (" +
                         mask_path(with->path()).string() +
                         "): every shard of a run needs its mask, or none (prepare them with the "
                         "same --loss-on)");
    }
    for (const MappedShard& shard : corpus.train_shards)
        corpus.train_masks.emplace_back(mask_path(shard.path()), shard.tokens().size());
    for (const MappedShard& shard : corpus.val_shards)
        corpus.val_masks.emplace_back(mask_path(shard.path()), shard.tokens().size());
    return true;
}

// Every rank maps the shards itself; rank 0 still decides the tokenizer.
void prepare_shard_corpus(const TrainOptions& o, const Communicator& comm,
                          const TokenizerChoice& choice, Corpus& corpus) {
    std::vector<std::uint8_t> tokenizer_bytes;
    if (comm.is_root()) {
        // The shards' own tokenizer (prepare_data writes tokenizer.bin beside them) unless a
        // checkpoint brings one; GPT-2's tokenizer needs no corpus, so --tokenizer gpt2 also works.
        const std::filesystem::path beside =
            expand_shard_pattern(o.data.train_data).front().parent_path() / "tokenizer.bin";
        if (!choice.from_checkpoint.empty()) {
            corpus.tokenizer = deserialize_tokenizer(choice.from_checkpoint);
            spdlog::info("tokenizer: {} (the checkpoint's own)",
                         tokenizer_kind_name(corpus.tokenizer->kind()));
        } else if (std::filesystem::exists(beside)) {
            corpus.tokenizer = deserialize_tokenizer(read_file_bytes(beside));
            const TokenizerKind shards_kind = corpus.tokenizer->kind();
            const std::string kind(tokenizer_kind_name(shards_kind));
            if (o.was_given("tokenizer") && shards_kind != o.data.tokenizer) {
                throw UsageError("--tokenizer " +
                                 std::string(tokenizer_kind_name(o.data.tokenizer)) +
                                 " contradicts the shards' " + beside.string() + " (" + kind +
                                 ", the tokenizer the shards were made with): drop --tokenizer");
            }
            if (choice.preset_implies && shards_kind != choice.kind) {
                throw UsageError("--model " + o.model.preset +
                                 " is a GPT-2 shape for GPT-2's tokenizer, "
                                 "but the shards' " +
                                 beside.string() + " is " + kind +
                                 ": prepare the shards with --tokenizer gpt2, or give the shape "
                                 "with --n-layer/--n-head/--n-embd");
            }
            spdlog::info("tokenizer: {} from {} (the shards' own)", kind, beside.string());
        } else if (choice.kind == TokenizerKind::Gpt2) {
            corpus.tokenizer = load_gpt2_tokenizer(o.data.tokenizer_dir);
            log_implied_tokenizer(o, choice);
        } else {
            throw InputError("--train-data " + o.data.train_data + ": no " + beside.string() +
                             " (prepare_data writes it) and --tokenizer is not gpt2");
        }
        check_document_masking(o, *corpus.tokenizer);
        tokenizer_bytes = corpus.tokenizer->serialize();
    }
    comm.broadcast_vector(tokenizer_bytes);
    if (!comm.is_root()) corpus.tokenizer = deserialize_tokenizer(tokenizer_bytes);
    for (const auto& path : expand_shard_pattern(o.data.train_data))
        corpus.train_shards.emplace_back(path);
    for (const auto& path : expand_shard_pattern(o.data.val_data))
        corpus.val_shards.emplace_back(path);
    const int vocab = corpus.tokenizer->vocab_size();
    const bool masked = map_masks(corpus);
    for (auto* shards : {&corpus.train_shards, &corpus.val_shards}) {
        const bool train = shards == &corpus.train_shards;
        for (std::size_t i = 0; i < shards->size(); ++i) {
            const MappedShard& shard = (*shards)[i];
            validate_token_range(shard.tokens(), vocab, shard.path());
            TokenStore& store = train ? corpus.train_store : corpus.val_store;
            if (masked) {
                store.add(shard.tokens(),
                          (train ? corpus.train_masks : corpus.val_masks)[i].mask());
            } else {
                store.add(shard.tokens());
            }
        }
    }
    if (masked && comm.is_root()) {
        spdlog::info(
            "loss mask: {} .mask files beside the shards; the loss covers the trained "
            "targets only",
            corpus.train_masks.size() + corpus.val_masks.size());
    }
    const auto T = static_cast<std::uint64_t>(o.batch.seq_len);
    // Validation shards too short for one window only turn validation off (the training loop
    // says so).
    if (corpus.train_store.num_windows(o.batch.seq_len) == 0) {
        throw InputError("--train-data " + o.data.train_data +
                         ": shards hold fewer than --seq-len+1 = " + std::to_string(T + 1) +
                         " tokens");
    }
}

}  // namespace

void prepare_corpus(const TrainOptions& o, const Communicator& comm, const TokenizerChoice& choice,
                    Corpus& corpus) {
    if (o.data.train_data.empty()) {
        prepare_text_corpus(o, comm, choice, corpus);
    } else {
        prepare_shard_corpus(o, comm, choice, corpus);
    }
    if (o.data.attention_within_documents) corpus.document_start = corpus.tokenizer->eot_id();
}

}  // namespace gpt2
