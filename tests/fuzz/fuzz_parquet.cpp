// Fuzzes gpt2::ParquetReader, prepare_data's reader of Parquet files (footer and page headers in
// the Thrift compact protocol, four codecs, v1 and v2 pages, levels, the string encodings, chat
// lists). The input is the file; it is read as prepare_data reads it by default and once more
// asking for the chat column `messages`. Properties: only InputError is thrown; every record is of
// the layout's kind; a file read to its end accounts for every row the footer counts (documents
// plus rows skipped as null) and for all its bytes. Seeds: the test files, tests/data/parquet.
#include <cstdint>
#include <string>

#include "data/parquet/parquet.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size > gpt2::fuzz::kMaxInputBytes) return -1;
    const std::filesystem::path path = gpt2::fuzz::scratch_dir() / "f.parquet";
    gpt2::fuzz::write_bytes(path, {data, size});
    for (const bool chat : {false, true}) {
        gpt2::ParquetReadOptions options;
        if (chat) {
            options.text_field = "messages";
            options.text_field_given = true;
        }
        options.max_page_bytes = std::size_t{4} << 20;  // the input is at most 1 MB
        try {
            gpt2::ParquetReader reader(path, options);
            // A footer may claim any number of rows; reading billions of null ones is only slow.
            if (reader.rows() > 1'000'000) continue;
            gpt2::ParquetRecord record;
            std::string text;
            std::uint64_t records = 0;
            while (reader.next(record)) {
                FUZZ_CHECK(record.kind == reader.layout().kind);
                gpt2::record_text(record, text);
                if (record.kind == gpt2::ParquetRecordKind::Text) FUZZ_CHECK(text == record.text);
                if (record.kind == gpt2::ParquetRecordKind::Chat)
                    FUZZ_CHECK(!record.messages.empty());
                ++records;
            }
            FUZZ_CHECK(records + reader.null_rows() == reader.rows());
            FUZZ_CHECK(reader.stored_bytes_read() == size);
        } catch (const gpt2::InputError& error) {
            gpt2::fuzz::rejected(error);
        }
    }
    return 0;
}
