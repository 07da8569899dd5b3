#include "data/prepare/shard_writer.hpp"

#include <cstdio>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "data/shard.hpp"

namespace gpt2 {

namespace fs = std::filesystem;

fs::path shard_path(const fs::path& dir, std::string_view name, std::string_view split,
                    std::int64_t index) {
    char number[24];
    std::snprintf(number, sizeof(number), "%06lld", static_cast<long long>(index));
    std::string file(name);
    file += '_';
    file += split;
    file += '_';
    file += number;
    file += ".bin";
    return dir / file;
}

int remove_shards(const fs::path& dir, std::string_view name) {
    std::error_code ignored;
    int removed = 0;
    for (const char* split : {"train", "val"}) {
        for (int i = 0;; ++i) {
            const fs::path shard = shard_path(dir, name, split, i);
            fs::remove(mask_path(shard), ignored);
            if (!fs::remove(shard, ignored)) break;
            ++removed;
        }
    }
    return removed;
}

int count_shards(const fs::path& dir, std::string_view name) {
    std::error_code ignored;
    int count = 0;
    for (const char* split : {"train", "val"}) {
        for (int i = 0; fs::exists(shard_path(dir, name, split, i), ignored); ++i)
            ++count;
    }
    return count;
}

ShardWriter::ShardWriter(fs::path dir, std::string name, std::string split,
                         std::int64_t shard_tokens, std::int64_t shards, std::int64_t tokens,
                         ShardPosition resume, OnWritten on_written, bool masked)
    : dir_(std::move(dir)),
      name_(std::move(name)),
      split_(std::move(split)),
      shard_tokens_(static_cast<std::size_t>(shard_tokens)),
      on_written_(std::move(on_written)),
      shards_(shards),
      written_(tokens),
      resume_(resume),
      next_(resume),
      masked_(masked) {}

bool ShardWriter::add(std::uint64_t piece, std::span<const std::int32_t> tokens,
                      std::span<const std::uint8_t> mask) {
    const std::size_t skip = piece == resume_.piece ? resume_.skip : 0;
    if (skip > tokens.size()) throw std::logic_error("resume position past the piece");
    if (masked_ != !mask.empty() || (masked_ && mask.size() != tokens.size()))
        throw std::logic_error("ShardWriter: a mask must come with every token, and only then");
    if (masked_)
        mask_buffer_.insert(mask_buffer_.end(), mask.begin() + static_cast<std::ptrdiff_t>(skip),
                            mask.end());
    marks_.push_back(Mark{piece, buffered_total_, skip});
    for (std::size_t i = skip; i < tokens.size(); ++i)
        buffer_.push_back(static_cast<std::uint16_t>(tokens[i]));
    buffered_total_ += tokens.size() - skip;
    last_piece_ = piece;
    bool wrote = false;
    while (buffer_.size() >= shard_tokens_) {
        write(shard_tokens_);
        wrote = true;
    }
    return wrote;
}

void ShardWriter::flush() {
    if (!buffer_.empty()) write(buffer_.size());
}

fs::path ShardWriter::path(std::int64_t index) const {
    return shard_path(dir_, name_, split_, index);
}

void ShardWriter::write(std::size_t count) {
    const fs::path file = path(shards_);
    if (masked_) {
        write_shard_mask(mask_path(file),
                         std::span<const std::uint8_t>(mask_buffer_.data(), count));
        mask_buffer_.erase(mask_buffer_.begin(),
                           mask_buffer_.begin() + static_cast<std::ptrdiff_t>(count));
    }
    write_shard(file, std::span<const std::uint16_t>(buffer_.data(), count));
    if (on_written_) on_written_(file, count);
    buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<std::ptrdiff_t>(count));
    ++shards_;
    written_ += static_cast<std::int64_t>(count);
    flushed_total_ += count;
    // The first unwritten token: in the last piece that starts at or before it, or the piece
    // after the last one seen.
    while (marks_.size() > 1 && marks_[1].start <= flushed_total_)
        marks_.pop_front();
    if (flushed_total_ >= buffered_total_) {
        next_ = ShardPosition{last_piece_ + 1, 0};
        marks_.clear();
    } else {
        next_ = ShardPosition{marks_[0].piece, marks_[0].skip + (flushed_total_ - marks_[0].start)};
    }
}

}  // namespace gpt2
