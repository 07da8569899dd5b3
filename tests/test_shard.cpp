// Tests of llm.c token shards: byte layout, write/map round trips, and every kind of bad file.
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "data/prepare/shard_writer.hpp"
#include "data/shard.hpp"
#include "scratch_files.hpp"

namespace fs = std::filesystem;
using gpt2::InputError;
using gpt2::MappedShard;

namespace {

void put_le32(std::string& bytes, std::size_t offset, std::int32_t value) {
    for (int b = 0; b < 4; ++b) {
        bytes[offset + b] =
            static_cast<char>((static_cast<std::uint32_t>(value) >> (8 * b)) & 0xFF);
    }
}

class Shard : public ::testing::Test {
  protected:
    void SetUp() override {
        scratch_.emplace(std::string("shard_test_") +
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
        dir_ = scratch_->path();
    }

    // The message of the InputError that mapping path throws; fails the test if none is thrown.
    static std::string map_error(const fs::path& path) {
        try {
            const MappedShard shard(path);
        } catch (const InputError& e) {
            return e.what();
        }
        ADD_FAILURE() << "no InputError for " << path;
        return {};
    }

    // A valid shard's bytes with tokens 0..count-1.
    std::string good_shard_bytes(int count) {
        std::vector<std::int32_t> tokens(count);
        for (int i = 0; i < count; ++i)
            tokens[i] = i;
        gpt2::write_shard(dir_ / "good.bin", tokens);
        return gpt2::read_text_file(dir_ / "good.bin");
    }

    void expect_map_error(const std::string& bytes, std::string_view needle) {
        const fs::path path = dir_ / "bad.bin";
        gpt2::test::write_bytes(path, bytes);
        const std::string message = map_error(path);
        EXPECT_NE(message.find(path.string()), std::string::npos) << message;
        EXPECT_NE(message.find(needle), std::string::npos) << message;
    }

    std::optional<gpt2::test::ScratchDir> scratch_;
    fs::path dir_;
};

}  // namespace

TEST_F(Shard, WriteThenMapRoundTrips) {
    const std::vector<std::int32_t> tokens = {0, 1, 50256, 65535, 198, 42};
    const fs::path path = dir_ / "data_train_000000.bin";
    gpt2::write_shard(path, tokens);
    const MappedShard shard(path);
    EXPECT_EQ(shard.path(), path);
    ASSERT_EQ(shard.tokens().size(), tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i)
        EXPECT_EQ(shard.tokens()[i], tokens[i]);
    // No temporary file is left behind.
    EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(Shard, ByteLayoutIsLlmcs) {
    const std::vector<std::int32_t> tokens = {0x1234, 7};
    gpt2::write_shard(dir_ / "s.bin", tokens);
    const std::string bytes = gpt2::read_text_file(dir_ / "s.bin");
    ASSERT_EQ(bytes.size(), 1024u + 2 * tokens.size());
    std::string expected(1024, '\0');
    put_le32(expected, 0, 20240520);
    put_le32(expected, 4, 1);
    put_le32(expected, 8, 2);
    expected += std::string("\x34\x12\x07\x00", 4);
    EXPECT_EQ(bytes, expected);
}

TEST_F(Shard, OverwritesAnExistingShard) {
    gpt2::write_shard(dir_ / "s.bin", std::vector<std::int32_t>{1, 2, 3});
    gpt2::write_shard(dir_ / "s.bin", std::vector<std::int32_t>{4});
    const MappedShard shard(dir_ / "s.bin");
    ASSERT_EQ(shard.tokens().size(), 1u);
    EXPECT_EQ(shard.tokens()[0], 4);
}

TEST_F(Shard, WriteRejectsIdsThatDoNotFitUint16AndEmptyShards) {
    const fs::path path = dir_ / "s.bin";
    EXPECT_THROW(gpt2::write_shard(path, std::vector<std::int32_t>{1, 65536}), InputError);
    EXPECT_THROW(gpt2::write_shard(path, std::vector<std::int32_t>{-1}), InputError);
    EXPECT_THROW(gpt2::write_shard(path, std::vector<std::int32_t>{}), InputError);
    try {
        gpt2::write_shard(path, std::vector<std::int32_t>{5, 70000});
    } catch (const InputError& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find("70000"), std::string::npos) << message;
        EXPECT_NE(message.find("position 1"), std::string::npos) << message;
        EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    }
    EXPECT_FALSE(fs::exists(path));
    EXPECT_THROW(gpt2::write_shard(dir_ / "no_such_dir" / "s.bin", std::vector<std::int32_t>{1}),
                 InputError);
}

TEST_F(Shard, MissingFile) {
    const std::string message = map_error(dir_ / "missing.bin");
    EXPECT_NE(message.find("does not exist"), std::string::npos) << message;
    EXPECT_NE(message.find("missing.bin"), std::string::npos) << message;
}

TEST_F(Shard, Directory) {
    const std::string message = map_error(dir_);
    EXPECT_NE(message.find("is a directory"), std::string::npos) << message;
}

TEST_F(Shard, EmptyFile) {
    expect_map_error("", "empty");
}

TEST_F(Shard, ShorterThanTheHeader) {
    expect_map_error(std::string(100, '\0'), "too small");
}

TEST_F(Shard, WrongMagic) {
    std::string bytes = good_shard_bytes(10);
    put_le32(bytes, 0, 20240328);  // a tokenizer file's magic
    expect_map_error(bytes, "wrong magic 20240328");
}

TEST_F(Shard, WrongVersion) {
    std::string bytes = good_shard_bytes(10);
    put_le32(bytes, 4, 2);
    expect_map_error(bytes, "wrong shard version 2");
}

TEST_F(Shard, SizeMismatch) {
    const std::string bytes = good_shard_bytes(10);
    expect_map_error(bytes.substr(0, bytes.size() - 1), "size mismatch");
    expect_map_error(bytes + "xx", "size mismatch");
    std::string wrong_count = bytes;
    put_le32(wrong_count, 8, 11);
    expect_map_error(wrong_count, "size mismatch");
}

TEST_F(Shard, NoTokens) {
    std::string bytes = good_shard_bytes(1).substr(0, 1024);
    put_le32(bytes, 8, 0);
    expect_map_error(bytes, "token count is 0");
    put_le32(bytes, 8, -5);
    expect_map_error(bytes, "token count is -5");
}

TEST_F(Shard, MoveTransfersTheMapping) {
    gpt2::write_shard(dir_ / "a.bin", std::vector<std::int32_t>{1, 2});
    gpt2::write_shard(dir_ / "b.bin", std::vector<std::int32_t>{3});
    MappedShard a(dir_ / "a.bin");
    MappedShard moved(std::move(a));
    EXPECT_EQ(moved.tokens().size(), 2u);
    EXPECT_TRUE(
        a.tokens().empty());  // NOLINT(bugprone-use-after-move): checks the moved-from state
    MappedShard b(dir_ / "b.bin");
    moved = std::move(b);
    ASSERT_EQ(moved.tokens().size(), 1u);
    EXPECT_EQ(moved.tokens()[0], 3);
    std::vector<MappedShard> shards;
    shards.emplace_back(dir_ / "a.bin");
    shards.emplace_back(dir_ / "b.bin");
    EXPECT_EQ(shards[0].tokens()[1], 2);
}

TEST_F(Shard, ValidateTokenRange) {
    const std::vector<std::uint16_t> tokens = {0, 5, 64, 3};
    EXPECT_NO_THROW(gpt2::validate_token_range(tokens, 65, "x.bin"));
    try {
        gpt2::validate_token_range(tokens, 64, "x.bin");
        ADD_FAILURE() << "no InputError";
    } catch (const InputError& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find("x.bin"), std::string::npos) << message;
        EXPECT_NE(message.find("token id 64 at position 2"), std::string::npos) << message;
        EXPECT_NE(message.find("vocab size 64"), std::string::npos) << message;
    }
}

TEST_F(Shard, ExpandPatternSortsMatches) {
    for (const char* name :
         {"d_train_000002.bin", "d_train_000000.bin", "d_val_000000.bin", "d_train_000001.bin"}) {
        gpt2::write_shard(dir_ / name, std::vector<std::int32_t>{1});
    }
    const std::vector<fs::path> paths =
        gpt2::expand_shard_pattern((dir_ / "d_train_*.bin").string());
    ASSERT_EQ(paths.size(), 3u);
    EXPECT_EQ(paths[0], dir_ / "d_train_000000.bin");
    EXPECT_EQ(paths[1], dir_ / "d_train_000001.bin");
    EXPECT_EQ(paths[2], dir_ / "d_train_000002.bin");
    // A plain file name is a pattern that matches itself.
    EXPECT_EQ(gpt2::expand_shard_pattern((dir_ / "d_val_000000.bin").string()).size(), 1u);
}

TEST_F(Shard, ExpandPatternWithoutMatchesIsAnError) {
    const std::string pattern = (dir_ / "nothing_*.bin").string();
    try {
        (void)gpt2::expand_shard_pattern(pattern);
        ADD_FAILURE() << "no InputError";
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find(pattern), std::string::npos) << e.what();
    }
}

// The writer's bookkeeping: the shards are the concatenated tokens cut every shard_tokens, and a
// writer resumed from any shard's recorded position (skipping what it says is written) ends with
// exactly the shards of an uninterrupted run.
TEST_F(Shard, AResumedWriterWritesTheShardsOfAnUninterruptedOne) {
    // Pieces of 0..8 tokens (an empty one too), ids unique across the corpus; several span shards.
    std::vector<std::vector<std::int32_t>> pieces;
    std::vector<std::int32_t> all;
    for (int p = 0, id = 0; p < 12; ++p) {
        pieces.emplace_back();
        for (int i = 0; i < (p * 5) % 9; ++i, ++id) {
            pieces.back().push_back(id);
            all.push_back(id);
        }
    }
    constexpr std::int64_t kShardTokens = 3;
    const auto write_all = [&](const fs::path& dir, std::int64_t shards, std::int64_t tokens,
                               gpt2::ShardPosition from, std::int64_t stop_after) {
        fs::create_directories(dir);
        gpt2::ShardWriter writer(dir, "c", "train", kShardTokens, shards, tokens, from);
        for (std::size_t p = 0; p < pieces.size(); ++p) {
            if (writer.done_before(p)) continue;
            if (writer.add(p, pieces[p]) && stop_after > 0 && writer.shards() >= stop_after) {
                return writer;
            }
        }
        writer.flush();
        return writer;
    };
    const gpt2::ShardWriter full = write_all(dir_ / "full", 0, 0, {}, -1);
    const std::int64_t expected_shards =
        (static_cast<std::int64_t>(all.size()) + kShardTokens - 1) / kShardTokens;
    ASSERT_EQ(full.shards(), expected_shards);
    EXPECT_EQ(full.tokens(), static_cast<std::int64_t>(all.size()));
    for (std::int64_t s = 0; s < expected_shards; ++s) {
        const std::string number = std::to_string(s);
        const fs::path path =
            dir_ / "full" / ("c_train_" + std::string(6 - number.size(), '0') + number + ".bin");
        ASSERT_EQ(full.path(s), path);
        const MappedShard shard(path);
        const auto begin = all.begin() + s * kShardTokens;
        const std::vector<std::int32_t> want(begin, std::min(begin + kShardTokens, all.end()));
        EXPECT_TRUE(
            std::equal(want.begin(), want.end(), shard.tokens().begin(), shard.tokens().end()))
            << "shard " << s;
    }
    for (std::int64_t stop = 1; stop < expected_shards; ++stop) {
        const fs::path dir = dir_ / ("stopped" + std::to_string(stop));
        const gpt2::ShardWriter stopped = write_all(dir, 0, 0, {}, stop);
        ASSERT_GE(stopped.shards(), stop);
        const gpt2::ShardWriter resumed =
            write_all(dir, stopped.shards(), stopped.tokens(), stopped.next(), -1);
        EXPECT_EQ(resumed.shards(), full.shards()) << "stopped after " << stop;
        EXPECT_EQ(resumed.tokens(), full.tokens()) << "stopped after " << stop;
        for (std::int64_t s = 0; s < expected_shards; ++s)
            EXPECT_EQ(gpt2::read_text_file(dir / full.path(s).filename()),
                      gpt2::read_text_file(full.path(s)))
                << s;
    }
    // Interrupted after every shard: each run resumes from the position the one before recorded,
    // often in the middle of a piece that an earlier run had also entered in its middle.
    const fs::path dir = dir_ / "every";
    gpt2::ShardWriter last = write_all(dir, 0, 0, {}, 1);
    while (last.tokens() < full.tokens())
        last = write_all(dir, last.shards(), last.tokens(), last.next(), last.shards() + 1);
    EXPECT_EQ(last.shards(), full.shards());
    for (std::int64_t s = 0; s < expected_shards; ++s)
        EXPECT_EQ(gpt2::read_text_file(dir / full.path(s).filename()),
                  gpt2::read_text_file(full.path(s)))
            << s;
}

TEST_F(Shard, ShardNamesAreNumberedWithSixDigitsAndRemovedFromTheFirst) {
    EXPECT_EQ(gpt2::shard_path("d", "tiny", "val", 42), fs::path("d") / "tiny_val_000042.bin");
    EXPECT_EQ(gpt2::shard_path("d", "x", "train", 1234567), fs::path("d") / "x_train_1234567.bin");
    const std::vector<std::int32_t> tokens{1, 2};
    for (const auto* name :
         {"tiny_train_000000.bin", "tiny_train_000001.bin", "tiny_train_000003.bin",
          "tiny_val_000000.bin", "other_val_000000.bin"})
        gpt2::write_shard(dir_ / name, tokens);
    // Numbered from 0 until one is missing: _000003 is not an earlier run's.
    EXPECT_EQ(gpt2::remove_shards(dir_, "tiny"), 3);
    EXPECT_TRUE(fs::exists(dir_ / "tiny_train_000003.bin"));
    EXPECT_TRUE(fs::exists(dir_ / "other_val_000000.bin"));
    EXPECT_FALSE(fs::exists(dir_ / "tiny_val_000000.bin"));
}
