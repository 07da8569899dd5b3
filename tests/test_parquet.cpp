// Parquet input (src/data/parquet*): the files in tests/data/parquet, written by DuckDB and
// arrow-rs (dev/make_parquet_fixtures.mjs, not by this project), give the documents DuckDB's
// reader extracts from them, byte for byte and in order, with the nulls it counts, and together
// cover every codec, page version, string encoding and list spelling the reader handles;
// prepare_data makes of them the shards it makes of the same documents as JSON Lines, resumes an
// interrupted preparation to the same shards, and refuses with one line naming the file what it
// cannot read (encrypted files, other codecs, a missing or non-string column, a damaged footer) and
// binary files given as text. Where Node and the packages are installed (GPT2_WITH_PARQUET=1
// scripts/setup.sh), the script's files are written afresh and read by a third reader, hyparquet.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "data/documents.hpp"
#include "data/parquet/parquet.hpp"
#include "data/shard.hpp"
#include "formats/checkpoint.hpp"
#include "process_support.hpp"
#include "random_model.hpp"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::expect_same_shards;
using test::run_command;
using test::ScratchDir;
using test::write_bytes;

const fs::path kFixtures = fs::path(GPT2_TEST_DATA_DIR) / "parquet";
const fs::path kModules = fs::path(GPT2_SOURCE_DIR) / ".deps/parquet/node_modules";

json read_manifest(const fs::path& dir) {
    return json::parse(read_text_file(dir / "manifest.json"));
}

std::vector<json> json_lines(const fs::path& file) {
    std::vector<json> lines;
    std::istringstream in(read_text_file(file));
    for (std::string line; std::getline(in, line);)
        lines.push_back(json::parse(line));
    return lines;
}

std::string prepare(const std::string& flags) {
    return test::build_path("prepare_data") + " " + flags;
}

// The documents prepare_data's reader extracts from one file, and its counts.
struct Extracted {
    std::vector<std::string> documents;
    std::uint64_t null_rows = 0;
    std::uint64_t null_messages = 0;
};

Extracted extract(const fs::path& file, const std::string& text_field = "text") {
    DocumentReaderOptions options;
    options.text_field = text_field;
    const fs::path paths[] = {file};
    DocumentReader reader(list_corpus_files(paths, "*"), options);
    Extracted out;
    for (DocumentPiece piece; reader.next(piece);)
        out.documents.push_back(piece.text);
    out.null_rows = reader.null_rows();
    out.null_messages = reader.null_messages();
    return out;
}

// The index of the first document that differs (or the shorter list's size), for a readable
// failure instead of two lists of thousands of documents.
std::string first_difference(const std::vector<std::string>& ours,
                             const std::vector<std::string>& theirs) {
    std::size_t i = 0;
    while (i < ours.size() && i < theirs.size() && ours[i] == theirs[i])
        ++i;
    if (i == ours.size() && i == theirs.size()) return "";
    return "document " + std::to_string(i) + ": ours " +
           (i < ours.size() ? json(ours[i]).dump() : "(none)") + ", theirs " +
           (i < theirs.size() ? json(theirs[i]).dump() : "(none)") + " (" +
           std::to_string(ours.size()) + " vs " + std::to_string(theirs.size()) + " documents)";
}

TEST(ParquetFixtures, EveryFileGivesTheDocumentsDuckDbExtractsInOrderWithItsNullCounts) {
    const json manifest = read_manifest(kFixtures);
    ASSERT_GE(manifest["files"].size(), 14u);
    for (const json& entry : manifest["files"]) {
        const std::string file = entry["file"];
        SCOPED_TRACE(file);
        const std::vector<json> expected =
            json_lines(kFixtures / entry["expected"].get<std::string>());
        std::vector<std::string> texts;
        for (const json& line : expected)
            texts.push_back(line["text"]);
        const Extracted ours = extract(kFixtures / file);
        EXPECT_EQ(first_difference(ours.documents, texts), "");
        EXPECT_EQ(texts.size(), entry["documents"].get<std::size_t>());
        EXPECT_EQ(ours.null_rows, entry["null_rows"].get<std::uint64_t>());
        EXPECT_EQ(ours.null_messages, entry["null_messages"].get<std::uint64_t>());

        // The structured fields (what fine-tuning will read) are DuckDB's too.
        ParquetReader reader(kFixtures / file, {});
        EXPECT_EQ(reader.rows(), entry["rows"].get<std::uint64_t>());
        std::size_t i = 0;
        for (ParquetRecord record; reader.next(record); ++i) {
            ASSERT_LT(i, expected.size());
            const json& line = expected[i];
            if (record.kind == ParquetRecordKind::Chat) {
                ASSERT_EQ(record.messages.size(), line["messages"].size()) << "document " << i;
                for (std::size_t m = 0; m < record.messages.size(); ++m) {
                    EXPECT_EQ(record.messages[m].role, line["messages"][m]["role"]);
                    EXPECT_EQ(record.messages[m].content, line["messages"][m]["content"]);
                }
            } else if (record.kind != ParquetRecordKind::Text) {
                EXPECT_EQ(record.prompt, line["prompt"]) << "document " << i;
                EXPECT_EQ(record.response, line["response"]) << "document " << i;
            }
        }
        EXPECT_EQ(i, expected.size());
        EXPECT_EQ(reader.stored_bytes_read(), fs::file_size(kFixtures / file));
    }
}

// The fixtures exercise what they are there for: if a regenerated set lost a variant, this says so.
TEST(ParquetFixtures, TogetherCoverEveryCodecPageVersionEncodingAndListSpelling) {
    parquet::ParquetReadStats all;
    std::set<std::string> layouts;
    std::uint64_t fallbacks_where_expected = 0, most_row_groups = 0;
    const json manifest = read_manifest(kFixtures);
    for (const json& entry : manifest["files"]) {
        ParquetReader reader(kFixtures / entry["file"].get<std::string>(), {});
        for (ParquetRecord record; reader.next(record);) {
        }
        const parquet::ParquetReadStats& s = reader.stats();
        all.dictionary_pages += s.dictionary_pages;
        all.data_pages_v1 += s.data_pages_v1;
        all.data_pages_v2 += s.data_pages_v2;
        for (std::size_t i = 0; i < s.data_pages_by_encoding.size(); ++i)
            all.data_pages_by_encoding[i] += s.data_pages_by_encoding[i];
        for (std::size_t i = 0; i < s.pages_by_codec.size(); ++i)
            all.pages_by_codec[i] += s.pages_by_codec[i];
        if (entry["file"] == "arrow_dictionary_fallback_snappy.parquet")
            fallbacks_where_expected = s.dictionary_fallbacks;
        layouts.insert(reader.layout().description);
        most_row_groups = std::max(most_row_groups, entry["row_groups"].get<std::uint64_t>());
    }
    EXPECT_GT(all.data_pages_v1, 0u);
    EXPECT_GT(all.data_pages_v2, 0u);
    EXPECT_GT(all.dictionary_pages, 0u);
    EXPECT_GT(fallbacks_where_expected, 0u) << "no chunk fell back from dictionary to PLAIN";
    using parquet::Codec;
    using parquet::Encoding;
    for (const Codec codec : {Codec::Uncompressed, Codec::Snappy, Codec::Gzip, Codec::Zstd})
        EXPECT_GT(all.pages_by_codec[static_cast<std::size_t>(codec)], 0u)
            << parquet::codec_name(static_cast<std::int32_t>(codec));
    for (const Encoding encoding : {Encoding::Plain, Encoding::RleDictionary,
                                    Encoding::DeltaLengthByteArray, Encoding::DeltaByteArray})
        EXPECT_GT(all.data_pages_by_encoding[static_cast<std::size_t>(encoding)], 0u)
            << parquet::encoding_name(static_cast<std::int32_t>(encoding));
    EXPECT_GE(most_row_groups, 3u);
    for (const char* layout :
         {"column 'text'", "chat column 'messages' (a list of role/content)",
          "chat column 'conversations' (a list of from/value)", "columns 'prompt' and 'response'",
          "columns 'prompt' and 'completion'"})
        EXPECT_EQ(layouts.count(layout), 1u) << layout;
}

// One prepare_data run over every readable fixture and one over the same documents as JSON Lines
// (the expected files, in the same order) write the same shards and tokenizer, byte for byte.
TEST(PrepareDataParquet, ShardsEqualThoseOfTheSameDocumentsAsJsonLines) {
    const ScratchDir dir("gpt2-parquet-shards");
    std::string parquet, jsonl;
    std::uint64_t documents = 0;
    int n = 0;
    const json manifest = read_manifest(kFixtures);
    for (const json& entry : manifest["files"]) {
        parquet += ' ';
        parquet += (kFixtures / entry["file"].get<std::string>()).string();
        const std::string copy = dir / (std::to_string(100 + n++) + ".jsonl");
        fs::copy_file(kFixtures / entry["expected"].get<std::string>(), copy);
        jsonl += " " + copy;
        documents += entry["documents"].get<std::uint64_t>();
    }
    const std::string common = " --tokenizer bpe --vocab-size 300 --shard-tokens 60000 --name c";
    const auto a = run_command(prepare("--data" + parquet + common + " --out-dir " + (dir / "a")));
    ASSERT_EQ(a.exit_code, 0) << a.output;
    EXPECT_NE(a.output.find("prepared " + std::to_string(documents) + " documents from " +
                            std::to_string(manifest["files"].size()) + " files"),
              std::string::npos)
        << a.output;
    const auto b = run_command(prepare("--data" + jsonl + common + " --out-dir " + (dir / "b")));
    ASSERT_EQ(b.exit_code, 0) << b.output;
    int files = 0;
    for (const auto& entry : fs::directory_iterator(dir.path() / "a")) {
        if (entry.path().extension() != ".bin") continue;
        ++files;
        EXPECT_EQ(read_file_bytes(entry.path()),
                  read_file_bytes(dir.path() / "b" / entry.path().filename()))
            << entry.path().filename();
    }
    EXPECT_GE(files, 5);  // shards of both splits, tokenizer.bin, llm.c's tokenizer file
}

TEST(PrepareDataParquet, RefusesWhatItCannotReadWithOneLineNamingTheFile) {
    const ScratchDir dir("gpt2-parquet-refuse");
    int n = 0;
    const json manifest = read_manifest(kFixtures);
    for (const json& refusal : manifest["refusals"]) {
        const fs::path file = kFixtures / refusal["file"].get<std::string>();
        const std::string out = dir / std::to_string(n++);
        const std::string field = refusal.contains("text_field")
                                      ? " --text-field " + refusal["text_field"].get<std::string>()
                                      : "";
        const auto r = run_command(
            prepare("--data " + file.string() + field + " --tokenizer char --out-dir " + out));
        EXPECT_EQ(r.exit_code, 1) << r.output;
        EXPECT_EQ(r.output.rfind("error: " + file.string() + ": ", 0), 0u) << r.output;
        EXPECT_NE(r.output.find(refusal["error"].get<std::string>()), std::string::npos)
            << r.output;
        EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
        // Refused before anything was written.
        EXPECT_TRUE(!fs::exists(out) || fs::is_empty(out)) << out;
    }
}

// Damage that a download or a disk can do: each is refused with an InputError naming the file and
// what is wrong, and bytes overwritten anywhere in the data never crash the reader.
TEST(ParquetReader, DamagedFilesAreRefusedNamingTheFileAndWhatIsWrong) {
    const ScratchDir dir("gpt2-parquet-damage");
    const std::vector<std::uint8_t> good = read_file_bytes(kFixtures / "duckdb_snappy_v1.parquet");
    const std::string bytes(good.begin(), good.end());
    const std::uint32_t footer = static_cast<std::uint32_t>(good[good.size() - 8]) |
                                 good[good.size() - 7] << 8 | good[good.size() - 6] << 16 |
                                 static_cast<std::uint32_t>(good[good.size() - 5]) << 24;
    const std::size_t footer_start = good.size() - 8 - footer;
    const auto refused = [&](const std::string& name, const std::string& damaged,
                             const std::string& why) {
        const fs::path path = dir.path() / name;
        write_bytes(path, damaged);
        try {
            ParquetReader reader(path, {});
            for (ParquetRecord record; reader.next(record);) {
            }
            ADD_FAILURE() << name << " was read";
        } catch (const InputError& e) {
            const std::string message = e.what();
            EXPECT_EQ(message.rfind(path.string() + ": ", 0), 0u) << message;
            EXPECT_NE(message.find(why), std::string::npos) << name << ": " << message;
        }
    };
    refused("cut.parquet", bytes.substr(0, bytes.size() - 1000), "does not end with PAR1");
    refused("text.parquet", "just some text, long enough to be a file\n", "not a Parquet file");
    std::string long_footer = bytes;
    long_footer[long_footer.size() - 5] = '\x7f';
    refused("long_footer.parquet", long_footer, "cut short or corrupt");
    std::string garbled = bytes;
    std::fill(garbled.begin() + static_cast<std::ptrdiff_t>(footer_start + 1),
              garbled.begin() + static_cast<std::ptrdiff_t>(footer_start + 40), '\xff');
    refused("garbled.parquet", garbled, "footer");
    // The data cut out of the middle, the footer kept: its offsets point past the data.
    refused("hollow.parquet", "PAR1" + bytes.substr(footer_start - 200), "inconsistent footer");

    // Overwritten bytes across the data and the footer: read or refused, never a crash (ASan).
    for (std::size_t at = 4; at < good.size() - 8; at += good.size() / 97) {
        std::string damaged = bytes;
        damaged[at] = static_cast<char>(damaged[at] ^ 0x5a);
        const fs::path path = dir.path() / "flipped.parquet";
        write_bytes(path, damaged);
        try {
            ParquetReader reader(path, {});
            for (ParquetRecord record; reader.next(record);) {
            }
        } catch (const InputError& e) {
            EXPECT_EQ(std::string(e.what()).rfind(path.string() + ": ", 0), 0u) << e.what();
        }
    }
}

// A string column's value that is not UTF-8 stops the run naming the file and row, or with
// --skip-bad-lines is skipped and counted like a bad JSON line.
TEST(ParquetReader, ARowThatIsNotUtf8IsRefusedOrSkippedAndCounted) {
    const ScratchDir dir("gpt2-parquet-utf8");
    std::string bytes = read_text_file(kFixtures / "duckdb_uncompressed_v2.parquet");
    const std::string cafe = "caf\xc3\xa9";
    std::size_t patched = 0;
    for (std::size_t at = bytes.find(cafe); at != std::string::npos; at = bytes.find(cafe, at)) {
        bytes[at + 3] = '\xff';  // é's lead byte: invalid
        ++patched;
    }
    ASSERT_GT(patched, 0u);
    write_bytes(dir.path() / "bad.parquet", bytes);
    std::vector<std::string> expected;
    std::size_t bad = 0;
    for (const json& line : json_lines(kFixtures / "duckdb_snappy_v1.expected.jsonl")) {
        const std::string text = line["text"];
        if (text.find(cafe) == std::string::npos)
            expected.push_back(text);
        else
            ++bad;
    }
    ASSERT_GT(bad, 0u);
    const fs::path paths[] = {dir.path() / "bad.parquet"};
    try {
        (void)extract(paths[0]);
        ADD_FAILURE() << "read";
    } catch (const InputError& e) {
        EXPECT_EQ(std::string(e.what()).rfind(paths[0].string() + ": row ", 0), 0u) << e.what();
        EXPECT_NE(std::string(e.what()).find("a value in column 'text' is not valid UTF-8 "
                                             "(--skip-bad-lines skips such rows, counted)"),
                  std::string::npos)
            << e.what();
    }
    DocumentReaderOptions options;
    options.skip_bad_lines = true;
    DocumentReader reader(list_corpus_files(paths, "*"), options);
    std::vector<std::string> documents;
    for (DocumentPiece piece; reader.next(piece);)
        documents.push_back(piece.text);
    EXPECT_EQ(first_difference(documents, expected), "");
    EXPECT_EQ(reader.skipped_lines(), bad);
}

// Text inputs must be text: binary files named as text are refused with one line saying what they
// are (before, a Parquet file given as text became shards of noise).
TEST(PrepareDataParquet, BinaryFilesGivenAsTextAreRefusedSayingWhatTheyAre) {
    const ScratchDir dir("gpt2-parquet-binary");
    fs::copy_file(kFixtures / "duckdb_snappy_v1.parquet", dir.path() / "corpus.txt");
    fs::copy_file(kFixtures / "arrow_plain_v2_gzip.parquet", dir.path() / "corpus.jsonl");
    const std::string text = "some text\nin lines\n";
    gzFile gz = gzopen((dir.path() / "notes.txt").c_str(), "wb");
    ASSERT_NE(gz, nullptr);
    ASSERT_EQ(gzwrite(gz, text.data(), static_cast<unsigned>(text.size())),
              static_cast<int>(text.size()));
    gzclose(gz);
    const std::vector<std::int32_t> tokens = {1, 2, 3, 4};
    write_shard(dir.path() / "shard.bin", tokens);
    (void)save_llmc_model(dir.path() / "model.bin", *test::random_model(test::small_config(), 1),
                          3);
    std::string nul = std::string(70000, 'a') + '\n';
    nul[65000] = '\0';
    write_bytes(dir.path() / "nul.txt", nul);
    const std::pair<const char*, const char*> cases[] = {
        {"corpus.txt",
         "a Parquet file (it starts with PAR1), not text: Parquet is read from files named "
         "*.parquet"},
        {"corpus.jsonl",
         "a Parquet file (it starts with PAR1), not text: Parquet is read from files named "
         "*.parquet"},
        {"notes.txt", "gzip-compressed data, not text: name it .gz to have it decompressed"},
        {"shard.bin",
         "an llm.c token shard (magic 20240520), not text: train on shards with --train-data"},
        {"model.bin", "a model checkpoint (llm.c's magic 20240326), not text"},
        {"nul.txt", "binary data (a NUL byte at byte 65000), not text"},
    };
    for (const auto& [name, what] : cases) {
        const auto r = run_command(
            prepare("--data " + (dir / name) + " --tokenizer char --out-dir " + (dir / "out")));
        EXPECT_EQ(r.exit_code, 1) << name << ": " << r.output;
        EXPECT_EQ(r.output, "error: " + (dir / name) + ": " + what + "\n") << name;
    }
    EXPECT_FALSE(fs::exists(dir.path() / "out/nul_train_000000.bin"));
}

// An interrupted preparation of Parquet files resumes to the shards of an uninterrupted one.
TEST(PrepareDataParquet, AnInterruptedPreparationResumesToTheSameShards) {
    const ScratchDir dir("gpt2-parquet-resume");
    std::string data = "--data";
    for (const char* file : {"duckdb_zstd_v2.parquet", "arrow_dictionary_fallback_snappy.parquet",
                             "duckdb_chat.parquet"})
        data += " " + (kFixtures / file).string();
    const std::string common =
        data + " --tokenizer bpe --vocab-size 300 --shard-tokens 8000 --name r --out-dir ";
    const auto full = run_command(prepare(common + (dir / "full")));
    ASSERT_EQ(full.exit_code, 0) << full.output;
    const auto stopped = run_command(prepare(common + (dir / "part") + " --stop-after-shards 3"));
    EXPECT_EQ(stopped.exit_code, 130) << stopped.output;
    const auto resumed = run_command(prepare(common + (dir / "part") + " --resume"));
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("resuming after "), std::string::npos) << resumed.output;
    EXPECT_GE(expect_same_shards(dir.path() / "full", dir.path() / "part"), 8);
}

// --text-field names the column (or JSON field); --jsonl-field, its older name, does the same; a
// quoted pattern is expanded, and names the shards after its directory.
TEST(PrepareDataParquet, TextFieldNamesTheColumnAndPatternsAreExpanded) {
    const ScratchDir dir("gpt2-parquet-field");
    const std::string file = (kFixtures / "duckdb_gzip_v1.parquet").string();
    const std::string common = " --tokenizer char --val-fraction 0 --name u --out-dir ";
    const auto a =
        run_command(prepare("--data " + file + " --text-field url" + common + (dir / "a")));
    ASSERT_EQ(a.exit_code, 0) << a.output;
    EXPECT_NE(a.output.find("Parquet, column 'url'"), std::string::npos) << a.output;
    EXPECT_NE(a.output.find("prepared 2100 documents"), std::string::npos) << a.output;
    const auto b =
        run_command(prepare("--data " + file + " --jsonl-field url" + common + (dir / "b")));
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_EQ(read_file_bytes(dir.path() / "a/u_train_000000.bin"),
              read_file_bytes(dir.path() / "b/u_train_000000.bin"));
    const Extracted urls = extract(file, "url");
    ASSERT_EQ(urls.documents.size(), 2100u);
    EXPECT_EQ(urls.documents[5], "https://example.org/5");
    const auto missing =
        run_command(prepare("--data " + file + " --text-field body" + common + (dir / "c")));
    EXPECT_EQ(missing.exit_code, 1) << missing.output;
    EXPECT_EQ(missing.output.rfind("error: " + file +
                                       ": no column 'body' (--text-field); its "
                                       "columns: id (INT32), text (a string), url (a string)",
                                   0),
              0u)
        << missing.output;

    fs::create_directories(dir.path() / "hub/sample");
    for (const char* name : {"duckdb_gzip_v1.parquet", "duckdb_zstd_v2.parquet"})
        fs::copy_file(kFixtures / name, dir.path() / "hub/sample" / name);
    const auto pattern = run_command(prepare("--data '" + (dir / "hub/sample") + "/*.parquet'" +
                                             " --tokenizer char --out-dir " + (dir / "d")));
    ASSERT_EQ(pattern.exit_code, 0) << pattern.output;
    EXPECT_NE(pattern.output.find("prepared 3994 documents from 2 files"), std::string::npos)
        << pattern.output;
    EXPECT_TRUE(fs::exists(dir.path() / "d/sample_train_000000.bin"));
    const auto none = run_command(prepare("--data '" + (dir / "hub") + "/*.parquet'" +
                                          " --tokenizer char --out-dir " + (dir / "e")));
    EXPECT_EQ(none.exit_code, 1) << none.output;
    EXPECT_EQ(none.output,
              "error: --data '" + (dir / "hub") + "/*.parquet': no files match the pattern\n");
}

// Schemas built here as writers lay them out: a chat column is found by its shape in every list
// spelling, with the definition levels its rows are assembled by.
parquet::SchemaElement group(const std::string& name, parquet::Repetition repetition, int children,
                             bool list = false) {
    parquet::SchemaElement e;
    e.name = name;
    e.repetition = repetition;
    e.num_children = children;
    if (list) e.converted_type = 3;
    return e;
}
parquet::SchemaElement string_leaf(const std::string& name,
                                   parquet::Repetition repetition = parquet::Repetition::Optional) {
    parquet::SchemaElement e;
    e.name = name;
    e.repetition = repetition;
    e.type = static_cast<std::int32_t>(parquet::PhysicalType::ByteArray);
    e.converted_type = 0;
    return e;
}

ParquetLayout layout_of(std::vector<parquet::SchemaElement> elements,
                        const std::string& field = "text", bool given = false) {
    ParquetReadOptions options;
    options.text_field = field;
    options.text_field_given = given;
    return choose_parquet_layout(parquet::build_schema(std::move(elements), "s.parquet"), options,
                                 "s.parquet");
}

TEST(ParquetSchema, ChatColumnsAreFoundByTheirShapeInEveryListSpelling) {
    using parquet::Repetition;
    const auto root = [](int children) { return group("schema", Repetition::Required, children); };
    // Standard three levels (pyarrow >= 13, DuckDB: element; older pyarrow, arrow-rs: item).
    for (const char* element : {"element", "item"}) {
        const ParquetLayout l = layout_of(
            {root(1), group("messages", Repetition::Optional, 1, true),
             group("list", Repetition::Repeated, 1), group(element, Repetition::Optional, 2),
             string_leaf("role"), string_leaf("content")});
        EXPECT_EQ(l.kind, ParquetRecordKind::Chat);
        EXPECT_EQ(l.leaves, (std::vector<std::size_t>{0, 1}));
        EXPECT_EQ(l.entry_defined, 2);
        EXPECT_EQ(l.struct_defined, 3);
    }
    // Legacy two levels: the repeated group is the message (parquet-mr's `array`).
    const ParquetLayout two = layout_of(
        {root(2), string_leaf("id"), group("messages", Repetition::Optional, 1, true),
         group("array", Repetition::Repeated, 3), string_leaf("content", Repetition::Required),
         string_leaf("role", Repetition::Required), string_leaf("name")});
    EXPECT_EQ(two.kind, ParquetRecordKind::Chat);
    EXPECT_EQ(two.leaves, (std::vector<std::size_t>{2, 1}));
    EXPECT_EQ(two.entry_defined, 2);
    EXPECT_EQ(two.struct_defined, 2);
    // One level: an unannotated repeated group at the top, ShareGPT's field names.
    const ParquetLayout one = layout_of({root(1), group("conversations", Repetition::Repeated, 2),
                                         string_leaf("from"), string_leaf("value")});
    EXPECT_EQ(one.kind, ParquetRecordKind::Chat);
    EXPECT_EQ(one.description, "chat column 'conversations' (a list of from/value)");
    EXPECT_EQ(one.entry_defined, 1);
    EXPECT_EQ(one.struct_defined, 1);
    // Named by --text-field even beside a text column.
    const ParquetLayout named =
        layout_of({root(2), string_leaf("text"), group("conversations", Repetition::Repeated, 2),
                   string_leaf("from"), string_leaf("value")},
                  "conversations", true);
    EXPECT_EQ(named.kind, ParquetRecordKind::Chat);
    // Prompt/response and prompt/completion when there is no text column.
    EXPECT_EQ(layout_of({root(2), string_leaf("prompt"), string_leaf("response")}).kind,
              ParquetRecordKind::PromptResponse);
    EXPECT_EQ(layout_of({root(2), string_leaf("completion"), string_leaf("prompt")}).kind,
              ParquetRecordKind::PromptCompletion);
    // A list of strings is no chat, and no string.
    try {
        (void)layout_of({root(1), group("text", Repetition::Optional, 1, true),
                         group("list", Repetition::Repeated, 1), string_leaf("element")});
        ADD_FAILURE() << "a list of strings was read as text";
    } catch (const InputError& e) {
        EXPECT_STREQ(e.what(),
                     "s.parquet: column 'text' is a list, not a string (nor a list of "
                     "role/content messages)");
    }
    // A list of lists of messages is no chat either (two repetition levels).
    EXPECT_THROW((void)layout_of({root(1), group("messages", Repetition::Optional, 1, true),
                                  group("list", Repetition::Repeated, 1),
                                  group("element", Repetition::Optional, 1, true),
                                  group("list", Repetition::Repeated, 1),
                                  group("element", Repetition::Optional, 2), string_leaf("role"),
                                  string_leaf("content")}),
                 InputError);
}

bool node_available() {
    return run_command("node --version").exit_code == 0;
}

// The generator run afresh writes the committed fixtures (all but the encrypted one, whose nonce
// is random), and hyparquet, a reader independent of DuckDB, arrow-rs and this project, extracts
// from the fresh files the documents and null counts we do.
TEST(ParquetThirdReader, HyparquetExtractsFromFreshFilesWhatWeDo) {
    if (!node_available()) GTEST_SKIP() << "no node on PATH";
    for (const char* module :
         {"hyparquet", "hyparquet-compressors", "parquet-wasm", "@duckdb/node-api"}) {
        if (!fs::exists(kModules / module))
            GTEST_SKIP() << module << " is not installed in " << kModules
                         << " (GPT2_WITH_PARQUET=1 scripts/setup.sh installs it)";
    }
    const ScratchDir dir("gpt2-parquet-fresh");
    const auto made =
        run_command("node " + std::string(GPT2_SOURCE_DIR) + "/dev/make_parquet_fixtures.mjs " +
                    dir.path().string() + " " + kModules.string());
    ASSERT_EQ(made.exit_code, 0) << made.output;
    const json manifest = read_manifest(dir.path());
    for (const json& entry : manifest["files"]) {
        const std::string file = entry["file"];
        EXPECT_EQ(read_file_bytes(dir.path() / file), read_file_bytes(kFixtures / file)) << file;
    }
    const auto checked =
        run_command("node " + std::string(GPT2_SOURCE_DIR) + "/tests/parquet_check.mjs " +
                    kModules.string() + " " + (dir / "manifest.json"));
    ASSERT_EQ(checked.exit_code, 0) << checked.output.substr(0, 2000);
    std::istringstream lines(checked.output);
    std::size_t files = 0;
    for (std::string line; std::getline(lines, line);) {
        const json theirs = json::parse(line);
        const std::string file = theirs["file"];
        SCOPED_TRACE(file);
        const Extracted ours = extract(dir.path() / file);
        EXPECT_EQ(
            first_difference(ours.documents, theirs["documents"].get<std::vector<std::string>>()),
            "");
        EXPECT_EQ(ours.null_rows, theirs["null_rows"].get<std::uint64_t>());
        EXPECT_EQ(ours.null_messages, theirs["null_messages"].get<std::uint64_t>());
        ++files;
    }
    EXPECT_EQ(files, manifest["files"].size());
}

}  // namespace
}  // namespace gpt2
