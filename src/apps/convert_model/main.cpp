// convert_model: reads any model the project reads (our checkpoints, llm.c model files, Hugging
// Face GPT-2 directories) and writes it as a Hugging Face directory, a GGUF file for llama.cpp, or
// llm.c's model file. Parsing and wiring only: the formats live in src/formats/.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "apps/common/cli.hpp"
#include "core/error.hpp"
#include "formats/gguf.hpp"
#include "formats/hugging_face.hpp"
#include "formats/model_file.hpp"
#include "tokenizer/tokenizer.hpp"

namespace fs = std::filesystem;

namespace {

namespace app = gpt2::app;

struct Options {
    fs::path input;
    fs::path output;
    std::string to;  // hf | gguf | llmc; empty: from the output's name
    std::string dtype = "f32";
    fs::path tokenizer_dir;
    bool weights_only = false;
    std::string name;
    std::string log_level = "info";
};

// The format OUT asks for: --to, else a .gguf or .bin name, else a Hugging Face directory.
std::string output_format(const Options& o) {
    if (!o.to.empty()) return o.to;
    if (o.output.extension() == ".gguf") return "gguf";
    if (o.output.extension() == ".bin") return "llmc";
    return "hf";
}

// What the flags ask for is possible: a dtype of the format, --weights-only only for Hugging Face,
// and an output that is not the input.
void check_request(const Options& o, const std::string& format) {
    const std::map<std::string, std::vector<std::string>> dtypes = {
        {"hf", {"f32", "f16", "bf16"}},
        {"gguf", {"f32", "f16", "bf16", "q8_0"}},
        {"llmc", {"f32", "bf16"}}};
    const auto& allowed = dtypes.at(format);
    if (std::find(allowed.begin(), allowed.end(), o.dtype) == allowed.end()) {
        std::string list;
        for (const std::string& d : allowed)
            list += (list.empty() ? "" : ", ") + d;
        throw gpt2::UsageError("--dtype " + o.dtype + " is not available for " + format +
                               " output (" + list + ")");
    }
    if (o.weights_only && format != "hf") {
        throw gpt2::UsageError("--weights-only applies to Hugging Face output only (" + format +
                               " is written as it is)");
    }
    std::error_code ec;
    if (fs::exists(o.output, ec) && fs::equivalent(o.input, o.output, ec)) {
        throw gpt2::UsageError(o.output.string() + ": the output is the input");
    }
}

// The input's own tokenizer, or GPT-2's from --tokenizer-dir (never both); null if neither.
struct InputTokenizer {
    std::unique_ptr<gpt2::Tokenizer> tokenizer;
    std::string origin;
};
InputTokenizer input_tokenizer(const Options& o, const gpt2::LoadedModel& loaded) {
    const gpt2::Model& model = loaded.model;
    std::unique_ptr<gpt2::Tokenizer> tokenizer;
    std::string tokenizer_origin;
    if (loaded.extras && !loaded.extras->tokenizer.empty()) {
        tokenizer = gpt2::deserialize_tokenizer(loaded.extras->tokenizer);
        tokenizer_origin = "the input's own";
        if (!o.tokenizer_dir.empty()) {
            throw gpt2::UsageError("--tokenizer-dir " + o.tokenizer_dir.string() + ": " +
                                   o.input.string() +
                                   " carries its own tokenizer; leave out --tokenizer-dir");
        }
    } else if (!o.tokenizer_dir.empty()) {
        tokenizer = gpt2::load_gpt2_tokenizer(o.tokenizer_dir);
        tokenizer_origin = "GPT-2's from " + o.tokenizer_dir.string();
        if (tokenizer->vocab_size() != model.config.vocab_size) {
            throw gpt2::InputError("--tokenizer-dir " + o.tokenizer_dir.string() + ": " +
                                   std::to_string(tokenizer->vocab_size()) +
                                   " tokens, but the model has a vocabulary of " +
                                   std::to_string(model.config.vocab_size));
        }
    }
    return {std::move(tokenizer), tokenizer_origin};
}

void write_llmc(const Options& o, const gpt2::Model& model, const gpt2::Tokenizer* tokenizer) {
    gpt2::save_llmc_model(
        o.output, model,
        o.dtype == "bf16" ? gpt2::kLlmcModelVersionBf16 : gpt2::kLlmcModelVersionFp32);
    spdlog::info("wrote {}: llm.c model file, version {} ({})", o.output.string(),
                 o.dtype == "bf16" ? 5 : 3, o.dtype);
    if (tokenizer) {
        spdlog::info(
            "llm.c's model file holds no tokenizer: give llm.c its own "
            "gpt2_tokenizer.bin (prepare_data writes one)");
    }
}

void write_gguf_file(const Options& o, const gpt2::Model& model, const gpt2::Tokenizer* tokenizer) {
    if (!tokenizer) {
        throw gpt2::InputError(o.input.string() +
                               " has no tokenizer, and a GGUF file must embed one: pass "
                               "--tokenizer-dir DIR (GPT-2's encoder.json and vocab.bpe)");
    }
    const std::map<std::string, gpt2::GgufWeights> weights = {{"f32", gpt2::GgufWeights::F32},
                                                              {"f16", gpt2::GgufWeights::F16},
                                                              {"bf16", gpt2::GgufWeights::Bf16},
                                                              {"q8_0", gpt2::GgufWeights::Q8_0}};
    const std::string name = o.name.empty() ? o.output.stem().string() : o.name;
    gpt2::write_gguf(o.output, model, *tokenizer, weights.at(o.dtype), name);
    spdlog::info("wrote {}: GGUF v3, llama.cpp architecture gpt2, {} matrices", o.output.string(),
                 o.dtype);
}

void write_hugging_face(const Options& o, const gpt2::Model& model,
                        const gpt2::Tokenizer* tokenizer) {
    if (tokenizer && tokenizer->kind() == gpt2::TokenizerKind::Char && !o.weights_only) {
        throw gpt2::InputError(
            o.input.string() +
            ": its char tokenizer has no Hugging Face form (GPT-2's tokenizer classes are "
            "byte-level BPE): pass --weights-only to write the weights without tokenizer files");
    }
    const gpt2::ElementType type = o.dtype == "f32"   ? gpt2::ElementType::F32
                                   : o.dtype == "f16" ? gpt2::ElementType::F16
                                                      : gpt2::ElementType::Bf16;
    gpt2::write_hugging_face_model(o.output, model, o.weights_only ? nullptr : tokenizer, type);
    spdlog::info(
        "wrote {}: Hugging Face GPT2LMHeadModel, model.safetensors {}{}", o.output.string(),
        o.dtype,
        tokenizer && !o.weights_only ? ", vocab.json, merges.txt" : ", no tokenizer files");
}

int run(const Options& o) {
    const std::string format = output_format(o);
    check_request(o, format);
    std::vector<std::string> notes;
    gpt2::LoadedModel loaded = gpt2::load_model_file(o.input, &notes);
    for (const std::string& note : notes)
        spdlog::info("{}", note);
    const gpt2::Model& model = loaded.model;
    const auto [tokenizer, tokenizer_origin] = input_tokenizer(o, loaded);
    spdlog::info("read {}: {}, tokenizer {}", o.input.string(), gpt2::describe(model.config),
                 tokenizer ? std::string(gpt2::tokenizer_kind_name(tokenizer->kind())) + " (" +
                                 tokenizer_origin + ")"
                           : std::string("none"));

    if (format == "llmc") {
        write_llmc(o, model, tokenizer.get());
    } else if (format == "gguf") {
        write_gguf_file(o, model, tokenizer.get());
    } else {
        write_hugging_face(o, model, tokenizer.get());
    }
    return app::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    CLI::App cli(
        "convert_model: write a model as a Hugging Face directory, GGUF (llama.cpp) or "
        "llm.c's model file",
        "convert_model");
    cli.add_option("IN", o.input,
                   "a checkpoint, llm.c model file, or Hugging Face GPT-2 (directory, "
                   "model.safetensors or its index)")
        ->required();
    cli.add_option("OUT", o.output,
                   "NAME.gguf: GGUF; NAME.bin: llm.c's model file; anything else: a Hugging Face "
                   "directory")
        ->required();
    cli.add_option("--to", o.to, "hf | gguf | llmc: the output format, whatever OUT's name")
        ->check(CLI::IsMember({"hf", "gguf", "llmc"}).description(""));
    cli.add_option("--dtype", o.dtype,
                   "matrices as f32 | f16 | bf16 | q8_0 (hf: f32/f16/bf16, gguf: all four, llmc: "
                   "f32/bf16); 1-D GGUF tensors stay f32")
        ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}).description(""))
        ->capture_default_str();
    cli.add_option("--tokenizer-dir", o.tokenizer_dir,
                   "GPT-2's tokenizer files (encoder.json + vocab.bpe, or vocab.json + merges.txt) "
                   "for an input that carries no tokenizer");
    cli.add_flag("--weights-only", o.weights_only,
                 "Hugging Face output without tokenizer files (for a tokenizer that has no "
                 "Hugging Face form)");
    cli.add_option("--name", o.name, "general.name in a GGUF file (default: OUT's stem)");
    app::add_common_flags(cli, o.log_level);
    if (const auto code = app::parse_command_line(cli, argc, argv)) return *code;
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
