#include "train/options.hpp"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <filesystem>

#include "core/error.hpp"
#include "formats/resume_state.hpp"
#include "model/lora.hpp"

namespace gpt2 {

ModelConfig requested_model(const TrainOptions& o, int vocab_size) {
    if (o.model.preset.empty()) {
        const int maxT = o.model.block_size > 0 ? o.model.block_size : o.batch.seq_len;
        return ModelConfig{maxT,
                           vocab_size,
                           pad_vocab(vocab_size),
                           o.model.num_layers,
                           o.model.num_heads,
                           o.model.channels,
                           with_fields(Architecture{}, o.model.arch, "--arch")};
    }
    ModelConfig c = preset_config(o.model.preset, vocab_size);
    if (o.was_given("n-layer")) c.num_layers = o.model.num_layers;
    if (o.was_given("n-head")) c.num_heads = o.model.num_heads;
    if (o.was_given("n-embd")) c.channels = o.model.channels;
    if (o.model.block_size > 0) c.max_seq_len = o.model.block_size;
    c.arch = with_fields(c.arch, o.model.arch, "--arch");
    return c;
}

std::vector<std::string> unused_flag_warnings(const TrainOptions& o, int world_size) {
    std::vector<std::string> warnings;
    const auto unused = [&](bool applies, const char* flag, const std::string& only) {
        if (!applies && o.was_given(flag)) {
            warnings.push_back(std::string("--") + flag + " only applies " + only + "; ignored");
        }
    };
    unused(!o.eval.hellaswag.empty(), "eval-every", "with --hellaswag (HellaSwag's evaluations)");
    unused(o.eval.sample_every > 0, "max-new-tokens",
           "to the samples, and --sample-every 0 prints none");
    const bool tokenizes = o.data.train_data.empty();  // shards bring their tokens
    unused(!tokenizes || requested_tokenizer(o) == TokenizerKind::Bpe, "vocab-size",
           "to --tokenizer bpe, trained on --data");
    unused(tokenizes, "eot-in-text",
           "to --data, which is tokenized at start-up (shards are "
           "tokens already)");
    unused(world_size > 1, "bucket-mb", "with several ranks");
    unused(world_size > 1, "share-memory", "with several ranks");
    const bool trains = o.compute.benchmark == 0 && !o.eval.eval_only;
    const std::string saves_none = o.eval.eval_only ? "--eval-only" : "--benchmark";
    unused(trains, "checkpoint-every", "to training runs (" + saves_none + " saves none)");
    unused(trains, "keep-checkpoints", "to training runs (" + saves_none + " saves none)");
    unused(!o.eval.eval_only || o.eval.hellaswag.empty(), "eval-every",
           "during training (--eval-only evaluates once)");
    return warnings;
}

int log_every_for(std::int64_t steps) {
    constexpr std::int64_t kMostLines = 50;
    for (std::int64_t scale = 1;; scale *= 10) {
        for (const std::int64_t every : {scale, 2 * scale, 5 * scale}) {
            if (steps <= kMostLines * every || every >= (std::int64_t{1} << 40)) {
                return static_cast<int>(std::min<std::int64_t>(every, 1 << 30));
            }
        }
    }
}

TokenizerKind requested_tokenizer(const TrainOptions& o) {
    if (!o.was_given("tokenizer") && is_gpt2_preset(o.model.preset)) return TokenizerKind::Gpt2;
    return o.data.tokenizer;
}

namespace {

// The shape the flags ask for, when no weights are named (their shape would come first): its
// dimensions and --seq-len within its block size, before anything is read or allocated.
void validate_requested_model(const TrainOptions& o) {
    const ModelConfig c = requested_model(o, 1);
    const std::string preset =
        o.model.preset.empty() ? std::string() : " (--model " + o.model.preset + ")";
    if (c.channels % c.num_heads != 0) {
        throw InputError("--n-embd " + std::to_string(c.channels) +
                         " is not divisible by --n-head " + std::to_string(c.num_heads) + preset);
    }
    validate_config(c, "the model --model/--n-layer/--n-head/--n-embd/--block-size ask for");
    if (o.batch.seq_len > c.max_seq_len) {
        throw InputError("--seq-len " + std::to_string(o.batch.seq_len) +
                         " exceeds the block size " + std::to_string(c.max_seq_len) +
                         " of --model " + o.model.preset + " (" + block_size_meaning(c) +
                         "): give a shorter --seq-len, or a --block-size "
                         "of at least " +
                         std::to_string(o.batch.seq_len));
    }
}

// LoRA's flags, and the flags LoRA cannot go with (each refusal names both).
void validate_lora_options(const TrainOptions& o) {
    const TrainOptions::Lora& lora = o.lora;
    if (!lora.enabled()) {
        for (const char* flag : {"lora-alpha", "lora-targets", "lora-dropout", "lora-base"}) {
            if (o.was_given(flag)) {
                throw InputError(std::string("--") + flag +
                                 " needs --lora-rank R (or --lora-from DIR): without an adapter "
                                 "the whole model trains");
            }
        }
        return;
    }
    if (!(lora.alpha > 0.0f)) throw InputError("--lora-alpha must be positive");
    if (!(lora.dropout >= 0.0f && lora.dropout < 1.0f)) {
        throw InputError("--lora-dropout must be in [0, 1)");
    }
    check_lora_target_names(lora.targets, "--lora-targets");
    if (lora.bf16_base && o.compute.precision != Precision::Bf16) {
        throw InputError(
            "--lora-base bf16 needs --precision bf16: in fp32 the products read the fp32 base");
    }
    const std::string flag = lora.from.empty() ? "--lora-rank" : "--lora-from";
    const auto refuse_with = [&](bool conflict, const std::string& other, const std::string& why) {
        if (conflict) throw InputError(flag + " and " + other + ": " + why);
    };
    const std::string one_allreduce =
        "LoRA's adapter gradient (megabytes) travels in one allreduce after backward and every "
        "rank keeps the adapter's whole AdamW state";
    refuse_with(o.parallel.zero == 1, "--zero 1", one_allreduce + "; drop --zero");
    refuse_with(o.was_given("share-memory") && o.parallel.share_memory, "--share-memory auto",
                "with LoRA each rank keeps its own frozen weights and " + one_allreduce +
                    "; drop --share-memory");
    refuse_with(o.parallel.bucket_mb > 0.0, "--bucket-mb",
                one_allreduce + "; drop --bucket-mb (or give 0)");
    refuse_with(!o.lora.from.empty() && !o.checkpoints.resume.empty(), "--resume",
                "a resumed LoRA run takes its adapter from the checkpoint (model_NNNNNN.adapter "
                "beside the state file); drop --lora-from");
}

}  // namespace

void require_muon_flags_apply(const TrainOptions& o) {
    if (o.optimizer.automatic && o.optimizer.chosen_because.empty()) {
        return;  // auto, not settled yet (run_training settles it and calls this again)
    }
    for (const char* flag : {"muon-lr", "muon-momentum", "muon-weight-decay"}) {
        if (o.optimizer.kind != OptimizerKind::Muon && o.was_given(flag)) {
            throw UsageError(fmt::format(
                "--{} applies to Muon only, and this run trains with AdamW{}", flag,
                o.optimizer.automatic ? " (--optimizer auto: " + o.optimizer.chosen_because + ")"
                                      : ""));
        }
    }
}

void validate_train_options(const TrainOptions& o, int world_size) {
    const auto require = [](bool ok, const std::string& message) {
        if (!ok) throw InputError(message);
    };
    require(o.batch.batch_size > 0, "--batch-size must be positive");
    require(o.batch.seq_len > 0, "--seq-len must be positive");
    require(o.optimizer.max_steps > 0, "--max-steps must be positive");
    require(o.batch.grad_accum >= 0, "--grad-accum must not be negative");
    require(o.batch.total_batch_tokens >= 0, "--total-batch-tokens must not be negative");
    require(o.parallel.threads >= 0, "--threads must not be negative");
    require(o.parallel.threads == 0 || o.parallel.threads <= o.batch.batch_size,
            "--threads " + std::to_string(o.parallel.threads) + " exceeds --batch-size " +
                std::to_string(o.batch.batch_size) + ": every worker needs at least one sequence");
    require(o.model.num_layers > 0 && o.model.num_heads > 0 && o.model.channels > 0,
            "--n-layer, --n-head and --n-embd must be positive");
    require(o.model.block_size == 0 || o.model.block_size >= o.batch.seq_len,
            "--block-size must be at least --seq-len");
    require(o.optimizer.lr > 0.0f, "--lr must be positive");
    require(o.optimizer.min_lr >= 0.0f && o.optimizer.min_lr <= o.optimizer.lr,
            fmt::format("--min-lr {} is above --lr {}: the schedule decays from --lr down to "
                        "--min-lr (default --lr / 10)",
                        o.optimizer.min_lr, o.optimizer.lr));
    require(o.optimizer.warmup_steps >= 0, "--warmup-steps must not be negative");
    require(o.optimizer.lr_decay_steps >= 0, "--lr-decay-steps must not be negative");
    require(o.optimizer.beta1 >= 0.0f && o.optimizer.beta1 < 1.0f, "--beta1 must be in [0, 1)");
    require(o.optimizer.dropout >= 0.0f && o.optimizer.dropout < 1.0f,
            "--dropout must be in [0, 1)");
    require(o.optimizer.beta2 >= 0.0f && o.optimizer.beta2 < 1.0f, "--beta2 must be in [0, 1)");
    require(o.optimizer.eps > 0.0f, "--eps must be positive");
    require(o.optimizer.weight_decay >= 0.0f, "--weight-decay must not be negative");
    require(o.optimizer.grad_clip >= 0.0f, "--grad-clip must not be negative");
    require(o.optimizer.muon_lr > 0.0f, "--muon-lr must be positive");
    require(o.optimizer.muon_momentum >= 0.0f && o.optimizer.muon_momentum < 1.0f,
            "--muon-momentum must be in [0, 1)");
    require(o.optimizer.muon_weight_decay >= 0.0f, "--muon-weight-decay must not be negative");
    require_muon_flags_apply(o);
    require(o.optimizer.automatic || o.optimizer.kind != OptimizerKind::Muon || !o.lora.enabled(),
            "--optimizer muon trains whole hidden matrices; LoRA trains adapters (AdamW): drop "
            "--optimizer muon or --lora-rank");
    require(o.parallel.zero == 0 || o.parallel.zero == 1, "--zero must be 0 or 1");
    require(o.test.simulate_machines == 0 || world_size % o.test.simulate_machines == 0,
            "--simulate-machines must divide the number of ranks");
    require(o.data.val_fraction > 0.0 && o.data.val_fraction < 1.0,
            "--val-fraction must be in (0, 1)");
    require(o.eval.val_every >= 0, "--val-every must not be negative");
    require(o.eval.val_tokens >= o.batch.seq_len,
            "--val-tokens " + std::to_string(o.eval.val_tokens) + " is less than --seq-len " +
                std::to_string(o.batch.seq_len) +
                ": validation needs at least one window of --seq-len "
                "tokens");
    require(o.eval.sample_every >= 0 && o.eval.sample_tokens >= 0,
            "--sample-every/--max-new-tokens must not be negative");
    require(o.checkpoints.checkpoint_every >= 0, "--checkpoint-every must not be negative");
    require(o.checkpoints.checkpoint_minutes >= 0.0, "--checkpoint-minutes must not be negative");
    require(o.checkpoints.keep_checkpoints >= 0, "--keep-checkpoints must not be negative");
    require(o.safety.max_bad_steps > 0, "--max-bad-steps must be positive");
    require(o.safety.check_replicas >= 0, "--check-replicas must not be negative");
    require(o.compute.benchmark >= 0, "--benchmark must not be negative");
    require(o.compute.peak_gflops >= 0.0, "--peak-gflops must be >= 0 (0: measured at start-up)");
    require(o.data.vocab_size >= 257 || o.data.tokenizer != TokenizerKind::Bpe,
            "--vocab-size must be at least 257 for --tokenizer bpe (256 bytes + end-of-text)");
    require(o.data.train_data.empty() == o.data.val_data.empty(),
            "--train-data and --val-data go together");
    require(o.batch.grad_accum == 0 || o.batch.total_batch_tokens == 0,
            "--grad-accum and --total-batch-tokens both set: give one");
    require(!o.was_given("data") || o.data.train_data.empty(),
            "--data and --train-data both name the training text: give one (--data: a text file "
            "tokenized at start-up; --train-data: prepare_data's shards)");
    require(!o.was_given("val-fraction") || o.data.train_data.empty(),
            "--val-fraction splits --data; with --train-data the validation tokens are "
            "--val-data's: drop --val-fraction");
    if (!o.checkpoints.resume.empty() && o.checkpoints.resume != "auto") {
        const std::filesystem::path named = o.checkpoints.resume;
        const std::optional<std::int64_t> step = checkpoint_step(named);
        require(step.has_value(), "--resume " + o.checkpoints.resume +
                                      ": expected 'auto' or a state_NNNNNN.bin file");
        require(named.filename().string().starts_with("state_"),
                "--resume " + o.checkpoints.resume + " is a model file: name its state file, " +
                    state_path(named.parent_path(), *step).string() +
                    " (--init-from starts a new run from a model file's weights)");
    }
    if (is_gpt2_preset(o.model.preset) && o.was_given("tokenizer") &&
        o.data.tokenizer != TokenizerKind::Gpt2) {
        throw InputError("--tokenizer " + std::string(tokenizer_kind_name(o.data.tokenizer)) +
                         " contradicts --model " + o.model.preset +
                         ": GPT-2's shapes are for GPT-2's tokenizer (vocabulary 50257; the "
                         "preset implies --tokenizer gpt2); drop --tokenizer, or give the shape "
                         "with --n-layer/--n-head/--n-embd");
    }
    if (o.model.init_from.empty() && o.checkpoints.resume.empty()) validate_requested_model(o);
    // (A LoRA run resumes on its base: --init-from names that, not the weights to start from.)
    require(o.model.init_from.empty() || o.checkpoints.resume.empty() ||
                o.checkpoints.resume == "auto" || o.lora.enabled(),
            "--init-from and --resume FILE both name the weights to start from: give one "
            "(--resume auto --init-from X resumes if --out-dir holds a checkpoint, else starts "
            "from X)");
    validate_lora_options(o);
    require(!o.eval.eval_only || o.compute.benchmark == 0,
            "--eval-only and --benchmark both say what the run does: give one");
    if (o.batch.total_batch_tokens > 0) {
        const std::int64_t per_micro =
            static_cast<std::int64_t>(o.batch.batch_size) * o.batch.seq_len * world_size;
        require(o.batch.total_batch_tokens % per_micro == 0,
                "--total-batch-tokens " + std::to_string(o.batch.total_batch_tokens) +
                    " is not a multiple of batch-size x seq-len x ranks = " +
                    std::to_string(per_micro));
    }
}

}  // namespace gpt2
