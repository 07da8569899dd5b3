// prepare_data: tokenizes a corpus (text files, JSON Lines, Parquet, directories of them,
// gzip/zstd) into llm.c token shards, streaming: memory stays bounded by a few shards whatever the
// corpus size, each shard is written atomically as soon as it is full, and --resume continues an
// interrupted preparation after its last complete shard. The tokenizer goes next to the shards,
// serialized (tokenizer.bin) and, where that format can hold it, as llm.c's tokenizer file. The
// work itself is in src/data/ (corpus_split, shard_stream, shard_writer, preparation_progress,
// hellaswag), the flags in options.cpp, their checks in checks.cpp, the wiring of a preparation in
// preparation.cpp and its summary lines in summary.cpp; this file runs the mode asked for.
#include <spdlog/spdlog.h>

#include <filesystem>
#include <iostream>
#include <variant>
#include <vector>

#include "apps/cli/cli.hpp"
#include "apps/prepare_data/options.hpp"
#include "apps/prepare_data/prepare_data.hpp"
#include "core/error.hpp"
#include "data/multiple_choice.hpp"
#include "data/prepare/hellaswag.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2::prepare_data {

namespace fs = std::filesystem;

void create_out_dir(const fs::path& dir) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw gpt2::InputError("--out-dir " + dir.string() + ": " + ec.message());
}

// GPT-2's tokenizer from --tokenizer-dir; a missing or bad file's error names the flag (whose
// default is relative to the current directory).
std::unique_ptr<gpt2::Tokenizer> load_gpt2(const Options& o) {
    try {
        return gpt2::load_gpt2_tokenizer(o.tokenizer_dir);
    } catch (const gpt2::InputError& e) {
        throw gpt2::InputError("--tokenizer-dir " + o.tokenizer_dir.string() +
                               (o.has("--tokenizer-dir") ? "" : " (the default)") + ": " +
                               e.what());
    }
}

namespace {

// llm.c's HellaSwag evaluation file (--hellaswag) in --out-dir: --name.bin, by default named after
// the JSONL (hellaswag_val.jsonl: hellaswag_val.bin, the name scripts/get_hellaswag.sh gives).
void build_hellaswag(const Options& o) {
    if (o.tokenizer != gpt2::TokenizerKind::Gpt2) {
        throw gpt2::UsageError("--hellaswag needs --tokenizer gpt2 (the models it evaluates)");
    }
    const auto tokenizer = load_gpt2(o);
    const std::vector<gpt2::MultipleChoiceExample> examples =
        gpt2::read_hellaswag(o.hellaswag, *tokenizer);
    create_out_dir(o.out_dir);
    fs::path name = o.hellaswag.filename();
    name.replace_extension(".bin");
    if (!o.name.empty()) name = o.name + ".bin";
    const fs::path out = o.out_dir / name;
    gpt2::write_multiple_choice_file(out, examples);
    spdlog::info("wrote {} ({} examples; train_gpt2 --hellaswag {})", out.string(), examples.size(),
                 out.string());
}

}  // namespace

}  // namespace gpt2::prepare_data

namespace {

namespace app = gpt2::app;
using gpt2::prepare_data::build_hellaswag;
using gpt2::prepare_data::check_flags;
using gpt2::prepare_data::Options;

}  // namespace

int main(int argc, char** argv) {
    auto parsed = gpt2::prepare_data::parse_options(argc, argv);
    if (const int* code = std::get_if<int>(&parsed)) return *code;
    const Options& options = std::get<Options>(parsed);
    app::setup_logging(options.log_level, app::LogStream::Stderr);
    try {
        check_flags(options);
        if (!options.hellaswag.empty()) {
            build_hellaswag(options);
        } else {
            return gpt2::prepare_data::prepare_shards(options);
        }
    } catch (const gpt2::UsageError& e) {
        std::cerr << app::error_line(e.what()) << std::endl;
        return app::kExitBadFlags;
    } catch (const std::exception& e) {
        std::cerr << app::error_line(e.what()) << std::endl;
        return app::kExitRuntimeError;
    }
    return app::kExitOk;
}
