// prepare_data's summary lines: the shards kept after a stop, and at the end what was prepared
// (documents, tokens, speed), what was skipped, and the loss mask.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>

#include "apps/prepare_data/prepare_data.hpp"

namespace gpt2::prepare_data {

std::string kept_shards(const Options& o, const gpt2::ShardWriter& train,
                        const gpt2::ShardWriter& val) {
    const auto shards = static_cast<std::uint64_t>(train.shards() + val.shards());
    return fmt::format("{} {} kept in {}: --resume continues after {}",
                       count_of(shards, "complete shard"), shards == 1 ? "is" : "are",
                       o.out_dir.string(), shards == 1 ? "it" : "them");
}

void log_summary(const Options& o, const gpt2::CorpusSplit& corpus,
                 const gpt2::ShardStreamTotals& totals, const gpt2::DocumentReader& reader,
                 const gpt2::ShardWriter& train, const gpt2::ShardWriter& val,
                 Clock::time_point started) {
    if (reader.skipped_lines() > 0) {
        spdlog::warn("skipped {} (--skip-bad-lines); the first: {}",
                     count_of(reader.skipped_lines(), "bad line"), reader.first_skipped());
    }
    if (reader.null_rows() > 0 || reader.null_messages() > 0) {
        spdlog::info(
            "Parquet: skipped {} with no text (null, or a conversation without a message "
            "that has both role and content){}",
            count_of(reader.null_rows(), "row"),
            reader.null_messages() == 0
                ? std::string()
                : "; left out " + count_of(reader.null_messages(), "message") +
                      " without role or content");
    }
    const double seconds = seconds_since(started);
    const double text_mb = static_cast<double>(totals.text_bytes) / 1e6;
    spdlog::info(
        "prepared {} from {} ({:.1f} MB as stored, {:.1f} MB of text) in {:.2f} s ({:.2f} MB/s) on "
        "{}: train {} in {}, val {} in {} ({:.1f}% of the tokens), in {}",
        count_of(totals.documents, "document"), count_of(corpus.files().size(), "file"),
        static_cast<double>(corpus.stored_bytes()) / 1e6, text_mb, seconds,
        seconds > 0 ? text_mb / seconds : 0.0,
        count_of(static_cast<std::uint64_t>(encoding_threads(o)), "thread"),
        count_of(static_cast<std::uint64_t>(train.tokens()), "token"),
        count_of(static_cast<std::uint64_t>(train.shards()), "shard"),
        count_of(static_cast<std::uint64_t>(val.tokens()), "token"),
        count_of(static_cast<std::uint64_t>(val.shards()), "shard"),
        100.0 * static_cast<double>(val.tokens()) /
            static_cast<double>(std::max<std::int64_t>(1, train.tokens() + val.tokens())),
        o.out_dir.string());
    if (o.loss_on == "response") {
        spdlog::info(
            "loss mask: {} trained of {} this run wrote (the responses and each example's "
            "end-of-text), in a .mask file beside each shard",
            count_of(totals.trained_tokens, "token"), count_of(totals.tokens_added, "token"));
    }
}

}  // namespace gpt2::prepare_data
