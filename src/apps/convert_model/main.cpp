// convert_model: reads any model the project reads (our checkpoints, llm.c model files, Hugging
// Face GPT-2 directories) and writes it as a Hugging Face directory, a GGUF file for llama.cpp, or
// llm.c's model file, with a PEFT LoRA adapter merged into its weights or written alone as a GGUF
// adapter for llama.cpp. Parsing and wiring only: the formats live in src/formats/.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "apps/cli/cli.hpp"
#include "core/error.hpp"
#include "formats/model_file.hpp"
#include "formats/peft.hpp"
#include "model/lora.hpp"
#include "tokenizer/tokenizer.hpp"

namespace fs = std::filesystem;

namespace {

namespace app = gpt2::app;

struct Options {
    fs::path input;
    fs::path output;
    std::string to;  // hf | gguf | llmc | gguf-lora; empty: from the output's name
    std::string dtype = "f32";
    gpt2::TokenizerDir tokenizer_dir{"data/gpt2", false};
    bool weights_only = false;
    std::string name;
    fs::path lora_from;  // a PEFT adapter directory; empty: none
    std::string log_level = "info";
};

int run(const Options& o) {
    const gpt2::ModelOutput output = gpt2::checked_model_output(
        {o.output, gpt2::output_format(o.output, o.to), o.dtype, o.weights_only, o.name}, o.input);
    gpt2::check_lora_source(o.lora_from, output.format);
    std::vector<std::string> notes;
    gpt2::LoadedModel loaded = gpt2::load_model_file(o.input, &notes);
    for (const std::string& note : notes)
        spdlog::info("{}", note);
    // The adapter, its shapes checked against the model's before anything is written or logged.
    const std::unique_ptr<gpt2::LoraAdapter> adapter =
        o.lora_from.empty() ? nullptr : gpt2::read_peft_adapter(o.lora_from, loaded.model.config);
    const auto log_adapter = [&] {
        spdlog::info("read {}: {}", o.lora_from.string(), gpt2::describe_adapter(adapter->config));
    };
    if (output.format == gpt2::OutputFormat::GgufLora) {
        spdlog::info("read {}: {} (the adapter's base)", o.input.string(),
                     gpt2::describe(loaded.model.config));
        log_adapter();
        const std::string written = gpt2::write_lora_adapter_file(output, *adapter);
        spdlog::info("wrote {}: {}", output.path.string(), written);
        return app::kExitOk;
    }
    const gpt2::OutputTokenizer tokenizer =
        gpt2::output_tokenizer(loaded, o.input, o.tokenizer_dir, output);
    spdlog::info("read {}: {}, tokenizer {}", o.input.string(), gpt2::describe(loaded.model.config),
                 tokenizer.tokenizer
                     ? std::string(gpt2::tokenizer_kind_name(tokenizer.tokenizer->kind())) + " (" +
                           tokenizer.origin + ")"
                     : std::string("none"));
    if (adapter) {
        log_adapter();
        gpt2::merge_lora(loaded.model, *adapter);
        spdlog::info("merged {} into the weights: W + (alpha/r) B A", o.lora_from.string());
    }
    std::vector<std::string> written_notes;
    const std::string written = gpt2::write_model_file(
        output, loaded.model, tokenizer.tokenizer.get(), o.input, written_notes);
    spdlog::info("wrote {}: {}", output.path.string(), written);
    for (const std::string& note : written_notes)
        spdlog::info("{}", note);
    return app::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    CLI::App cli(
        "convert_model: write a model as a Hugging Face directory, GGUF (llama.cpp) or "
        "llm.c's model file, with a LoRA adapter merged in or as a GGUF adapter",
        "convert_model");
    cli.add_option("IN", o.input,
                   "a checkpoint, llm.c model file, Hugging Face GPT-2 or Llama (directory, "
                   "model.safetensors or its index), or GGUF of llama.cpp's gpt2 architecture")
        ->required();
    cli.add_option("OUT", o.output,
                   "NAME.gguf: GGUF; NAME.bin: llm.c's model file; anything else: a Hugging Face "
                   "directory (DIR/model.safetensors: the directory DIR); an existing OUT is "
                   "replaced only when it is a previous conversion's")
        ->required();
    cli.add_option("--to", o.to,
                   "hf | gguf | llmc: the output format, whatever OUT's name; gguf-lora: the "
                   "--lora-from adapter alone as a GGUF LoRA adapter for llama.cpp (IN: its base)")
        ->check(app::one_of({"hf", "gguf", "llmc", "gguf-lora"}, "output format"));
    cli.add_option("--dtype", o.dtype,
                   "matrices as f32 | f16 | bf16 | q8_0 (hf: f32/f16/bf16, gguf: all four, llmc: "
                   "f32/bf16, gguf-lora: f32/f16/bf16); 1-D GGUF tensors stay f32")
        ->check(app::one_of({"f32", "f16", "bf16", "q8_0"}, "GGUF type"))
        ->capture_default_str();
    cli.add_option("--tokenizer-dir", o.tokenizer_dir.path,
                   "GPT-2's tokenizer files (encoder.json + vocab.bpe, or vocab.json + merges.txt) "
                   "for an input of GPT-2's vocabulary that carries no tokenizer")
        ->type_name("DIR")
        ->capture_default_str();
    cli.add_flag("--weights-only", o.weights_only,
                 "Hugging Face output without tokenizer files (vocab.json, merges.txt, "
                 "tokenizer_config.json)");
    cli.add_option("--name", o.name, "general.name in a GGUF file (default: OUT's stem)");
    cli.add_option("--lora-from", o.lora_from,
                   "a PEFT LoRA adapter directory (adapter_config.json, "
                   "adapter_model.safetensors) for IN: merged into the weights written (W + "
                   "(alpha/r) B A), or with --to gguf-lora written alone")
        ->type_name("DIR");
    app::add_common_flags(cli, o.log_level);
    if (const auto code = app::parse_command_line(cli, argc, argv)) return *code;
    o.tokenizer_dir.given = cli.get_option("--tokenizer-dir")->count() > 0;
    app::setup_logging(o.log_level, app::LogStream::Stderr);
    try {
        return run(o);
    } catch (const gpt2::UsageError& e) {
        std::cerr << app::error_line(e.what()) << std::endl;
        return app::kExitBadFlags;
    } catch (const std::bad_alloc&) {
        std::cerr << app::error_line("out of memory converting " + o.input.string()) << std::endl;
        return app::kExitRuntimeError;
    } catch (const std::exception& e) {
        std::cerr << app::error_line(e.what()) << std::endl;
        return app::kExitRuntimeError;
    }
}
