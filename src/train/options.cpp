#include "train/options.hpp"

#include "core/error.hpp"
#include "formats/resume_state.hpp"

namespace gpt2 {

ModelConfig requested_model(const TrainOptions& o, int vocab_size) {
    if (o.model.empty()) {
        const int maxT = o.block_size > 0 ? o.block_size : o.seq_len;
        return ModelConfig{maxT, vocab_size, pad_vocab(vocab_size), o.n_layer, o.n_head, o.n_embd};
    }
    ModelConfig c = preset_config(o.model, vocab_size);
    if (o.was_given("n-layer")) c.num_layers = o.n_layer;
    if (o.was_given("n-head")) c.num_heads = o.n_head;
    if (o.was_given("n-embd")) c.channels = o.n_embd;
    if (o.block_size > 0) c.max_seq_len = o.block_size;
    return c;
}

std::string requested_tokenizer(const TrainOptions& o) {
    if (!o.was_given("tokenizer") && is_gpt2_preset(o.model)) return "gpt2";
    return o.tokenizer;
}

namespace {

// The shape the flags ask for, when no weights are named (their shape would come first): its
// dimensions and --seq-len within its block size, before anything is read or allocated.
void validate_requested_model(const TrainOptions& o) {
    const ModelConfig c = requested_model(o, 1);
    const std::string preset = o.model.empty() ? std::string() : " (--model " + o.model + ")";
    if (c.channels % c.num_heads != 0) {
        throw InputError("--n-embd " + std::to_string(c.channels) +
                         " is not divisible by --n-head " + std::to_string(c.num_heads) + preset);
    }
    validate_config(c, "the model --model/--n-layer/--n-head/--n-embd/--block-size ask for");
    if (o.seq_len > c.max_seq_len) {
        throw InputError("--seq-len " + std::to_string(o.seq_len) + " exceeds the block size " +
                         std::to_string(c.max_seq_len) + " of --model " + o.model +
                         " (its position embeddings): give a shorter --seq-len, or a --block-size "
                         "of at least " +
                         std::to_string(o.seq_len));
    }
}

}  // namespace

void validate_train_options(const TrainOptions& o, int world_size) {
    const auto require = [](bool ok, const std::string& message) {
        if (!ok) throw InputError(message);
    };
    require(o.batch_size > 0, "--batch-size must be positive");
    require(o.seq_len > 0, "--seq-len must be positive");
    require(o.max_steps > 0, "--max-steps must be positive");
    require(o.grad_accum >= 0, "--grad-accum must not be negative");
    require(o.total_batch_tokens >= 0, "--total-batch-tokens must not be negative");
    require(o.threads >= 0, "--threads must not be negative");
    require(o.threads == 0 || o.threads <= o.batch_size,
            "--threads " + std::to_string(o.threads) + " exceeds --batch-size " +
                std::to_string(o.batch_size) + ": every worker needs at least one sequence");
    require(o.n_layer > 0 && o.n_head > 0 && o.n_embd > 0,
            "--n-layer, --n-head and --n-embd must be positive");
    require(o.block_size == 0 || o.block_size >= o.seq_len,
            "--block-size must be at least --seq-len");
    require(o.lr > 0.0f, "--lr must be positive");
    require(o.min_lr >= 0.0f && o.min_lr <= o.lr, "--min-lr must be between 0 and --lr");
    require(o.warmup_steps >= 0, "--warmup-steps must not be negative");
    require(o.lr_decay_steps >= 0, "--lr-decay-steps must not be negative");
    require(o.beta1 >= 0.0f && o.beta1 < 1.0f, "--beta1 must be in [0, 1)");
    require(o.dropout >= 0.0f && o.dropout < 1.0f, "--dropout must be in [0, 1)");
    require(o.beta2 >= 0.0f && o.beta2 < 1.0f, "--beta2 must be in [0, 1)");
    require(o.eps > 0.0f, "--eps must be positive");
    require(o.weight_decay >= 0.0f, "--weight-decay must not be negative");
    require(o.grad_clip >= 0.0f, "--grad-clip must not be negative");
    require(o.zero == 0 || o.zero == 1, "--zero must be 0 or 1");
    require(o.simulate_machines == 0 || world_size % o.simulate_machines == 0,
            "--simulate-machines must divide the number of ranks");
    require(o.val_fraction > 0.0 && o.val_fraction < 1.0, "--val-fraction must be in (0, 1)");
    require(o.val_every >= 0, "--val-every must not be negative");
    require(o.val_tokens >= o.seq_len, "--val-tokens " + std::to_string(o.val_tokens) +
                                           " is less than --seq-len " + std::to_string(o.seq_len) +
                                           ": validation needs at least one window of --seq-len "
                                           "tokens");
    require(o.sample_every >= 0 && o.sample_tokens >= 0,
            "--sample-every/--max-new-tokens must not be negative");
    require(o.checkpoint_every >= 0, "--checkpoint-every must not be negative");
    require(o.checkpoint_minutes >= 0.0, "--checkpoint-minutes must not be negative");
    require(o.keep_checkpoints >= 0, "--keep-checkpoints must not be negative");
    require(o.max_bad_steps > 0, "--max-bad-steps must be positive");
    require(o.check_replicas >= 0, "--check-replicas must not be negative");
    require(o.benchmark >= 0, "--benchmark must not be negative");
    require(o.peak_gflops >= 0.0, "--peak-gflops must be >= 0 (0: measured at start-up)");
    require(o.vocab_size >= 257 || o.tokenizer != "bpe",
            "--vocab-size must be at least 257 for --tokenizer bpe (256 bytes + end-of-text)");
    require(o.train_data.empty() == o.val_data.empty(), "--train-data and --val-data go together");
    require(o.grad_accum == 0 || o.total_batch_tokens == 0,
            "--grad-accum and --total-batch-tokens both set: give one");
    require(!o.was_given("data") || o.train_data.empty(),
            "--data and --train-data both name the training text: give one (--data: a text file "
            "tokenized at start-up; --train-data: prepare_data's shards)");
    require(!o.was_given("val-fraction") || o.train_data.empty(),
            "--val-fraction splits --data; with --train-data the validation tokens are "
            "--val-data's: drop --val-fraction");
    require(o.resume.empty() || o.resume == "auto" || checkpoint_step(o.resume).has_value(),
            "--resume " + o.resume + ": expected 'auto' or a state_NNNNNN.bin file");
    if (is_gpt2_preset(o.model) && o.was_given("tokenizer") && o.tokenizer != "gpt2") {
        throw InputError("--tokenizer " + o.tokenizer + " contradicts --model " + o.model +
                         ": GPT-2's shapes are for GPT-2's tokenizer (vocabulary 50257; the "
                         "preset implies --tokenizer gpt2); drop --tokenizer, or give the shape "
                         "with --n-layer/--n-head/--n-embd");
    }
    if (o.init_from.empty() && o.resume.empty()) validate_requested_model(o);
    require(o.init_from.empty() || o.resume.empty() || o.resume == "auto",
            "--init-from and --resume FILE both name the weights to start from: give one "
            "(--resume auto --init-from X resumes if --out-dir holds a checkpoint, else starts "
            "from X)");
    if (o.total_batch_tokens > 0) {
        const std::int64_t per_micro =
            static_cast<std::int64_t>(o.batch_size) * o.seq_len * world_size;
        require(o.total_batch_tokens % per_micro == 0,
                "--total-batch-tokens " + std::to_string(o.total_batch_tokens) +
                    " is not a multiple of batch-size x seq-len x ranks = " +
                    std::to_string(per_micro));
    }
}

}  // namespace gpt2
