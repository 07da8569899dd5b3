// build/prepare_data as a user runs it: shards equal to tiktoken's ids in both end-of-text modes,
// --data (and the older --input, named in errors as typed), files written atomically (a full disk
// leaves nothing partial), the common command-line voice, --threads as train_gpt2's; many files,
// directories and JSON Lines (gzip, zstd) give the documents' tokens with end-of-text between
// them, split by document, or by bytes when they are fewer than 1/--val-fraction; a long text
// streams in pieces to the same tokens; an interrupted preparation, or one stopped by a bad line,
// resumes to the same shards, and --resume refuses other flags naming them; llm.c's tokenizer file
// only where it means what it says; no flag silently ignored; bad input gets one clear error
// naming file and line.
#include <gtest/gtest.h>

#include <sched.h>
#include <zlib.h>
#include <zstd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "apps/prepare_data/progress_line.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"
#include "data/documents.hpp"
#include "data/prepare/preparation_progress.hpp"
#include "data/shard.hpp"
#include "process_support.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;
using test::expect_same_shards;
using test::run_command;
using test::ScratchDir;
using test::write_bytes;

const fs::path kTestData = GPT2_TEST_DATA_DIR;
const fs::path kGpt2Dir = fs::path(GPT2_SHARED_DATA_DIR) / "gpt2";

std::vector<std::int32_t> read_u16_ids(const fs::path& path) {
    const std::string bytes = read_text_file(path);
    std::vector<std::int32_t> ids(bytes.size() / 2);
    for (std::size_t i = 0; i < ids.size(); ++i) {
        ids[i] = static_cast<unsigned char>(bytes[2 * i]) |
                 (static_cast<unsigned char>(bytes[2 * i + 1]) << 8);
    }
    return ids;
}

std::string six_digits(int i) {
    std::string digits = std::to_string(i);
    return std::string(6 - std::min<std::size_t>(6, digits.size()), '0') + digits;
}

std::string prepare(const std::string& flags) {
    return test::build_path("prepare_data") + " " + flags;
}

TEST(PrepareData, ShardsEqualTiktokensIdsInBothEndOfTextModes) {
    if (!fs::exists(kGpt2Dir / "encoder.json")) GTEST_SKIP() << "no GPT-2 tokenizer files";
    const ScratchDir dir("gpt2-prepare-eot");
    for (const std::string mode : {"token", "text"}) {
        const auto result = run_command(prepare(
            "--data " + (kTestData / "tokenizer_eot.txt").string() +
            " --tokenizer gpt2 --tokenizer-dir " + kGpt2Dir.string() +
            " --val-fraction 0 --name eot --eot-in-text " + mode + " --out-dir " + (dir / mode)));
        ASSERT_EQ(result.exit_code, 0) << result.output;
        const MappedShard shard(dir.path() / mode / "eot_train_000000.bin");
        const std::vector<std::int32_t> ids(shard.tokens().begin(), shard.tokens().end());
        EXPECT_EQ(ids, read_u16_ids(kTestData / ("tokenizer_gpt2_eot_" + mode + ".u16"))) << mode;
    }
}

// The progress line's time left comes from the rate since its first update, and only once two
// seconds of it are behind: a preparation resumed at 31.8% (those bytes skipped at once), or its
// first batch, no longer says "ETA 0 s".
TEST(ProgressLine, TheTimeLeftIsTheRateSinceTheFirstUpdateAfterTwoSeconds) {
    using gpt2::prepare_data::seconds_left;
    EXPECT_FALSE(seconds_left(1000, 318, 330, 0.01).has_value());  // too soon to say
    EXPECT_FALSE(seconds_left(1000, 318, 318, 5.0).has_value());   // nothing read since
    // Resumed at 318 of 1000 bytes: 100 bytes in 2 s since then leaves 582 bytes, 11.64 s.
    EXPECT_DOUBLE_EQ(*seconds_left(1000, 318, 418, 2.0), 11.64);
    EXPECT_DOUBLE_EQ(*seconds_left(1000, 0, 1000, 9.0), 0.0);
}

TEST(PrepareData, InputIsTheOlderNameOfData) {
    const ScratchDir dir("gpt2-prepare-alias");
    test::write_corpus(dir.path() / "corpus.txt", 20000);
    const std::string common = " --tokenizer char --name c --out-dir ";
    ASSERT_EQ(
        run_command(prepare("--data " + (dir / "corpus.txt") + common + (dir / "a"))).exit_code, 0);
    ASSERT_EQ(
        run_command(prepare("--input " + (dir / "corpus.txt") + common + (dir / "b"))).exit_code,
        0);
    for (const char* file : {"c_train_000000.bin", "c_val_000000.bin", "tokenizer.bin"}) {
        const std::string x = read_text_file(dir.path() / "a" / file);
        const std::string y = read_text_file(dir.path() / "b" / file);
        EXPECT_FALSE(x.empty()) << file;
        EXPECT_EQ(x, y) << file;
    }
}

// The shards fit; GPT-2's tokenizer files (about 1 MB) do not: before, tokenizer.bin was
// written in place and left cut short.
TEST(PrepareData, AFullDiskLeavesNoPartialOrTemporaryFile) {
    if (!fs::exists(kGpt2Dir / "encoder.json")) GTEST_SKIP() << "no GPT-2 tokenizer files";
    const ScratchDir dir("gpt2-prepare-full");
    test::write_corpus(dir.path() / "corpus.txt", 20000);
    const test::TinyFileSystem disk(dir.path() / "out", "256k");
    if (!disk.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
    const auto result = run_command(
        prepare("--data " + (dir / "corpus.txt") + " --tokenizer gpt2 --tokenizer-dir " +
                kGpt2Dir.string() + " --name c --out-dir " + (dir / "out")));
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_NE(result.output.find("error: cannot write " + (dir / "out/tokenizer.bin")),
              std::string::npos)
        << result.output;
    EXPECT_NE(result.output.find("No space left on device"), std::string::npos) << result.output;
    for (const auto& entry : fs::directory_iterator(dir.path() / "out")) {
        const std::string name = entry.path().filename().string();
        EXPECT_EQ(name.find(".tmp."), std::string::npos) << name;
        EXPECT_NE(name, "tokenizer.bin") << "a partial tokenizer.bin was left";
    }
}

// Every shard of a split in order, concatenated.
std::vector<std::int32_t> split_tokens(const fs::path& dir, const std::string& name,
                                       const std::string& split) {
    std::vector<std::int32_t> all;
    for (int i = 0; fs::exists(dir / (name + "_" + split + "_" + six_digits(i) + ".bin")); ++i) {
        const MappedShard shard(dir / (name + "_" + split + "_" + six_digits(i) + ".bin"));
        all.insert(all.end(), shard.tokens().begin(), shard.tokens().end());
    }
    return all;
}

std::vector<std::string> test_documents() {
    std::vector<std::string> docs;
    for (int i = 0; i < 40; ++i) {
        docs.push_back("Document " + std::to_string(i) + " of the corpus.\nIt says: caf\u00e9 " +
                       std::string(static_cast<std::size_t>(i % 7), '!') +
                       (i % 5 == 0 ? "\n\n  indented\tline" : ""));
    }
    docs[13] = "";  // an empty document is still one
    return docs;
}

TEST(PrepareData, FilesDirectoriesAndJsonLinesGiveTheDocumentsWithEndOfTextBetween) {
    const ScratchDir dir("gpt2-prepare-documents");
    const std::vector<std::string> docs = test_documents();
    // The documents as JSON Lines over three files (plain, gzip, zstd) and as one file each.
    std::string parts[3];
    for (std::size_t i = 0; i < docs.size(); ++i)
        parts[i * 3 / docs.size()] += nlohmann::json{{"id", i}, {"text", docs[i]}}.dump() + "\n";
    fs::create_directories(dir.path() / "jsonl");
    write_bytes(dir.path() / "jsonl/a.jsonl", parts[0]);
    gzFile gz = gzopen((dir.path() / "jsonl/b.jsonl.gz").c_str(), "wb");
    ASSERT_NE(gz, nullptr);
    ASSERT_EQ(gzwrite(gz, parts[1].data(), static_cast<unsigned>(parts[1].size())),
              static_cast<int>(parts[1].size()));
    gzclose(gz);
    std::string zst(ZSTD_compressBound(parts[2].size()), '\0');
    zst.resize(ZSTD_compress(zst.data(), zst.size(), parts[2].data(), parts[2].size(), 3));
    write_bytes(dir.path() / "jsonl/c.jsonl.zst", zst);
    write_bytes(dir.path() / "jsonl/notes.md", "not part of the corpus");
    fs::create_directories(dir.path() / "files/nested");
    for (std::size_t i = 0; i < docs.size(); ++i) {
        write_bytes(dir.path() / (i < 20 ? "files" : "files/nested") /
                        (six_digits(static_cast<int>(i)) + ".txt"),
                    docs[i]);
    }
    const std::string common = " --tokenizer bpe --vocab-size 300 --val-fraction 0.1";
    const auto a = run_command(prepare("--input " + (dir / "jsonl") + " --glob '*.jsonl*'" +
                                       common + " --name j --out-dir " + (dir / "out_jsonl")));
    ASSERT_EQ(a.exit_code, 0) << a.output;
    EXPECT_NE(a.output.find("prepared 40 documents from 3 files"), std::string::npos) << a.output;
    // Files given one by one, the first a directory: the same documents in the same order.
    const auto b = run_command(prepare("--input " + (dir / "files") + common +
                                       " --name f --out-dir " + (dir / "out_files")));
    ASSERT_EQ(b.exit_code, 0) << b.output;

    const auto tokenizer =
        deserialize_tokenizer(read_file_bytes(dir.path() / "out_jsonl/tokenizer.bin"));
    const int eot = *tokenizer->eot_id();
    std::vector<std::int32_t> train, val;
    for (std::size_t i = 0; i < docs.size(); ++i) {
        std::vector<std::int32_t>& split = i % 10 == 0 ? val : train;  // every 10th, from the first
        split.push_back(eot);
        const std::vector<std::int32_t> ids = tokenizer->encode(docs[i]);
        split.insert(split.end(), ids.begin(), ids.end());
    }
    EXPECT_EQ(split_tokens(dir.path() / "out_jsonl", "j", "train"), train);
    EXPECT_EQ(split_tokens(dir.path() / "out_jsonl", "j", "val"), val);
    EXPECT_EQ(split_tokens(dir.path() / "out_files", "f", "train"), train);
    EXPECT_EQ(split_tokens(dir.path() / "out_files", "f", "val"), val);
    EXPECT_EQ(read_file_bytes(dir.path() / "out_files/tokenizer.bin"),
              read_file_bytes(dir.path() / "out_jsonl/tokenizer.bin"));

    // GPT-2: each document's ids are the tokenizer's (tiktoken's, checked elsewhere) after 50256.
    if (fs::exists(kGpt2Dir / "encoder.json")) {
        const auto g =
            run_command(prepare("--input " + (dir / "jsonl") + " --glob '*.jsonl*'" +
                                " --tokenizer gpt2 --tokenizer-dir " + kGpt2Dir.string() +
                                " --val-fraction 0.1 --name g --out-dir " + (dir / "out_gpt2")));
        ASSERT_EQ(g.exit_code, 0) << g.output;
        const auto gpt2 = load_gpt2_tokenizer(kGpt2Dir);
        std::vector<std::int32_t> gpt2_train;
        for (std::size_t i = 0; i < docs.size(); ++i) {
            if (i % 10 == 0) continue;
            gpt2_train.push_back(50256);
            const std::vector<std::int32_t> ids = gpt2->encode(docs[i]);
            gpt2_train.insert(gpt2_train.end(), ids.begin(), ids.end());
        }
        EXPECT_EQ(split_tokens(dir.path() / "out_gpt2", "g", "train"), gpt2_train);
    }

    // --val-documents: the first N documents.
    const auto c = run_command(prepare("--input " + (dir / "jsonl/a.jsonl") +
                                       " --tokenizer bpe --vocab-size 300 --val-documents 2"
                                       " --name v --out-dir " +
                                       (dir / "out_first")));
    ASSERT_EQ(c.exit_code, 0) << c.output;
    const auto first =
        deserialize_tokenizer(read_file_bytes(dir.path() / "out_first/tokenizer.bin"));
    std::vector<std::int32_t> first_two;
    for (std::size_t i = 0; i < 2; ++i) {
        first_two.push_back(*first->eot_id());
        const std::vector<std::int32_t> ids = first->encode(docs[i]);
        first_two.insert(first_two.end(), ids.begin(), ids.end());
    }
    EXPECT_EQ(split_tokens(dir.path() / "out_first", "v", "val"), first_two);
}

// A text longer than a piece (4 MB) streams through in pieces cut where the tokens cannot change:
// train and val together are the whole text's tokens. Stopped after two shards, the preparation
// resumes to the very same shards; a fresh run into it, or a resume with other flags, is refused.
TEST(PrepareData, ALongTextStreamsAndAnInterruptedPreparationResumesToTheSameShards) {
    const ScratchDir dir("gpt2-prepare-resume");
    test::write_corpus(dir.path() / "long.txt", std::size_t{9} << 20);
    const std::string common = "--input " + (dir / "long.txt") +
                               " --tokenizer bpe --vocab-size 300 --bpe-sample-mb 1"
                               " --shard-tokens 1000000 --out-dir ";
    const auto full = run_command(prepare(common + (dir / "full")));
    ASSERT_EQ(full.exit_code, 0) << full.output;
    EXPECT_NE(full.output.find("on the first --bpe-sample-mb of the corpus"), std::string::npos)
        << full.output;
    const auto tokenizer =
        deserialize_tokenizer(read_file_bytes(dir.path() / "full/tokenizer.bin"));
    std::vector<std::int32_t> both = split_tokens(dir.path() / "full", "long", "train");
    const std::vector<std::int32_t> val = split_tokens(dir.path() / "full", "long", "val");
    EXPECT_GT(val.size(), 0u);
    both.insert(both.end(), val.begin(), val.end());
    EXPECT_EQ(both, tokenizer->encode(read_text_file(dir.path() / "long.txt")));

    const auto stopped = run_command(prepare(common + (dir / "part") + " --stop-after-shards 2"));
    EXPECT_EQ(stopped.exit_code, 130) << stopped.output;
    const auto fresh = run_command(prepare(common + (dir / "part")));
    EXPECT_EQ(fresh.exit_code, 2) << fresh.output;
    EXPECT_NE(fresh.output.find("--resume continues it"), std::string::npos) << fresh.output;
    const auto other =
        run_command(prepare(common + (dir / "part") + " --resume --val-fraction 0.2"));
    EXPECT_EQ(other.exit_code, 2) << other.output;
    EXPECT_NE(other.output.find("--val-fraction 0.2 (the preparation's: 0.1)"), std::string::npos)
        << other.output;
    const auto resumed = run_command(prepare(common + (dir / "part") + " --resume"));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("resuming after 2 train and 0 val shards"), std::string::npos)
        << resumed.output;
    EXPECT_GE(expect_same_shards(dir.path() / "full", dir.path() / "part"), 5);
}

TEST(PrepareData, BadDocumentsGetOneClearErrorNamingFileAndLine) {
    const ScratchDir dir("gpt2-prepare-bad");
    write_bytes(dir.path() / "bad.jsonl",
                "{\"text\": \"fine\"}\n\n{\"body\": \"no text field\"}\nnot json\n"
                "{\"text\": \"bad \xff utf-8\"}\n[1, 2]\n{\"text\": \"also fine\"}\n");
    const std::string common = " --tokenizer char --val-fraction 0 --out-dir ";
    const auto stop =
        run_command(prepare("--input " + (dir / "bad.jsonl") + common + (dir / "o1")));
    EXPECT_EQ(stop.exit_code, 1) << stop.output;
    EXPECT_EQ(stop.output.rfind("error: " + (dir / "bad.jsonl") + ":3: no string field 'text'", 0),
              0u)
        << stop.output;
    const auto skip = run_command(
        prepare("--input " + (dir / "bad.jsonl") + " --skip-bad-lines" + common + (dir / "o2")));
    EXPECT_EQ(skip.exit_code, 0) << skip.output;
    EXPECT_NE(skip.output.find("skipped 4 bad lines (--skip-bad-lines); the first: " +
                               (dir / "bad.jsonl") + ":3"),
              std::string::npos)
        << skip.output;
    EXPECT_NE(skip.output.find("prepared 2 documents"), std::string::npos) << skip.output;
    write_bytes(dir.path() / "utf8.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"bad \xc3 utf-8\"}\n");
    const auto utf8 =
        run_command(prepare("--input " + (dir / "utf8.jsonl") + common + (dir / "o3")));
    EXPECT_EQ(utf8.exit_code, 1) << utf8.output;
    EXPECT_NE(utf8.output.find((dir / "utf8.jsonl") + ":2: not valid JSON"), std::string::npos)
        << utf8.output;
    const auto field = run_command(
        prepare("--input " + (dir / "utf8.jsonl") + " --jsonl-field body" + common + (dir / "o4")));
    EXPECT_NE(field.output.find(":1: no string field 'body'"), std::string::npos) << field.output;
    fs::create_directories(dir.path() / "empty/sub");
    const auto empty = run_command(prepare("--input " + (dir / "empty") + common + (dir / "o5")));
    EXPECT_EQ(empty.exit_code, 1) << empty.output;
    EXPECT_EQ(empty.output.rfind("error: --input " + (dir / "empty") + ": no files", 0), 0u)
        << empty.output;
    write_bytes(dir.path() / "cut.jsonl.gz", "\x1f\x8b\x08\x00\x00\x00\x00\x00");
    const auto cut =
        run_command(prepare("--input " + (dir / "cut.jsonl.gz") + common + (dir / "o6")));
    EXPECT_EQ(cut.exit_code, 1) << cut.output;
    EXPECT_NE(cut.output.find((dir / "cut.jsonl.gz") + ": "), std::string::npos) << cut.output;
    for (const char* out : {"o1", "o3", "o4", "o5", "o6"}) {
        if (!fs::exists(dir.path() / out)) continue;
        for (const auto& entry : fs::directory_iterator(dir.path() / out))
            EXPECT_EQ(entry.path().extension(), ".bin") << entry.path() << ": only whole files";
    }
}

TEST(PrepareData, SpeaksWithTheCommonVoice) {
    const ScratchDir dir("gpt2-prepare-voice");
    const auto version = run_command(prepare("--version"));
    EXPECT_EQ(version.exit_code, 0);
    EXPECT_EQ(version.output.rfind("prepare_data (gpt2-mpi) ", 0), 0u) << version.output;
    const auto bad_flag =
        run_command(prepare("--data x --tokenizer chars --out-dir " + (dir / "o")));
    EXPECT_EQ(bad_flag.exit_code, 2) << bad_flag.output;
    EXPECT_EQ(bad_flag.output.rfind("error: --tokenizer", 0), 0u) << bad_flag.output;
    const auto bad_range =
        run_command(prepare("--data x --tokenizer char --threads -1 --out-dir " + (dir / "o")));
    EXPECT_EQ(bad_range.exit_code, 2) << bad_range.output;
    EXPECT_NE(bad_range.output.find("--threads: must be >= 0 (got -1)"), std::string::npos)
        << bad_range.output;
    const auto missing = run_command(
        prepare("--data " + (dir / "missing.txt") + " --tokenizer char --out-dir " + (dir / "o")));
    EXPECT_EQ(missing.exit_code, 1) << missing.output;
    EXPECT_EQ(missing.output.rfind("error: --data " + (dir / "missing.txt"), 0), 0u)
        << missing.output;
    const auto path_name =
        run_command(prepare("--data " + (dir / "missing.txt") +
                            " --tokenizer char --name a/b --out-dir " + (dir / "o")));
    EXPECT_EQ(path_name.exit_code, 2) << path_name.output;
    EXPECT_EQ(path_name.output,
              "error: --name 'a/b': a name for the shards, not a path (they go to --out-dir)\n");
    const auto help = run_command(prepare("--help"));
    EXPECT_NE(help.output.find("--shard-tokens INT=100000000"), std::string::npos) << help.output;
    EXPECT_NE(help.output.find("--eot-in-text MODE=token"), std::string::npos) << help.output;
    EXPECT_EQ(help.output.find("->"), std::string::npos) << help.output;
}

// Every file of a directory (name -> bytes).
std::map<std::string, std::vector<std::uint8_t>> files_of(const fs::path& dir) {
    std::map<std::string, std::vector<std::uint8_t>> files;
    for (const auto& entry : fs::directory_iterator(dir))
        files[entry.path().filename().string()] = read_file_bytes(entry.path());
    return files;
}

// A bad line stops a preparation wherever it is: while the tokenizer reads the corpus (char's
// alphabet), while streaming before the first shard is complete (a small corpus) or after some
// shards. `--resume --skip-bad-lines`, the documented recovery, then ends with what an
// uninterrupted --skip-bad-lines run writes, byte for byte. Before, the first two left no
// progress file, and --resume said "no ... progress.json to continue from".
TEST(PrepareData, ABadLineStopsARunThatResumeSkipBadLinesFinishesAsAnUninterruptedRun) {
    const ScratchDir dir("gpt2-prepare-bad-resume");
    std::string jsonl;
    for (int i = 0; i < 8; ++i) {
        if (i == 5) jsonl += "{\"text\": \"no closing brace\"\n";
        jsonl += nlohmann::json{{"text", "Document " + std::to_string(i) +
                                             " is short.\nIts second line says hello."}}
                     .dump() +
                 "\n";
    }
    write_bytes(dir.path() / "small.jsonl", jsonl);
    struct Case {
        std::string name, flags;
        bool kept_shards;
    };
    std::vector<Case> cases = {
        {"char", "--tokenizer char", false},
        // The BPE sample (100 bytes) ends before the bad line: streaming meets it.
        {"bpe", "--tokenizer bpe --vocab-size 300 --bpe-sample-mb 0.0001", false},
        {"bpe_shards", "--tokenizer bpe --vocab-size 300 --bpe-sample-mb 0.0001 --shard-tokens 20",
         true},
    };
    if (fs::exists(kGpt2Dir / "encoder.json")) {
        cases.push_back({"gpt2", "--tokenizer gpt2 --tokenizer-dir " + kGpt2Dir.string(), false});
    }
    for (const Case& c : cases) {
        const std::string common =
            "--data " + (dir / "small.jsonl") + " --val-fraction 0 " + c.flags + " --out-dir ";
        const auto whole =
            run_command(prepare(common + (dir / ("whole_" + c.name)) + " --skip-bad-lines"));
        ASSERT_EQ(whole.exit_code, 0) << c.name << "\n" << whole.output;
        const std::string out = dir / ("stopped_" + c.name);
        const auto stopped = run_command(prepare(common + out));
        EXPECT_EQ(stopped.exit_code, 1) << c.name << "\n" << stopped.output;
        EXPECT_NE(stopped.output.find("small.jsonl:6: not valid JSON"), std::string::npos)
            << c.name << "\n"
            << stopped.output;
        EXPECT_EQ(stopped.output.find("complete shards are kept in " + out) != std::string::npos,
                  c.kept_shards)
            << c.name << "\n"
            << stopped.output;
        const auto resumed = run_command(prepare(common + out + " --resume --skip-bad-lines"));
        ASSERT_EQ(resumed.exit_code, 0) << c.name << "\n" << resumed.output;
        EXPECT_NE(resumed.output.find("skipped 1 bad line"), std::string::npos) << resumed.output;
        const auto expected = files_of(dir.path() / ("whole_" + c.name));
        EXPECT_GE(expected.size(), 3u) << c.name;  // tokenizer, progress, shards
        EXPECT_EQ(files_of(out), expected) << c.name << "\n" << resumed.output;
    }
}

// --resume checks the flags that decide the output against those the preparation recorded, and
// refuses one that differs, naming it with both values, whether the preparation is complete or
// not. Before, a complete one said "already complete" and kept its (say, char) shards, and an
// unfinished one went on with its recorded tokenizer whatever --tokenizer said.
TEST(PrepareData, ResumeRefusesOtherFlagsNamingThemEvenWhenThePreparationIsComplete) {
    const ScratchDir dir("gpt2-prepare-resume-flags");
    test::write_corpus(dir.path() / "corpus.txt", 30000);
    const std::string data = "--data " + (dir / "corpus.txt");
    const std::string char_prep = data + " --tokenizer char --out-dir " + (dir / "char");
    ASSERT_EQ(run_command(prepare(char_prep)).exit_code, 0);
    const auto before = files_of(dir.path() / "char");
    const auto refused = [&](const std::string& command, const std::string& difference) {
        const auto r = run_command(prepare(command + " --resume"));
        EXPECT_EQ(r.exit_code, 2) << command << "\n" << r.output;
        EXPECT_EQ(r.output.rfind("error: --resume: ", 0), 0u) << r.output;
        EXPECT_NE(r.output.find(difference), std::string::npos) << command << "\n" << r.output;
    };
    refused(data + " --tokenizer bpe --out-dir " + (dir / "char"),
            "--tokenizer bpe (the preparation's: char)");
    refused(char_prep + " --shard-tokens 1000",
            "--shard-tokens 1000 (the preparation's: 100000000)");
    refused(char_prep + " --val-fraction 0.25", "--val-fraction 0.25 (the preparation's: 0.1)");
    EXPECT_EQ(files_of(dir.path() / "char"), before) << "a refused --resume changed the files";
    const auto same = run_command(prepare(char_prep + " --resume"));
    EXPECT_EQ(same.exit_code, 0) << same.output;
    EXPECT_NE(same.output.find("already complete"), std::string::npos) << same.output;

    const std::string bpe_prep =
        data + " --tokenizer bpe --vocab-size 300 --bpe-sample-mb 1 --out-dir " + (dir / "bpe");
    ASSERT_EQ(run_command(prepare(bpe_prep)).exit_code, 0);
    refused(data + " --tokenizer bpe --vocab-size 400 --bpe-sample-mb 1 --out-dir " + (dir / "bpe"),
            "--vocab-size 400 (the preparation's: 300)");
    refused(data + " --tokenizer bpe --vocab-size 300 --bpe-sample-mb 2 --out-dir " + (dir / "bpe"),
            "--bpe-sample-mb 2 (the preparation's: 1)");

    // Unfinished: stopped after its first shard.
    const std::string part = char_prep + "_part --shard-tokens 5000";
    EXPECT_EQ(run_command(prepare(part + " --stop-after-shards 1")).exit_code, 130);
    refused(data + " --tokenizer gpt2 --shard-tokens 5000 --out-dir " + (dir / "char_part"),
            "--tokenizer gpt2 (the preparation's: char)");
    const auto was = fs::file_size(dir.path() / "corpus.txt");
    test::write_corpus(dir.path() / "corpus.txt", 31000);
    refused(part, "--data: " + (dir / "corpus.txt") + " has " +
                      std::to_string(fs::file_size(dir.path() / "corpus.txt")) +
                      " bytes (the preparation's: " + std::to_string(was) + ")");
}

// Fewer documents than round(1/--val-fraction) are split as one text is, by bytes: validation is
// the text's last fraction, cut where the tokens cannot change (inside the last documents), and
// the log says so. Before, every 10th document starting with the first was validation: half of
// two documents, all of one. Too many --val-documents, or a fraction that would make every
// document validation, are refused before any work.
TEST(PrepareData, AFewDocumentsAreSplitByBytesAsOneTextIsAndTheLogSaysSo) {
    const ScratchDir dir("gpt2-prepare-few");
    fs::create_directories(dir.path() / "two");
    test::write_corpus(dir.path() / "two/a.txt", 3000);
    test::write_corpus(dir.path() / "two/b.txt", 2000);
    const std::string a = read_text_file(dir.path() / "two/a.txt");
    const std::string b = read_text_file(dir.path() / "two/b.txt");
    const auto two = run_command(
        prepare("--data " + (dir / "two") + " --tokenizer char --name t --out-dir " + (dir / "t")));
    ASSERT_EQ(two.exit_code, 0) << two.output;
    EXPECT_NE(two.output.find("validation: the last 10% of the text (--val-fraction 0.1)"),
              std::string::npos)
        << two.output;
    EXPECT_NE(two.output.find("2 documents are too few to take every 10th whole"),
              std::string::npos)
        << two.output;
    // Char may cut anywhere: validation is exactly the last 10% of the bytes.
    const std::size_t from = static_cast<std::size_t>(std::llround((a.size() + b.size()) * 0.9));
    ASSERT_GT(from, a.size());
    const auto char_tokenizer =
        deserialize_tokenizer(read_file_bytes(dir.path() / "t/tokenizer.bin"));
    EXPECT_EQ(split_tokens(dir.path() / "t", "t", "train"),
              char_tokenizer->encode(a + b.substr(0, from - a.size())));
    EXPECT_EQ(split_tokens(dir.path() / "t", "t", "val"),
              char_tokenizer->encode(b.substr(from - a.size())));

    // JSON Lines: the last document is cut at the first place at or after the byte where the
    // tokens cannot change; its second part (no end-of-text before it) is validation.
    const std::vector<std::string> docs = {a.substr(0, 1200), b.substr(0, 900),
                                           a.substr(1500, 1100)};
    std::string jsonl;
    for (const std::string& d : docs)
        jsonl += nlohmann::json{{"text", d}}.dump() + "\n";
    write_bytes(dir.path() / "three.jsonl", jsonl);
    const auto three = run_command(prepare("--data " + (dir / "three.jsonl") +
                                           " --tokenizer bpe --vocab-size 300 --val-fraction 0.2"
                                           " --out-dir " +
                                           (dir / "j")));
    ASSERT_EQ(three.exit_code, 0) << three.output;
    EXPECT_NE(three.output.find("3 documents are too few to take every 5th whole"),
              std::string::npos)
        << three.output;
    const auto bpe = deserialize_tokenizer(read_file_bytes(dir.path() / "j/tokenizer.bin"));
    std::size_t cut = static_cast<std::size_t>(std::llround(3200 * 0.8)) - 2100;
    while (!is_safe_cut(docs[2], cut))
        ++cut;
    std::vector<std::int32_t> train;
    for (const std::string& d : {docs[0], docs[1], docs[2].substr(0, cut)}) {
        train.push_back(*bpe->eot_id());
        const std::vector<std::int32_t> ids = bpe->encode(d);
        train.insert(train.end(), ids.begin(), ids.end());
    }
    EXPECT_EQ(split_tokens(dir.path() / "j", "three", "train"), train);
    EXPECT_EQ(split_tokens(dir.path() / "j", "three", "val"), bpe->encode(docs[2].substr(cut)));

    // Short one-line documents: no safe place at or after the byte in the last one, so the cut
    // goes to the last safe place before it (its newline).
    std::string short_lines;
    for (int i = 0; i < 5; ++i) {
        short_lines +=
            nlohmann::json{{"text", "Document " + std::to_string(i) + ".\nIt has two lines."}}
                .dump() +
            "\n";
    }
    write_bytes(dir.path() / "short.jsonl", short_lines);
    const auto short_run =
        run_command(prepare("--data " + (dir / "short.jsonl") +
                            " --tokenizer bpe --vocab-size 280 --out-dir " + (dir / "s")));
    ASSERT_EQ(short_run.exit_code, 0) << short_run.output;
    const auto short_bpe = deserialize_tokenizer(read_file_bytes(dir.path() / "s/tokenizer.bin"));
    EXPECT_EQ(split_tokens(dir.path() / "s", "short", "val"),
              short_bpe->encode("It has two lines."));

    // The same in plain text: the last file's one safe place is before the byte.
    fs::create_directories(dir.path() / "plain");
    write_bytes(dir.path() / "plain/a.txt", a.substr(0, 400));
    const std::string last_line =
        "the last line has no newline after the byte where validation starts";
    write_bytes(dir.path() / "plain/b.txt", "Two lines.\n" + last_line);
    const auto plain =
        run_command(prepare("--data " + (dir / "plain") +
                            " --tokenizer bpe --vocab-size 280 --out-dir " + (dir / "p")));
    ASSERT_EQ(plain.exit_code, 0) << plain.output;
    const auto plain_bpe = deserialize_tokenizer(read_file_bytes(dir.path() / "p/tokenizer.bin"));
    EXPECT_EQ(split_tokens(dir.path() / "p", "plain", "val"), plain_bpe->encode(last_line));

    const auto all_val =
        run_command(prepare("--data " + (dir / "two") +
                            " --tokenizer char --val-documents 2 --out-dir " + (dir / "v")));
    EXPECT_EQ(all_val.exit_code, 2) << all_val.output;
    EXPECT_EQ(all_val.output,
              "error: --val-documents 2: the corpus has 2 documents, which leaves none for "
              "training\n");
    const auto every =
        run_command(prepare("--data " + (dir / "three.jsonl") +
                            " --tokenizer char --val-fraction 0.7 --out-dir " + (dir / "e")));
    EXPECT_EQ(every.exit_code, 2) << every.output;
    EXPECT_EQ(
        every.output.rfind("error: --val-fraction 0.7: every document would be validation", 0), 0u)
        << every.output;
}

// llm.c's tokenizer file is a decode table with an end-of-text id that llm.c's programs start
// generating from: GPT-2's is llm.c's own gpt2_tokenizer.bin, a BPE's is written faithfully under
// a name of its own, and the char tokenizer (no end-of-text token) gets none, as the log says.
// Before, every tokenizer was written as gpt2_tokenizer.bin.
TEST(PrepareData, LlmcTokenizerFileOnlyWhereItMeansWhatItSays) {
    const ScratchDir dir("gpt2-prepare-llmc");
    test::write_corpus(dir.path() / "corpus.txt", 20000);
    const std::string common = "--data " + (dir / "corpus.txt") + " --out-dir " + (dir / "o");
    const auto bpe = run_command(prepare(common + " --tokenizer bpe --vocab-size 300"));
    ASSERT_EQ(bpe.exit_code, 0) << bpe.output;
    EXPECT_FALSE(fs::exists(dir.path() / "o/gpt2_tokenizer.bin"));
    ASSERT_TRUE(fs::exists(dir.path() / "o/llmc_bpe_tokenizer.bin")) << bpe.output;
    EXPECT_NE(bpe.output.find("wrote " + (dir / "o/llmc_bpe_tokenizer.bin") +
                              " (this BPE in llm.c's tokenizer format"),
              std::string::npos)
        << bpe.output;
    const auto tokenizer = deserialize_tokenizer(read_file_bytes(dir.path() / "o/tokenizer.bin"));
    const std::vector<std::string> table =
        read_llmc_tokenizer(dir.path() / "o/llmc_bpe_tokenizer.bin");
    ASSERT_EQ(table.size(), static_cast<std::size_t>(tokenizer->vocab_size()));
    for (int id = 0; id < tokenizer->vocab_size(); ++id)
        ASSERT_EQ(table[static_cast<std::size_t>(id)], tokenizer->token_bytes(id)) << id;
    const std::vector<std::uint8_t> header =
        read_file_bytes(dir.path() / "o/llmc_bpe_tokenizer.bin");
    std::uint32_t eot = 0;
    std::memcpy(&eot, header.data() + 12, 4);
    EXPECT_EQ(static_cast<int>(eot), *tokenizer->eot_id());

    // A char preparation replacing it: no llm.c file, not even the BPE's of before.
    const auto chars = run_command(prepare(common + " --tokenizer char --replace"));
    ASSERT_EQ(chars.exit_code, 0) << chars.output;
    EXPECT_FALSE(fs::exists(dir.path() / "o/gpt2_tokenizer.bin"));
    EXPECT_FALSE(fs::exists(dir.path() / "o/llmc_bpe_tokenizer.bin"));
    EXPECT_NE(chars.output.find("no llm.c tokenizer file: its format needs an end-of-text token"),
              std::string::npos)
        << chars.output;

    if (!fs::exists(kGpt2Dir / "encoder.json")) GTEST_SKIP() << "no GPT-2 tokenizer files";
    const auto gpt2 = run_command(
        prepare(common + " --tokenizer gpt2 --replace --tokenizer-dir " + kGpt2Dir.string()));
    ASSERT_EQ(gpt2.exit_code, 0) << gpt2.output;
    EXPECT_EQ(read_llmc_tokenizer(dir.path() / "o/gpt2_tokenizer.bin").size(), 50257u);
}

// A flag the mode or the tokenizer does not use is never silently ignored: refused with
// --hellaswag (which prepares no shards) and for two flags that choose the same split, warned about
// otherwise; so is a .json file, which is read as plain text. Before, all of them were ignored.
TEST(PrepareData, FlagsTheRunDoesNotUseAreRefusedOrWarnedAbout) {
    const ScratchDir dir("gpt2-prepare-unused");
    test::write_corpus(dir.path() / "corpus.txt", 20000);
    const std::string data = "--data " + (dir / "corpus.txt");
    const auto hellaswag = run_command(prepare("--hellaswag " + (dir / "h.jsonl") + " " + data +
                                               " --tokenizer gpt2 --out-dir " + (dir / "h")));
    EXPECT_EQ(hellaswag.exit_code, 2) << hellaswag.output;
    EXPECT_EQ(hellaswag.output.rfind("error: --data does not apply with --hellaswag", 0), 0u)
        << hellaswag.output;
    const auto both = run_command(prepare(data +
                                          " --tokenizer char --val-fraction 0.2 "
                                          "--val-documents 3 --out-dir " +
                                          (dir / "b")));
    EXPECT_EQ(both.exit_code, 2) << both.output;
    EXPECT_EQ(both.output,
              "error: --val-fraction 0.2 and --val-documents 3 both choose the validation split: "
              "give one\n");
    const auto unused = run_command(prepare(
        data + " --tokenizer char --tokenizer-dir " + (dir / "x") +
        " --eot-in-text text --skip-bad-lines --jsonl-field body --glob '*.txt' --out-dir " +
        (dir / "u")));
    EXPECT_EQ(unused.exit_code, 0) << unused.output;
    for (const std::string warning :
         {"--tokenizer-dir only applies to --tokenizer gpt2; ignored",
          "--eot-in-text does not apply to --tokenizer char",
          "--skip-bad-lines only applies to JSON Lines and Parquet, and no input is either",
          "--jsonl-field only applies to JSON Lines and Parquet, and no input is either",
          "--glob only applies to directories given to --data; ignored"}) {
        EXPECT_NE(unused.output.find(warning), std::string::npos) << warning << "\n"
                                                                  << unused.output;
    }
    write_bytes(dir.path() / "lines.json", "{\"text\": \"a\"}\n{\"text\": \"b\"}\n");
    const auto json = run_command(
        prepare("--data " + (dir / "lines.json") + " --tokenizer char --out-dir " + (dir / "j")));
    EXPECT_EQ(json.exit_code, 0) << json.output;
    EXPECT_NE(json.output.find((dir / "lines.json") + " is read as plain text"), std::string::npos)
        << json.output;
}

// A preparation of the same name made again with another tokenizer does not silently replace the
// shards a run may be training on (it cannot resume without them): refused, exit 2, nothing
// touched, unless --replace asks for it. The same tokenizer again simply prepares afresh.
TEST(PrepareData, ShardsOfAnotherTokenizerAreReplacedOnlyWhenAsked) {
    const ScratchDir dir("gpt2-prepare-replace");
    test::write_corpus(dir.path() / "words.txt", 20000);
    const std::string out = " --out-dir " + (dir / "o");
    ASSERT_EQ(
        run_command(prepare("--data " + (dir / "words.txt") + " --tokenizer char" + out)).exit_code,
        0);
    const auto shard = read_file_bytes(dir.path() / "o/words_train_000000.bin");
    const auto other = run_command(
        prepare("--data " + (dir / "words.txt") + " --tokenizer bpe --vocab-size 300" + out));
    EXPECT_EQ(other.exit_code, 2) << other.output;
    EXPECT_NE(other.output.find("error: --out-dir " + (dir / "o") +
                                " holds the shards of a preparation named words made with another "
                                "tokenizer (tokenizer.bin: char, 21 tokens; this run: bpe, 300 "
                                "tokens), which a run trained on them needs: give another "
                                "--out-dir or --name, or --replace to replace them"),
              std::string::npos)
        << other.output;
    EXPECT_EQ(read_file_bytes(dir.path() / "o/words_train_000000.bin"), shard);
    const auto again =
        run_command(prepare("--data " + (dir / "words.txt") + " --tokenizer char" + out));
    EXPECT_EQ(again.exit_code, 0) << again.output;
    const auto replaced = run_command(prepare("--data " + (dir / "words.txt") +
                                              " --tokenizer bpe --vocab-size 300 --replace" + out));
    EXPECT_EQ(replaced.exit_code, 0) << replaced.output;
    EXPECT_NE(replaced.output.find("removed 2 shards of an earlier preparation named words"),
              std::string::npos)
        << replaced.output;
}

// One --out-dir holds one tokenizer.bin: a preparation of another name that would replace it with
// a different tokenizer is refused (before, the other preparation's shards were left beside a
// tokenizer they were not made with), and --resume refuses a tokenizer.bin that is not the one
// its preparation wrote. A missing GPT-2 tokenizer names --tokenizer-dir.
TEST(PrepareData, APreparationNeverReplacesTheTokenizerOfAnotherInItsOutDir) {
    const ScratchDir dir("gpt2-prepare-shared");
    test::write_corpus(dir.path() / "words.txt", 20000);
    write_bytes(dir.path() / "digits.txt", "0123456789\n9876543210\n");
    const std::string out = " --out-dir " + (dir / "o");
    ASSERT_EQ(run_command(prepare("--data " + (dir / "words.txt") + " --tokenizer char --name w" +
                                  " --shard-tokens 5000 --stop-after-shards 1" + out))
                  .exit_code,
              130);
    const auto tokenizer = read_file_bytes(dir.path() / "o/tokenizer.bin");
    const auto other =
        run_command(prepare("--data " + (dir / "digits.txt") + " --tokenizer char --name d" + out));
    EXPECT_EQ(other.exit_code, 2) << other.output;
    EXPECT_NE(other.output.find("error: --out-dir " + (dir / "o") +
                                " holds the preparation named w, whose shards need its "
                                "tokenizer.bin"),
              std::string::npos)
        << other.output;
    EXPECT_EQ(read_file_bytes(dir.path() / "o/tokenizer.bin"), tokenizer);
    EXPECT_FALSE(fs::exists(dir.path() / "o/d.progress.json"));

    ASSERT_EQ(run_command(prepare("--data " + (dir / "digits.txt") +
                                  " --tokenizer char --out-dir " + (dir / "d")))
                  .exit_code,
              0);
    fs::copy_file(dir.path() / "d/tokenizer.bin", dir.path() / "o/tokenizer.bin",
                  fs::copy_options::overwrite_existing);
    const auto resumed = run_command(prepare("--data " + (dir / "words.txt") +
                                             " --tokenizer char --name w --shard-tokens 5000 "
                                             "--resume" +
                                             out));
    EXPECT_EQ(resumed.exit_code, 1) << resumed.output;
    EXPECT_NE(resumed.output.find("error: " + (dir / "o/tokenizer.bin") +
                                  " is not the tokenizer the preparation named w started with"),
              std::string::npos)
        << resumed.output;

    const auto no_gpt2 =
        run_command(prepare("--data " + (dir / "words.txt") + " --tokenizer gpt2 --tokenizer-dir " +
                            (dir / "none") + " --out-dir " + (dir / "g")));
    EXPECT_EQ(no_gpt2.exit_code, 1) << no_gpt2.output;
    EXPECT_EQ(no_gpt2.output.rfind("error: --tokenizer-dir " + (dir / "none") + ": ", 0), 0u)
        << no_gpt2.output;
}

// The cut that splits a document for validation: at the first safe place at or after the byte,
// or, with none before the document ends, at the last one before it, even when that is where an
// earlier piece ended (a plain text read in pieces); the pieces after it are marked.
TEST(DocumentReader, CutsAtTheLastSafePlaceBeforeTheByteWhenThereIsNoneAfterIt) {
    const ScratchDir dir("gpt2-prepare-cut");
    std::string text;
    while (text.size() < (std::size_t{3} << 19))  // 1.5 MB of short lines
        text += "word word\n";
    const std::size_t long_line = text.size();
    text += std::string(std::size_t{3} << 19, 'x');  // then 1.5 MB without a safe place
    write_bytes(dir.path() / "t.txt", text);
    write_bytes(dir.path() / "t.jsonl", nlohmann::json{{"text", text}}.dump() + "\n");
    for (const char* file : {"t.txt", "t.jsonl"}) {
        DocumentReaderOptions options;
        options.piece_bytes = 16;
        options.safe_cut = [](std::string_view t, std::size_t p) { return is_safe_cut(t, p); };
        options.cut_at_byte = std::size_t{5} << 19;  // 2.5 MB, inside the long line
        const fs::path paths[] = {dir.path() / file};
        DocumentReader reader(list_corpus_files(paths, "*"), options);
        std::string before, after;
        for (DocumentPiece piece; reader.next(piece);) {
            if (!piece.after_cut) {
                EXPECT_TRUE(after.empty()) << file << ": a piece before the cut after one after it";
            }
            (piece.after_cut ? after : before) += piece.text;
        }
        EXPECT_EQ(before.size(), long_line) << file;
        EXPECT_EQ(before + after, text) << file;
    }
}

// A progress file written before the flags were recorded one by one (one "fingerprint" string)
// still resumes, and a flag that differs is still named.
TEST(PreparationProgress, AnOlderProgressFileIsReadAndComparedFlagByFlag) {
    const ScratchDir dir("gpt2-prepare-old-progress");
    const nlohmann::json fingerprint = {
        {"tokenizer", "bpe"},
        {"vocab_size", 290},
        {"eot_in_text", "token"},
        {"jsonl_field", "text"},
        {"val_fraction", 0.1},
        {"val_documents", 0},
        {"shard_tokens", 1000},
        {"files", nlohmann::json::array({nlohmann::json::array({"a.txt", 12})})}};
    const nlohmann::json old = {
        {"fingerprint", fingerprint.dump()},
        {"complete", false},
        {"train", {{"shards", 1}, {"tokens", 1000}, {"piece", 3}, {"skip", 7}}},
        {"val", {{"shards", 0}, {"tokens", 0}, {"piece", 0}, {"skip", 0}}}};
    write_bytes(dir.path() / "a.progress.json", old.dump());
    const std::optional<PreparationProgress> progress =
        read_progress(dir.path() / "a.progress.json");
    ASSERT_TRUE(progress);
    EXPECT_EQ(progress->train.shards, 1);
    EXPECT_EQ(progress->train.next.piece, 3u);
    EXPECT_EQ(progress->train.next.skip, 7u);
    EXPECT_EQ(progress->tokenizer_checksum, 0u);
    PreparationSettings settings{"bpe", 300, 256, "token", "text", 0.1, 0, 1000};
    const std::vector<CorpusFile> files = {{"a.txt", CorpusFormat::Text, 12}};
    // The vocabulary size it recorded was the tokenizer's (290 when the corpus ran out of merges),
    // not the flag's: not compared.
    EXPECT_EQ(settings_difference(progress->settings, settings, files, "--data"), std::nullopt);
    settings.eot_in_text = "text";
    EXPECT_EQ(settings_difference(progress->settings, settings, files, "--data"),
              "--eot-in-text text (the preparation's: token)");
    settings.eot_in_text = "token";
    const std::vector<CorpusFile> other = {{"b.txt", CorpusFormat::Text, 12}};
    EXPECT_EQ(settings_difference(progress->settings, settings, other, "--input"),
              "--input: b.txt is not one of the preparation's files");
    write_bytes(dir.path() / "bad.progress.json", "{\"complete\": true}");
    EXPECT_THROW((void)read_progress(dir.path() / "bad.progress.json"), InputError);
}

// Errors about the corpus name the flag as the user typed it: --data (the documented name) unless
// only the older --input was used. Before, they all said --input.
TEST(PrepareData, ErrorsNameTheCorpusFlagAsTheUserTypedIt) {
    const ScratchDir dir("gpt2-prepare-flag-name");
    fs::create_directories(dir.path() / "empty");
    write_bytes(dir.path() / "blank.jsonl", "\n  \n");
    const std::string common = " --tokenizer char --out-dir " + (dir / "o");
    for (const std::string flag : {"--data", "--input"}) {
        const auto no_files = run_command(prepare(flag + " " + (dir / "empty") + common));
        EXPECT_EQ(no_files.exit_code, 1) << no_files.output;
        EXPECT_EQ(no_files.output.rfind("error: " + flag + " " + (dir / "empty") + ": no files", 0),
                  0u)
            << no_files.output;
        const auto no_documents = run_command(prepare(flag + "=" + (dir / "blank.jsonl") + common));
        EXPECT_EQ(no_documents.exit_code, 1) << no_documents.output;
        EXPECT_EQ(no_documents.output, "error: " + flag + ": the corpus has no documents\n");
    }
}

// The README says --threads is as in train_gpt2, whose default (0) is the CPUs of the affinity
// mask; before, prepare_data's default was std::thread::hardware_concurrency() whatever the mask.
TEST(PrepareData, ThreadsDefaultToTheCpusOfTheAffinityMaskAsInTrainGpt2) {
    const ScratchDir dir("gpt2-prepare-threads");
    test::write_corpus(dir.path() / "corpus.txt", 20000);
    const auto help = run_command(prepare("--help"));
    EXPECT_NE(help.output.find("--threads INT=0"), std::string::npos) << help.output;
    EXPECT_NE(help.output.find("(0: CPUs in the affinity mask)"), std::string::npos) << help.output;
    cpu_set_t mask;
    ASSERT_EQ(sched_getaffinity(0, sizeof(mask), &mask), 0);
    const int cpus = CPU_COUNT(&mask);
    const std::string common = "--data " + (dir / "corpus.txt") + " --tokenizer char --out-dir ";
    const auto all = run_command(prepare(common + (dir / "a")));
    ASSERT_EQ(all.exit_code, 0) << all.output;
    EXPECT_NE(
        all.output.find(" on " + std::to_string(cpus) + (cpus == 1 ? " thread:" : " threads:")),
        std::string::npos)
        << all.output;
    const auto given = run_command(prepare(common + (dir / "b") + " --threads 3"));
    EXPECT_NE(given.output.find(" on 3 threads:"), std::string::npos) << given.output;
    if (run_command("taskset -c 0 true").exit_code != 0) GTEST_SKIP() << "no taskset";
    int first_cpu = 0;
    while (!CPU_ISSET(first_cpu, &mask))
        ++first_cpu;
    const auto one = run_command("taskset -c " + std::to_string(first_cpu) + " " +
                                 prepare(common + (dir / "c")));
    EXPECT_NE(one.output.find(" on 1 thread:"), std::string::npos) << one.output;
}

}  // namespace
}  // namespace gpt2
