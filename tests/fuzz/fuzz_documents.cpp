// Fuzzes gpt2::DocumentReader, prepare_data's reader of outside corpora: JSON Lines, gzip and
// zstd streams, and plain text cut into pieces. The first byte picks the file kind, the second
// where a plain text must also be cut. Properties: only InputError is thrown; a plain text comes
// back whole, in order, cut only at safe positions (and the forced cut at the first safe one at
// or after its byte, when there is one; else at the last one before it); pieces and documents are
// numbered in order.
#include <cstdint>
#include <string>

#include "data/documents.hpp"
#include "fuzz_support.hpp"
#include "tokenizer/tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 2 || size > gpt2::fuzz::kMaxInputBytes) return -1;
    static const char* const kNames[] = {"c.jsonl", "c.jsonl.gz", "c.jsonl.zst", "c.txt",
                                         "c.txt.gz"};
    const std::string name = kNames[data[0] % 5];
    const std::uint64_t cut_at = data[1];
    const std::span<const std::uint8_t> body(data + 2, size - 2);
    const std::filesystem::path path = gpt2::fuzz::scratch_dir() / name;
    gpt2::fuzz::write_bytes(path, body);
    for (const bool skip : {false, true}) {
        gpt2::DocumentReaderOptions options;
        options.skip_bad_lines = skip;
        options.piece_bytes = 16;
        options.safe_cut = [](std::string_view text, std::size_t p) {
            return gpt2::is_safe_cut(text, p);
        };
        options.cut_at_byte = cut_at;
        try {
            const std::filesystem::path paths[] = {path};
            gpt2::DocumentReader reader(gpt2::list_corpus_files(paths, "*"), options);
            gpt2::DocumentPiece piece;
            std::string whole;
            std::vector<std::size_t> cuts;
            std::uint64_t expected_piece = 0, last_document = 0;
            while (reader.next(piece)) {
                FUZZ_CHECK(piece.index == expected_piece++);
                FUZZ_CHECK(piece.document >= last_document);
                FUZZ_CHECK(piece.first == (piece.index == 0 || piece.document != last_document));
                last_document = piece.document;
                if (name == "c.txt") {
                    FUZZ_CHECK(piece.offset == whole.size());
                    if (!whole.empty()) cuts.push_back(whole.size());
                    whole += piece.text;
                }
            }
            if (name == "c.txt") {
                FUZZ_CHECK(whole == std::string(body.begin(), body.end()));
                for (const std::size_t p : cuts)
                    FUZZ_CHECK(gpt2::is_safe_cut(whole, p));
                // The forced cut: at the first safe position at or after cut_at, if any.
                for (std::size_t p = cut_at; cut_at > 0 && p < whole.size(); ++p) {
                    if (gpt2::is_safe_cut(whole, p)) {
                        FUZZ_CHECK(std::find(cuts.begin(), cuts.end(), p) != cuts.end());
                        break;
                    }
                }
            }
            FUZZ_CHECK(reader.stored_bytes_read() == body.size() ||
                       name.find(".gz") != std::string::npos ||
                       name.find(".zst") != std::string::npos);
        } catch (const gpt2::InputError& error) {
            gpt2::fuzz::rejected(error);
        }
    }
    return 0;
}
