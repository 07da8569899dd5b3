#include "apps/inference/options.hpp"

#include <CLI/CLI.hpp>

#include <iostream>
#include <optional>

#include "apps/cli/cli.hpp"
#include "core/error.hpp"

namespace gpt2::inference {

namespace {

// The model and what to generate from: --prompt, --prompt-file or none (end-of-text).
void add_input_flags(CLI::App& app, Options& o) {
    app.add_option("checkpoint", o.checkpoint,
                   "checkpoint, llm.c model file, Hugging Face GPT-2 or Llama (directory or "
                   "model.safetensors), or GGUF of llama.cpp's gpt2 architecture")
        ->required()
        ->type_name("MODEL");
    auto* prompt = app.add_option("--prompt", o.prompt, "prompt text (none: end-of-text)");
    auto* prompt_file =
        app.add_option("--prompt-file", o.prompt_file,
                       "read the prompt from FILE, as is ('-': all of standard input)")
            ->type_name("FILE");
    prompt->excludes(prompt_file);
}

// How many samples, how they are drawn, and how they are printed.
void add_sampling_flags(CLI::App& app, Options& o) {
    app.add_option("--max-new-tokens,--sample-tokens", o.max_new_tokens,
                   "tokens to generate per sample")
        ->check(app::at_least(0));
    app.add_option("--temperature", o.temperature, "softmax temperature (0: greedy)")
        ->check(app::at_least(0));
    app.add_option("--top-k", o.top_k, "sample among the k most likely tokens (0: all)")
        ->check(app::at_least(0));
    app.add_option("--top-p", o.top_p, "nucleus sampling: smallest set with this mass, in (0, 1]")
        ->check(app::in_unit_interval());
    app.add_option("--seed", o.seed, "sample m draws from a stream derived from (seed, m)")
        ->check(app::whole_number());
    app.add_option("--num-samples", o.num_samples, "samples per prompt (shared between ranks)")
        ->check(app::positive());
    // Two flags rather than CLI11's "--stream,!--no-stream", whose help reads as if streaming
    // were off by default ("--stream,--no-stream{false}").
    auto* stream = app.add_flag_callback(
        "--stream", [&o] { o.stream = true; }, "print each token as it is generated (the default)");
    app.add_flag_callback(
           "--no-stream", [&o] { o.stream = false; },
           "print each sample when it is done instead of token by token")
        ->excludes(stream);
    app.add_flag("--interactive", o.interactive,
                 "read prompts from stdin, one per line, until end of file (a line that "
                 "cannot be encoded is reported and skipped)")
        ->excludes(app.get_option("--prompt"))
        ->excludes(app.get_option("--prompt-file"));
    app.add_flag("--chat", o.chat,
                 "a conversation: each stdin line is the user's message, answered by the "
                 "assistant's, both laid out as prepare_data lays out chat records (role: "
                 "content, joined by blank lines) for a model trained on them")
        ->excludes(app.get_option("--prompt"))
        ->excludes(app.get_option("--prompt-file"))
        ->excludes(app.get_option("--interactive"));
    app.add_option("--system", o.system,
                   "with --chat: the conversation's first message, the system's")
        ->needs(app.get_option("--chat"))
        ->type_name("TEXT");
}

// When a sample ends before --max-new-tokens, and what makes repeats less likely.
void add_stop_flags(CLI::App& app, Options& o) {
    app.add_flag("--ignore-eot", o.ignore_eot,
                 "go on past the end-of-text token (default: a sample ends there, the token not "
                 "printed)");
    app.add_option("--stop", o.stop,
                   "end a sample where the generated text contains this string (not printed); "
                   "repeat for several")
        ->type_name("TEXT")
        ->allow_extra_args(false);
    app.add_option("--repetition-penalty", o.repetition_penalty,
                   "> 1 makes tokens already in the prompt or the sample less likely (their "
                   "logits divided by it where positive, multiplied where negative, as Hugging "
                   "Face's repetition_penalty); 1: off")
        ->check(app::positive());
}

// The machine's share of the work and the tokenizer.
void add_model_flags(CLI::App& app, Options& o) {
    app.add_option("--weights", o.weights,
                   "fp32 | bf16 | int8: the matrices' format for decoding (int8: per-row scales; "
                   "fewer bytes per token, so faster; with either, the K/V cache is bf16)")
        ->check(app::one_of({"fp32", "bf16", "int8"}, "weight format"))
        ->type_name("NAME");
    app.add_option(
           "--threads", o.threads,
           "worker threads per rank (0: one per core available, 1 for models under 16M parameters)")
        ->check(app::at_least(0));
    app.add_option("--tokenizer", o.tokenizer,
                   "for a model file without a tokenizer: gpt2 (from --tokenizer-dir), or char | "
                   "bpe (rebuilt from --tokenizer-corpus); none: a checkpoint's own, or gpt2 for "
                   "a model of GPT-2's vocabulary (50257)")
        ->check(app::one_of({"bpe", "char", "gpt2"}, "tokenizer"))
        ->type_name("NAME");
    app.add_option("--tokenizer-dir", o.tokenizer_dir,
                   "directory with GPT-2's encoder.json and vocab.bpe")
        ->type_name("DIR");
    app.add_option("--eot-in-text", o.eot_in_text,
                   "a literal <|endoftext|> in a prompt: token (the end-of-text token) | text "
                   "(ordinary characters)")
        ->check(app::one_of({"token", "text"}, "--eot-in-text mode"))
        ->type_name("MODE");
    app.add_option("--tokenizer-corpus", o.tokenizer_corpus,
                   "text the char or bpe tokenizer was built from (--tokenizer char|bpe)")
        ->type_name("FILE");
}

void validate(const Options& o) {
    for (const std::string& stop : o.stop) {
        if (stop.empty()) throw InputError("--stop: an empty string would stop at once");
    }
    if (o.chat && o.num_samples > 1) {
        throw InputError("--chat answers each message once: drop --num-samples " +
                         std::to_string(o.num_samples));
    }
    const std::optional<gpt2::TokenizerKind> kind = o.tokenizer_kind();
    const bool rebuilt = kind == gpt2::TokenizerKind::Char || kind == gpt2::TokenizerKind::Bpe;
    if (rebuilt && o.tokenizer_corpus.empty()) {
        throw InputError("--tokenizer " + o.tokenizer +
                         " needs --tokenizer-corpus FILE (its source text)");
    }
    if (!rebuilt && !o.tokenizer_corpus.empty()) {
        throw InputError(
            "--tokenizer-corpus is the text a char or bpe tokenizer is rebuilt from: " +
            (o.tokenizer.empty() ? std::string("give --tokenizer char|bpe with it")
                                 : "--tokenizer " + o.tokenizer + " does not use it") +
            ", or drop it");
    }
}

}  // namespace

std::variant<Options, int> parse_options(int argc, char** argv, bool speaker) {
    Options o;
    CLI::App app{"Generate text from a GPT-2 checkpoint (KV cache; MPI shares the samples)",
                 "inference"};
    app.option_defaults()->always_capture_default();
    app::add_common_flags(app, o.log_level);
    add_input_flags(app, o);
    add_sampling_flags(app, o);
    add_stop_flags(app, o);
    add_model_flags(app, o);
    if (const std::optional<int> code = app::parse_command_line(app, argc, argv, speaker)) {
        return *code;
    }
    try {
        validate(o);
    } catch (const InputError& e) {
        if (speaker) std::cerr << app::error_line(e.what()) << std::endl;
        return app::kExitBadFlags;
    }
    return o;
}

}  // namespace gpt2::inference
