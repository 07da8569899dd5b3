#include "apps/train_gpt2/options.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>

#include "apps/cli/cli.hpp"
#include "core/error.hpp"
#include "core/utf8.hpp"
#include "model/model.hpp"

namespace gpt2 {

namespace {

std::string trim(std::string_view text) {
    const auto first = text.find_first_not_of(" \t\r");
    if (first == std::string_view::npos) return {};
    const auto last = text.find_last_not_of(" \t\r");
    return std::string(text.substr(first, last - first + 1));
}

// The value part of `key = value`: quoted strings keep everything inside the quotes; a bare value
// ends at a comment.
std::string parse_value(const std::string& raw, const std::string& where) {
    if (raw.empty()) throw InputError(where + ": no value");
    const char quote = raw.front();
    if (quote == '"' || quote == '\'') {
        std::string value;
        std::size_t i = 1;
        for (; i < raw.size() && raw[i] != quote; ++i) {
            if (quote == '"' && raw[i] == '\\' && i + 1 < raw.size()) ++i;
            value += raw[i];
        }
        if (i == raw.size()) throw InputError(where + ": unterminated string");
        const std::string rest = trim(std::string_view(raw).substr(i + 1));
        if (!rest.empty() && rest.front() != '#' && rest.front() != ';') {
            throw InputError(where + ": unexpected text after the closing quote");
        }
        return value;
    }
    if (quote == '[' || quote == '{') {
        throw InputError(where + ": arrays and tables are not supported; give one value");
    }
    std::string value = raw;
    for (const char* comment : {" #", "\t#", " ;", "\t;"}) {
        const auto at = value.find(comment);
        if (at != std::string::npos) value.resize(at);
    }
    value = trim(value);
    if (value.empty()) throw InputError(where + ": no value");
    return value;
}

// Flags the config file may not set: they decide what the file is or end the program.
bool config_may_set(const std::string& flag) {
    return flag != "config" && flag != "help" && flag != "version";
}

// The --config path on the command line, if any (the last; parse_arguments refuses a second).
std::optional<std::string> config_path(int argc, char** argv) {
    std::optional<std::string> path;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--config" && i + 1 < argc) {
            path = argv[++i];
        } else if (arg.starts_with("--config=")) {
            path = std::string(arg.substr(9));
        }
    }
    return path;
}

}  // namespace

std::vector<std::string> read_config_file(const std::string& path, const CLI::App& app) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
        throw InputError("--config " + path +
                         " is a directory; give a file of 'flag = value' lines");
    }
    std::ifstream file(path);
    if (!file) {
        throw InputError("--config " + path + ": cannot open (" + std::strerror(errno) + ")");
    }
    {  // A binary file (a model, the program itself) is named as such, its bytes never printed.
        std::string head(4096, '\0');
        file.read(head.data(), static_cast<std::streamsize>(head.size()));
        head.resize(static_cast<std::size_t>(file.gcount()));
        const std::size_t nul = head.find('\0');
        // A cut at the end of the 4 KiB may split a character: only whole ones are judged.
        std::string_view whole(head);
        while (!whole.empty() && head.size() == 4096 &&
               (static_cast<unsigned char>(whole.back()) & 0xC0) == 0x80) {
            whole.remove_suffix(1);
        }
        if (!whole.empty() && head.size() == 4096) whole.remove_suffix(1);
        if (nul != std::string::npos || !is_valid_utf8(whole)) {
            throw InputError("--config " + path + " is not a text file (" +
                             (nul != std::string::npos ? "a NUL byte at byte " + std::to_string(nul)
                                                       : std::string("bytes that are not UTF-8")) +
                             "): give a file of 'flag = value' lines");
        }
        file.clear();
        file.seekg(0);
    }
    std::vector<std::string> candidates;
    for (const std::string& name : app::long_flag_names(app, false)) {
        if (config_may_set(name)) candidates.push_back(name);
    }
    // The line that set each option, so that a second one is refused (aliases are one option).
    std::map<const CLI::Option*, std::pair<int, std::string>> set_at;
    std::vector<std::string> args;
    std::string line;
    for (int number = 1; std::getline(file, line); ++number) {
        const std::string where = "--config " + path + ":" + std::to_string(number);
        const std::string text = trim(line);
        if (text.empty() || text.front() == '#' || text.front() == ';') continue;
        if (text.front() == '[') {
            throw InputError(where + ": sections such as " + text +
                             " are not supported; write flag = value lines only");
        }
        const auto equals = text.find('=');
        if (equals == std::string::npos) {
            throw InputError(where + ": expected 'flag = value', got '" + text + "'");
        }
        std::string key = trim(std::string_view(text).substr(0, equals));
        if (key.starts_with("--")) key = key.substr(2);
        std::replace(key.begin(), key.end(), '_', '-');
        if (key.empty()) throw InputError(where + ": no flag name before '='");
        const CLI::Option* option = config_may_set(key) && !key.starts_with("-")
                                        ? app.get_option_no_throw("--" + key)
                                        : nullptr;
        if (option == nullptr) {
            const std::string suggestion = app::closest_name(key, candidates);
            throw InputError(
                where + ": unknown key '" + key + "'" +
                (suggestion.empty() ? std::string() : " (did you mean '" + suggestion + "'?)"));
        }
        if (const auto earlier = set_at.find(option); earlier != set_at.end()) {
            const auto& [earlier_line, earlier_key] = earlier->second;
            throw InputError(where + ": '" + key + "' is already set on line " +
                             std::to_string(earlier_line) +
                             (earlier_key == key ? std::string()
                                                 : " (as '" + earlier_key + "', the same flag)") +
                             "; give it once");
        }
        set_at.emplace(option, std::pair{number, key});
        const std::string value =
            parse_value(trim(std::string_view(text).substr(equals + 1)), where + " (" + key + ")");
        if (option->get_expected_min() == 0) {  // a switch
            if (value == "true") {
                args.push_back("--" + key);
            } else if (value != "false") {
                throw InputError(where + ": " + key + " is a switch: true or false, not '" + value +
                                 "'");
            }
            continue;
        }
        args.push_back("--" + key);
        args.push_back(value);
    }
    if (file.bad()) {
        throw InputError("--config " + path + ": cannot read (" + std::strerror(errno) + ")");
    }
    return args;
}

namespace {

// The flags, one group per concern (as --help shows them).
void add_model_flags(CLI::App& app, TrainOptions& o) {
    auto* model = app.add_option_group("Model");
    model
        ->add_option("--model", o.model.preset,
                     "preset: gpt2-124M, gpt2-350M, gpt2-774M, gpt2-1558M (GPT-2's shapes, with "
                     "GPT-2's tokenizer unless weights or shards bring one), d6, char-small "
                     "(shapes for any --tokenizer), llama-135M, llama-tiny (the Llama family's "
                     "block: RMSNorm, rotary positions, SwiGLU, grouped-query attention, no "
                     "biases; SmolLM2-135M's shape and a small one, for any --tokenizer), "
                     "speedrun (modded-nanogpt's block of its 2024-11-03 record at 124M: "
                     "RMSNorm, rotary, QK-norm, ReLU^2, untied zero-initialized head); "
                     "--n-layer/--n-head/--n-embd/--block-size/--arch given with it override "
                     "the preset")
        ->check(app::one_of(preset_names(), "preset"))
        ->type_name("PRESET");
    model
        ->add_option("--n-layer", o.model.num_layers,
                     "transformer blocks (L; with --model: the preset's)")
        ->check(app::positive());
    model
        ->add_option("--n-head", o.model.num_heads,
                     "attention heads (NH; with --model: the preset's)")
        ->check(app::positive());
    model->add_option("--n-embd", o.model.channels, "channels (C; with --model: the preset's)")
        ->check(app::positive());
    model
        ->add_option("--block-size", o.model.block_size,
                     "max context (position embeddings); 0: the preset's with --model, else "
                     "--seq-len")
        ->check(app::at_least(0));
    model
        ->add_option("--arch", o.model.arch,
                     "the block's fields over the preset's (or GPT-2's), key=value,...: " +
                         std::string(architecture_field_keys()))
        ->type_name("FIELDS");
    model->add_option(
        "--init-from", o.model.init_from,
        "start from an llm.c model file, our checkpoint, a Hugging Face GPT-2 or Llama "
        "(directory or model.safetensors) or a GGUF of llama.cpp's gpt2 "
        "architecture: its shape and tokenizer");
}

void add_data_flags(CLI::App& app, TrainOptions& o) {
    auto* data = app.add_option_group("Data");
    data->add_option("--data", o.data.data, "plain-text corpus (read and tokenized by rank 0)");
    data->add_option("--train-data", o.data.train_data,
                     "llm.c token shards (glob), instead of --data");
    data->add_option("--val-data", o.data.val_data, "llm.c validation shards (glob)");
    data->add_option("--tokenizer", o.data.tokenizer,
                     "char | bpe | gpt2 (a checkpoint's or the shards' own tokenizer comes first; "
                     "default: gpt2 with a gpt2-* --model, else char)")
        ->transform(app::named_value(tokenizer_kinds_by_name(), "tokenizer"))
        ->type_name("NAME")
        ->default_str("");  // depends on --model: the description says how
    data->add_option("--vocab-size", o.data.vocab_size,
                     "vocabulary of the trained BPE (--tokenizer bpe)")
        ->check(app::at_least(257));
    data->add_option("--tokenizer-dir", o.data.tokenizer_dir,
                     "directory with encoder.json and vocab.bpe");
    data->add_option("--eot-in-text", o.data.eot_in_text,
                     "a literal <|endoftext|> in --data: token (the end-of-text token, documents "
                     "separated) | text (ordinary characters, as llm.c's encode_ordinary)")
        ->check(app::one_of({"token", "text"}, "--eot-in-text mode"))
        ->type_name("MODE");
    data->add_option("--val-fraction", o.data.val_fraction,
                     "last fraction of --data used for validation");
    data->add_flag("--no-shuffle", o.data.no_shuffle,
                   "visit windows in file order (as llm.c does)");
    data->add_flag("--attention-within-documents", o.data.attention_within_documents,
                   "document masking: a token attends only to its own document's tokens, a "
                   "document beginning at each end-of-text token (training and validation; "
                   "needs a tokenizer with one)");
}

void add_batch_flags(CLI::App& app, TrainOptions& o) {
    auto* batch = app.add_option_group("Batch");
    batch
        ->add_option("--batch-size,-b", o.batch.batch_size, "sequences per rank per micro-step (B)")
        ->check(app::positive());
    batch->add_option("--seq-len,-t", o.batch.seq_len, "tokens per sequence (T)")
        ->check(app::positive());
    batch
        ->add_option("--grad-accum", o.batch.grad_accum,
                     "micro-steps per optimizer step (0: derive)")
        ->check(app::at_least(0));
    batch
        ->add_option("--total-batch-tokens", o.batch.total_batch_tokens,
                     "tokens per optimizer step over all ranks; derives --grad-accum")
        ->check(app::at_least(0));
}

// --optimizer's values: auto, then the optimizers' names.
std::vector<std::string> optimizer_choices() {
    std::vector<std::string> names{"auto"};
    for (std::string& name : optimizer_names())
        names.push_back(std::move(name));
    return names;
}

void add_optimizer_flags(CLI::App& app, TrainOptions& o, std::string& schedule,
                         std::string& optimizer) {
    auto* opt = app.add_option_group("Optimizer");
    opt->add_option(
           "--optimizer", optimizer,
           "auto | adamw | muon (Muon on the hidden matrices, AdamW with --lr on the "
           "embeddings, the LM head, LayerNorms and biases; auto (the default): muon for a "
           "run from scratch where its Newton-Schulz iterations cost at most half of "
           "forward and backward, else adamw; adamw for fine-tuning; a resumed run's "
           "own)")
        ->check(app::one_of(optimizer_choices(), "optimizer"))
        ->type_name("NAME");
    opt->add_option("--lr", o.optimizer.lr, "peak learning rate (AdamW's)")->check(app::positive());
    opt->add_option("--muon-lr", o.optimizer.muon_lr,
                    "Muon's peak learning rate (the schedule scales it as --lr)")
        ->check(app::positive());
    opt->add_option("--muon-momentum", o.optimizer.muon_momentum,
                    "Muon's momentum (Nesterov), in [0, 1)");
    opt->add_option("--muon-weight-decay", o.optimizer.muon_weight_decay,
                    "Muon's decoupled weight decay (times its learning rate)")
        ->check(app::at_least(0));
    opt->add_option("--min-lr", o.optimizer.min_lr,
                    "final learning rate of the decay (default: --lr / 10, nanoGPT's advice; "
                    "given, it is absolute)")
        ->check(app::at_least(0))
        ->default_str("");
    opt->add_option("--warmup-steps", o.optimizer.warmup_steps, "linear warmup steps")
        ->check(app::at_least(0));
    opt->add_option("--schedule", schedule, "cosine | linear | constant")
        ->check(app::one_of({"cosine", "linear", "constant"}, "schedule"))
        ->type_name("NAME");
    opt->add_option("--lr-decay-steps", o.optimizer.lr_decay_steps,
                    "steps the schedule spans (0: --max-steps when the run starts; kept on "
                    "resume)")
        ->check(app::at_least(0));
    opt->add_option("--weight-decay", o.optimizer.weight_decay,
                    "AdamW decoupled weight decay (2-D weights)")
        ->check(app::at_least(0));
    opt->add_option("--beta1", o.optimizer.beta1, "AdamW beta1, in [0, 1)");
    opt->add_option("--beta2", o.optimizer.beta2, "AdamW beta2, in [0, 1)");
    opt->add_option("--eps", o.optimizer.eps, "AdamW epsilon")->check(app::positive());
    opt->add_option("--grad-clip", o.optimizer.grad_clip, "max global gradient norm (0: off)")
        ->check(app::at_least(0));
    opt->add_option("--dropout", o.optimizer.dropout,
                    "dropout rate, in [0, 1), on the embeddings, the attention probabilities and "
                    "the attention and MLP outputs (training steps only; 0: none)");
    opt->add_option("--max-steps", o.optimizer.max_steps, "optimizer steps to train")
        ->check(app::positive());
}

void add_lora_flags(CLI::App& app, TrainOptions& o) {
    auto* lora = app.add_option_group("LoRA");
    lora->add_option("--lora-rank", o.lora.rank,
                     "train a LoRA adapter of this rank on the frozen base model (0: train the "
                     "whole model)")
        ->check(app::at_least(0));
    lora->add_option("--lora-alpha", o.lora.alpha, "LoRA's alpha: the update is (alpha / rank) B A")
        ->check(app::positive());
    lora->add_option("--lora-targets", o.lora.targets,
                     "the projections adapted, PEFT's names, comma-separated: GPT-2's c_attn, "
                     "attn.c_proj, c_fc, mlp.c_proj, c_proj (both projections); the Llama "
                     "family's q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; or "
                     "all")
        ->type_name("LIST");
    lora->add_option("--lora-dropout", o.lora.dropout,
                     "dropout rate, in [0, 1), on each adapter's input (PEFT's lora_dropout; "
                     "training steps only; 0: none)");
    lora->add_option_function<std::string>(
            "--lora-base", [&o](const std::string& base) { o.lora.bf16_base = base == "bf16"; },
            "how the frozen base is held: fp32 (the fp32 weights and, with --precision bf16, "
            "their bf16 copy) or bf16 (with --precision bf16: the layer matrices only in bf16, "
            "over half the base's memory saved; the merged checkpoint is of the bf16-rounded "
            "base)")
        ->check(app::one_of({"fp32", "bf16"}, "--lora-base value"))
        ->default_str("fp32")
        ->type_name("fp32|bf16");
    lora->add_option("--lora-from", o.lora.from,
                     "continue training a PEFT adapter directory (its rank, alpha and targets)")
        ->type_name("DIR");
}

// Evaluation, samples, checkpoints and resume, the skip policy.
void add_progress_flags(CLI::Option_group* run, TrainOptions& o) {
    run->add_option("--val-every", o.eval.val_every, "validate every N steps (0: only at the end)")
        ->check(app::at_least(0));
    run->add_option("--val-tokens", o.eval.val_tokens,
                    "validate on the first N tokens of the validation data, in whole windows of "
                    "--seq-len (the same loss for any batch size, threads and ranks)")
        ->check(app::positive());
    run->add_option("--sample-every", o.eval.sample_every,
                    "print a sample every N steps (0: never)")
        ->check(app::at_least(0));
    run->add_option("--max-new-tokens,--sample-tokens", o.eval.sample_tokens,
                    "tokens per printed sample (as inference's --max-new-tokens)")
        ->check(app::at_least(0));
    run->add_option("--checkpoint-every", o.checkpoints.checkpoint_every,
                    "checkpoint every N steps (0: only at the end)")
        ->check(app::at_least(0));
    run->add_option("--checkpoint-minutes", o.checkpoints.checkpoint_minutes,
                    "also checkpoint when this many minutes have passed since the last one (0: "
                    "off)")
        ->check(app::at_least(0.0));
    run->add_option("--keep-checkpoints", o.checkpoints.keep_checkpoints,
                    "checkpoints of this run kept in --out-dir (0: all)")
        ->check(app::at_least(0));
    run->add_option("--out-dir", o.checkpoints.out_dir, "where checkpoints go");
    run->add_option("--resume", o.checkpoints.resume,
                    "'auto' (newest checkpoint in --out-dir, else --init-from or fresh) or a "
                    "state_N.bin file");
    run->add_option("--max-bad-steps", o.safety.max_bad_steps,
                    "stop after this many skipped steps in a row (non-finite or spikes)")
        ->check(app::positive());
    run->add_option("--hellaswag", o.eval.hellaswag,
                    "llm.c's HellaSwag file (data/hellaswag/hellaswag_val.bin from "
                    "scripts/get_hellaswag.sh): log acc_norm");
    run->add_flag("--eval-only", o.eval.eval_only,
                  "evaluate the weights (--init-from, --resume, or fresh) and exit: validation "
                  "loss and bits per byte over --val-tokens, HellaSwag with --hellaswag; no step, "
                  "no checkpoint");
    run->add_option("--eval-every", o.eval.eval_every,
                    "HellaSwag every N steps (0: with each validation, and at the end)")
        ->check(app::at_least(0));
    run->add_option("--skip-loss-z", o.safety.skip_loss_z,
                    "skip the update when the loss is this many standard deviations above the "
                    "last 128 steps (0: never; llm.c's -sl)")
        ->check(app::at_least(0));
    run->add_option("--skip-norm-z", o.safety.skip_norm_z,
                    "the same for the gradient norm (0: never; llm.c's -sg)")
        ->check(app::at_least(0));
    run->add_option("--check-replicas", o.safety.check_replicas,
                    "compare parameter checksums across ranks every K steps")
        ->check(app::at_least(0));
}

// The machine: seed, workers, how ranks exchange the gradient, precision, recomputation.
void add_machine_flags(CLI::Option_group* run, TrainOptions& o, std::string& precision,
                       std::string& bucket_mb, std::string& share_memory, std::string& recompute) {
    run->add_option("--seed", o.seed, "seed for initialisation, data order and samples")
        ->check(app::whole_number());
    run->add_option(
           "--threads", o.parallel.threads,
           "worker threads per rank (0: one per core in the affinity mask, at most --batch-size)")
        ->check(app::at_least(0));
    run->add_flag("--pin-threads", o.parallel.pin_threads, "bind each worker thread to one CPU");
    run->add_option("--bucket-mb", bucket_mb,
                    "with several ranks: MiB of gradient per allreduce bucket, sent while backward "
                    "runs (with shared memory on several machines: of each rank's slice); 0: one "
                    "allreduce (ZeRO-1: reduce-scatter) after backward; > 0 on one machine turns "
                    "sharing off; auto: 25 when the ranks span machines and no --zero, else 0")
        ->check(CLI::Validator(
            [](const std::string& text) -> std::string {
                if (text == "auto") return {};
                char* end = nullptr;
                const double mib = std::strtod(text.c_str(), &end);
                if (end == text.c_str() || *end != '\0' || !(mib >= 0.0 && mib <= 4096.0)) {
                    return text + " is not auto or a size in MiB from 0 to 4096";
                }
                return {};
            },
            "", "bucket size"))
        ->type_name("MIB|auto");
    run->add_option("--share-memory", share_memory,
                    "auto: the ranks of a machine train one copy of the weights in shared memory, "
                    "each summing and updating a slice, and across machines each slice takes an "
                    "allreduce (unless --zero 1, or --bucket-mb > 0 on one machine); off: every "
                    "rank takes part in the allreduce")
        ->check(app::one_of({"auto", "off"}, "--share-memory value"))
        ->type_name("auto|off");
    run->add_option("--zero", o.parallel.zero,
                    "ZeRO stage: 1 slices the optimizer's state and the update over the ranks "
                    "(reduce-scatter, then allgather of the parameters); 0: every rank keeps all "
                    "(the default, but 1 for Muon on ranks that share no memory unless 0 is given)")
        ->check(app::one_of({"0", "1"}, "ZeRO stage"))
        ->type_name("0|1");
    run->add_option("--precision", precision,
                    "fp32 | bf16: matrix products in bf16 with fp32 accumulation (weights, "
                    "gradients and optimizer stay fp32)")
        ->check(app::one_of({"fp32", "bf16"}, "precision"))
        ->type_name("NAME");
    run->add_option("--recompute", recompute,
                    "what backward recomputes instead of storing: cheap (LayerNorm and GELU "
                    "outputs, attention's probabilities), layers (also every layer's forward: only "
                    "layer inputs are stored), auto (the least that fits in the memory available)")
        ->check(app::one_of({"auto", "cheap", "layers"}, "recompute level"))
        ->type_name("auto|cheap|layers");
}

// What the log shows, metrics, the MFU yardstick, benchmarks, and the hidden test hooks.
void add_reporting_flags(CLI::Option_group* run, TrainOptions& o) {
    run->add_option("--log-every", o.log_every,
                    "print every Nth step line (0: tens of lines for the run: the smallest of 1, "
                    "2, 5, 10, 20, ... giving at most 50); the first and last steps and skipped "
                    "ones always print, validation, samples and checkpoints too, and every step "
                    "goes to --metrics-file")
        ->check(app::at_least(0));
    run->add_flag("--verbose", o.verbose,
                  "start-up also prints the memory each worker's context takes, part by part, and "
                  "the rank's gradient, weights and moments");
    run->add_option("--metrics-file", o.metrics_file,
                    "append one JSON object per step/eval (a 'run' record starts each run)");
    run->add_option("--peak-gflops", o.compute.peak_gflops,
                    "one core's fp32 peak GFLOP/s, the MFU yardstick (0: measured at start-up "
                    "with the GEMM kernels' instructions)")
        ->check(app::at_least(0));
    run->add_option("--benchmark", o.compute.benchmark,
                    "time N steps after warm-up, print figures, exit")
        ->check(app::at_least(0));
    run->add_option("--inject-nan-step", o.test.inject_nan_step,
                    "testing: poison the gradient at this step")
        ->group("");
    run->add_option("--inject-spike-step", o.test.inject_spike_step,
                    "testing: scale the gradient by 10^4 at this step")
        ->group("");
    run->add_option("--stop-at-step", o.test.stop_at_step,
                    "testing: act as if SIGTERM came at this step")
        ->group("");
    run->add_option("--mpi-chunk-elements", o.test.mpi_chunk_elements,
                    "testing: elements per MPI call")
        ->group("");
    run->add_flag("--inject-share-failure", o.test.inject_share_failure,
                  "testing: machines other than the first cannot share memory")
        ->group("");
    run->add_flag("--test-poison-lora-base", o.test.poison_released_base,
                  "testing: --lora-base bf16 fills the fp32 layer matrices with NaN instead")
        ->group("");
    run->add_option("--test-minutes-per-step", o.test.minutes_per_step,
                    "testing: the --checkpoint-minutes clock advances this much per step")
        ->group("");
    run->add_option("--simulate-machines", o.test.simulate_machines,
                    "testing: treat the ranks as N machines of consecutive ranks")
        ->check(app::at_least(0))
        ->group("");
}

void add_run_flags(CLI::App& app, TrainOptions& o, std::string& precision, std::string& bucket_mb,
                   std::string& share_memory, std::string& recompute) {
    auto* run = app.add_option_group("Run");
    add_progress_flags(run, o);
    add_machine_flags(run, o, precision, bucket_mb, share_memory, recompute);
    add_reporting_flags(run, o);
}

}  // namespace

std::variant<TrainOptions, int> parse_train_options(int argc, char** argv, bool speaker) {
    TrainOptions o;
    CLI::App app{"gpt2-mpi: train a GPT-2 on CPUs (run under mpirun -np N for several ranks)",
                 "train_gpt2"};
    // A flag in --config and again on the command line: the command line wins (a flag given twice
    // on the command line is refused by parse_arguments).
    app.option_defaults()->always_capture_default()->multi_option_policy(
        CLI::MultiOptionPolicy::TakeLast);
    app::add_common_flags(app, o.log_level);
    std::string config_file;
    app.add_option("--config", config_file,
                   "read flags from a file: one 'flag = value' per line, applied before the "
                   "command line (which wins)");

    std::string schedule = "cosine";
    std::string optimizer = "auto";
    std::string precision = "fp32";
    std::string bucket_mb = "auto";
    std::string share_memory = "auto";
    std::string recompute = "auto";
    add_model_flags(app, o);
    add_data_flags(app, o);
    add_batch_flags(app, o);
    add_optimizer_flags(app, o, schedule, optimizer);
    add_lora_flags(app, o);
    add_run_flags(app, o, precision, bucket_mb, share_memory, recompute);

    // The config file's flags go first, so that the command line overrides them.
    std::vector<std::string> args;
    if (const auto path = config_path(argc, argv)) {
        try {
            args = read_config_file(*path, app);
        } catch (const InputError& e) {
            if (speaker) std::cerr << app::error_line(e.what()) << std::endl;
            return app::kExitBadFlags;
        }
        o.config_file = *path;
    }
    const std::size_t from_config = args.size();
    args.insert(args.end(), argv + 1, argv + argc);
    if (const std::optional<int> code = app::parse_arguments(app, args, from_config, speaker)) {
        return *code;
    }
    // --min-lr follows --lr unless given (config file or command line).
    if (app.get_option("--min-lr")->count() == 0) o.optimizer.min_lr = o.optimizer.lr / 10.0f;
    o.optimizer.automatic = optimizer == "auto";
    if (!o.optimizer.automatic) o.optimizer.kind = *parse_optimizer_kind(optimizer);  // one_of
    o.optimizer.schedule = schedule == "linear"     ? LrSchedule::Linear
                           : schedule == "constant" ? LrSchedule::Constant
                                                    : LrSchedule::Cosine;
    o.compute.precision = precision == "bf16" ? Precision::Bf16 : Precision::Fp32;
    o.parallel.bucket_mb = bucket_mb == "auto" ? -1.0 : std::strtod(bucket_mb.c_str(), nullptr);
    o.parallel.share_memory = share_memory == "auto";
    if (recompute != "auto") {
        o.compute.recompute = recompute == "layers" ? Recompute::Layers : Recompute::Cheap;
    }
    for (const std::string& flag : app::long_flag_names(app, true)) {
        if (app.get_option("--" + flag)->count() > 0) o.given.insert(flag);
    }
    return o;
}

}  // namespace gpt2
