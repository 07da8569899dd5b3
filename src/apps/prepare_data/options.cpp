#include "apps/prepare_data/options.hpp"

#include <CLI/CLI.hpp>

#include <optional>
#include <string_view>

#include "apps/cli/cli.hpp"

namespace gpt2::prepare_data {

namespace {

namespace fs = std::filesystem;

void add_corpus_flags(CLI::App& cli, Options& o) {
    cli.add_option("--data,--input", o.inputs,
                   "text, .jsonl or .parquet files (text and .jsonl also .gz/.zst), directories "
                   "(recursive, sorted) and quoted glob patterns ('dir/*.parquet'); repeat or "
                   "list several (--input is the older name)")
        ->default_str("");
    cli.add_option("--glob", o.glob, "in directories: only file names matching this");
    cli.add_option("--text-field,--jsonl-field", o.text_field,
                   "the text field of each .jsonl line and the text column of .parquet files "
                   "(--jsonl-field is the older name); without it, a Parquet file with no column "
                   "'text' is read as chat (a list of role/content) or prompt/response data");
    cli.add_option("--loss-on", o.loss_on,
                   "response: write a loss mask beside each shard so that training learns only "
                   "the responses of prompt/response and chat records (the default for them) | "
                   "all: every token (the default for other text)")
        ->check(app::one_of({"response", "all"}, "--loss-on value"))
        ->type_name("WHAT");
    cli.add_flag("--skip-bad-lines", o.skip_bad_lines,
                 "skip (and count) .jsonl lines that are not JSON objects with the text field, "
                 "and Parquet rows whose text is not UTF-8, instead of stopping");
}

void add_tokenizer_flags(CLI::App& cli, Options& o) {
    cli.add_option("--tokenizer", o.tokenizer, "char | bpe | gpt2")
        ->required()
        ->transform(app::named_value(gpt2::tokenizer_kinds_by_name(), "tokenizer"))
        ->type_name("NAME")
        ->default_str("");  // required: no default to show
    cli.add_option("--vocab-size", o.vocab_size,
                   "BPE vocabulary: 256 bytes + merges + <|endoftext|> (257..65536)")
        ->check(app::at_least(257))
        ->check(CLI::Validator(
            [](std::string& value) {
                return std::stod(value) <= 65536 ? std::string()
                                                 : "must be <= 65536 (llm.c's uint16 shards)";
            },
            "", ""));
    cli.add_option("--bpe-sample-mb", o.bpe_sample_mb,
                   "BPE is trained on the corpus's first this many MB")
        ->check(app::positive());
    cli.add_option("--tokenizer-dir", o.tokenizer_dir,
                   "with --tokenizer gpt2: the directory with GPT-2's encoder.json and vocab.bpe");
    cli.add_option("--eot-in-text", o.eot_in_text,
                   "a literal <|endoftext|> in the text: token (the end-of-text token) | text "
                   "(ordinary characters, as llm.c's encode_ordinary)")
        ->check(app::one_of({"token", "text"}, "--eot-in-text mode"))
        ->type_name("MODE");
}

void add_output_flags(CLI::App& cli, Options& o) {
    cli.add_option("--out-dir", o.out_dir, "output directory")->required();
    cli.add_option("--name", o.name,
                   "shard name prefix, or with --hellaswag the file's name before .bin (default: "
                   "the first input's name without extensions; a pattern's directory's name)");
    cli.add_option("--val-fraction", o.val_fraction,
                   "validation share (0..0.99): of documents, every round(1/F)-th starting with "
                   "the first; of one text file or fewer documents than round(1/F), the text's "
                   "last bytes")
        ->check(app::at_least(0))
        ->check(CLI::Validator(
            [](std::string& value) {
                return std::stod(value) <= 0.99 ? std::string() : "must be <= 0.99";
            },
            "", ""));
    cli.add_option("--val-documents", o.val_documents,
                   "validation: the first N documents instead (0: use --val-fraction)")
        ->check(app::at_least(0));
    cli.add_option("--shard-tokens", o.shard_tokens, "maximum tokens per shard")
        ->check(app::positive());
    cli.add_flag("--resume", o.resume,
                 "continue an interrupted preparation after its last complete shard (the same "
                 "inputs and flags; with nothing kept, start from the beginning)");
    cli.add_flag("--replace", o.replace,
                 "replace an earlier preparation of this --name in --out-dir made with another "
                 "tokenizer (refused without it: a run trained on those shards could not resume)");
    cli.add_option("--threads", o.threads, "encoding threads (0: CPUs in the affinity mask)")
        ->check(app::at_least(0));
    cli.add_option("--hellaswag", o.hellaswag,
                   "instead of shards: HellaSwag's JSONL (hellaswag_val.jsonl) to llm.c's "
                   "evaluation file in --out-dir, for train_gpt2 --hellaswag");
    cli.add_option("--stop-after-shards", o.stop_after_shards,
                   "testing: stop as if interrupted after writing N shards")
        ->group("");
}

// How the command line names a flag that has an older name: the older one when only it is used,
// so that messages name the flag the user typed.
std::string flag_spelling(int argc, char** argv, const std::string& name,
                          const std::string& older) {
    bool current = false, old = false;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        current = current || arg == name || arg.starts_with(name + "=");
        old = old || arg == older || arg.starts_with(older + "=");
    }
    return old && !current ? older : name;
}

}  // namespace

std::variant<Options, int> parse_options(int argc, char** argv) {
    CLI::App cli{
        "Tokenizes a corpus (text files, JSON Lines, Parquet, directories of them; gzip or zstd) "
        "into llm.c token shards plus the tokenizer files, streaming.",
        "prepare_data"};
    cli.option_defaults()->always_capture_default();
    Options o;
    app::add_common_flags(cli, o.log_level);
    add_corpus_flags(cli, o);
    add_tokenizer_flags(cli, o);
    add_output_flags(cli, o);
    if (const std::optional<int> code = app::parse_command_line(cli, argc, argv)) return *code;
    o.data_flag = flag_spelling(argc, argv, "--data", "--input");
    o.text_flag = flag_spelling(argc, argv, "--text-field", "--jsonl-field");
    for (const CLI::Option* option : cli.get_options()) {
        if (option->count() > 0 && !option->get_lnames().empty())
            o.given.insert("--" + option->get_lnames().front());
    }
    if (o.name.empty() && !o.inputs.empty()) {
        fs::path stem = o.inputs[0];
        // A pattern ('fineweb/10BT/*.parquet') is named after its directory.
        std::error_code ec;
        while (!fs::exists(stem, ec) &&
               stem.filename().string().find_first_of("*?[") != std::string::npos)
            stem = stem.parent_path();
        while (stem.has_extension() &&
               (stem.extension() == ".gz" || stem.extension() == ".zst" ||
                stem.extension() == ".jsonl" || stem.extension() == ".txt" ||
                stem.extension() == ".parquet"))
            stem = stem.stem();
        o.name = stem.filename().string();
        if (o.name.empty()) o.name = "corpus";
    }
    return o;
}

}  // namespace gpt2::prepare_data
