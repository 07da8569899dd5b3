// One split's llm.c shards as prepare_data writes them: tokens (and, with a loss mask, each token's
// mask byte) collect up to the shard size, each full shard is written atomically at once (its mask
// file first, so that a shard on disk always has its mask), and the writer tracks where in the
// corpus the first token not yet in a shard is (what --resume continues from).
#pragma once

#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gpt2 {

// Where a split's next unwritten token is: the corpus piece (DocumentPiece::index) and how many
// of its tokens are already in shards (what a resumed run skips).
struct ShardPosition {
    std::uint64_t piece = 0;
    std::uint64_t skip = 0;
};

// dir/NAME_SPLIT_NNNNNN.bin, the shard `index` of a split ("train" or "val").
[[nodiscard]] std::filesystem::path shard_path(const std::filesystem::path& dir,
                                               std::string_view name, std::string_view split,
                                               std::int64_t index);

// Removes the shards of an earlier preparation named `name` in dir (each split's, numbered from 0
// until one is missing) and their mask files; returns how many shards were removed.
int remove_shards(const std::filesystem::path& dir, std::string_view name);
// How many shards of a preparation named `name` are in dir (each split's, from 0 until one is
// missing): what remove_shards would remove.
[[nodiscard]] int count_shards(const std::filesystem::path& dir, std::string_view name);

class ShardWriter {
  public:
    // Called after each shard is written, with its path and token count (for the log).
    using OnWritten = std::function<void(const std::filesystem::path& file, std::size_t tokens)>;

    // Shards of at most shard_tokens tokens into dir. A resumed split starts with the `shards`
    // shards of `tokens` tokens already written, and skips the corpus before `resume`.
    ShardWriter(std::filesystem::path dir, std::string name, std::string split,
                std::int64_t shard_tokens, std::int64_t shards, std::int64_t tokens,
                ShardPosition resume, OnWritten on_written = {}, bool masked = false);

    // Whether this piece's tokens are all in shards already (a resumed run skips it unread).
    [[nodiscard]] bool done_before(std::uint64_t piece) const { return piece < resume_.piece; }

    // Adds a piece's tokens (ids 0..65535), in corpus order, with their mask bytes when the writer
    // is masked (mask.size() == tokens.size()); returns whether a shard was written.
    bool add(std::uint64_t piece, std::span<const std::int32_t> tokens,
             std::span<const std::uint8_t> mask = {});
    [[nodiscard]] bool masked() const { return masked_; }
    // Writes the tokens still buffered as a last, shorter shard.
    void flush();

    [[nodiscard]] std::int64_t shards() const { return shards_; }
    [[nodiscard]] std::int64_t tokens() const { return written_; }
    [[nodiscard]] ShardPosition next() const { return next_; }
    [[nodiscard]] std::filesystem::path path(std::int64_t index) const;

  private:
    struct Mark {
        std::uint64_t piece;
        std::uint64_t start;  // in this run's buffered tokens
        std::uint64_t skip;   // tokens of the piece before it
    };
    void write(std::size_t count);

    std::filesystem::path dir_;
    std::string name_;
    std::string split_;
    std::size_t shard_tokens_;
    OnWritten on_written_;
    std::int64_t shards_;
    std::int64_t written_;
    ShardPosition resume_;
    ShardPosition next_;
    bool masked_;
    std::vector<std::uint16_t> buffer_;
    std::vector<std::uint8_t> mask_buffer_;
    std::deque<Mark> marks_;
    std::uint64_t buffered_total_ = 0;
    std::uint64_t flushed_total_ = 0;
    std::uint64_t last_piece_ = 0;
};

}  // namespace gpt2
