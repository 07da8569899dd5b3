#include "gpt2/train_options.hpp"

#include <CLI/CLI.hpp>

#include <iostream>
#include <map>
#include <memory>

#include "gpt2/error.hpp"

namespace gpt2 {

namespace {
// CLI11 2.1.2 dereferences the first value of an empty array (`n-layer = []`) while applying a
// config file; refuse such items before CLI11 sees them.
class StrictTomlConfig : public CLI::ConfigTOML {
  public:
    std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
        std::vector<CLI::ConfigItem> items = CLI::ConfigTOML::from_config(input);
        for (const CLI::ConfigItem& item : items) {
            const bool section_marker = item.name == "++" || item.name == "--";
            if (!section_marker && item.inputs.empty()) {
                throw CLI::ConversionError("--config: '" + item.name + "' has no value");
            }
        }
        return items;
    }
};
}  // namespace

std::variant<TrainOptions, int> parse_train_options(int argc, char** argv, bool speaker) {
    TrainOptions o;
    CLI::App app{"gpt2-mpi: train a GPT-2 on CPUs (run under mpirun -np N for several ranks)",
                 "train_gpt2"};
    app.set_config("--config", "", "read flags from a TOML/INI file (flag = value per line)");
    app.config_formatter(std::make_shared<StrictTomlConfig>());
    // A flag given twice (or in --config and on the command line): the last one wins.
    app.option_defaults()->always_capture_default()->multi_option_policy(
        CLI::MultiOptionPolicy::TakeLast);

    auto* model = app.add_option_group("Model");
    model->add_option("--model", o.model,
                      "preset: gpt2-124M, gpt2-350M, gpt2-774M, gpt2-1558M, d6, char-small");
    model->add_option("--n-layer", o.n_layer, "transformer blocks (L)");
    model->add_option("--n-head", o.n_head, "attention heads (NH)");
    model->add_option("--n-embd", o.n_embd, "channels (C)");
    model->add_option("--block-size", o.block_size,
                      "max context (position embeddings); 0: --seq-len");
    model->add_option("--init-from", o.init_from,
                      "start from an llm.c model file or our checkpoint");

    auto* data = app.add_option_group("Data");
    data->add_option("--data", o.data, "plain-text corpus (read and tokenized by rank 0)");
    data->add_option("--train-data", o.train_data, "llm.c token shards (glob), instead of --data");
    data->add_option("--val-data", o.val_data, "llm.c validation shards (glob)");
    data->add_option("--tokenizer", o.tokenizer, "char | bpe | gpt2")
        ->check(CLI::IsMember({"char", "bpe", "gpt2"}));
    data->add_option("--vocab-size", o.vocab_size,
                     "vocabulary of the trained BPE (--tokenizer bpe)");
    data->add_option("--tokenizer-dir", o.tokenizer_dir,
                     "directory with encoder.json and vocab.bpe");
    data->add_option("--val-fraction", o.val_fraction,
                     "last fraction of --data used for validation");
    data->add_flag("--no-shuffle", o.no_shuffle, "visit windows in file order (as llm.c does)");

    auto* batch = app.add_option_group("Batch");
    batch->add_option("--batch-size,-b", o.batch_size, "sequences per rank per micro-step (B)");
    batch->add_option("--seq-len,-t", o.seq_len, "tokens per sequence (T)");
    batch->add_option("--grad-accum", o.grad_accum, "micro-steps per optimizer step (0: derive)");
    batch->add_option("--total-batch-tokens", o.total_batch_tokens,
                      "tokens per optimizer step over all ranks; derives --grad-accum");

    const std::map<std::string, LrSchedule> schedules = {{"cosine", LrSchedule::Cosine},
                                                         {"linear", LrSchedule::Linear},
                                                         {"constant", LrSchedule::Constant}};
    auto* opt = app.add_option_group("Optimizer");
    opt->add_option("--lr", o.lr, "peak learning rate");
    opt->add_option("--min-lr", o.min_lr, "final learning rate of the decay");
    opt->add_option("--warmup-steps", o.warmup_steps, "linear warmup steps");
    opt->add_option("--schedule", o.schedule, "cosine | linear | constant")
        ->transform(CLI::CheckedTransformer(schedules, CLI::ignore_case));
    opt->add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay (2-D weights)");
    opt->add_option("--beta1", o.beta1, "AdamW beta1");
    opt->add_option("--beta2", o.beta2, "AdamW beta2");
    opt->add_option("--eps", o.eps, "AdamW epsilon");
    opt->add_option("--grad-clip", o.grad_clip, "max global gradient norm (0: off)");
    opt->add_option("--max-steps", o.max_steps, "optimizer steps to train");

    auto* run = app.add_option_group("Run");
    run->add_option("--val-every", o.val_every, "validate every N steps (0: only at the end)");
    run->add_option("--val-batches", o.val_batches, "validation micro-batches per evaluation");
    run->add_option("--sample-every", o.sample_every, "print a sample every N steps (0: never)");
    run->add_option("--sample-tokens", o.sample_tokens, "tokens per sample");
    run->add_option("--checkpoint-every", o.checkpoint_every,
                    "checkpoint every N steps (0: only at the end)");
    run->add_option("--keep-checkpoints", o.keep_checkpoints,
                    "checkpoints kept in --out-dir (0: all)");
    run->add_option("--out-dir", o.out_dir, "where checkpoints go");
    run->add_option("--resume", o.resume,
                    "'auto' (newest checkpoint in --out-dir) or a state file");
    run->add_option("--max-bad-steps", o.max_bad_steps,
                    "stop after this many non-finite steps in a row");
    run->add_option("--check-replicas", o.check_replicas,
                    "compare parameter checksums across ranks every K steps");
    run->add_option("--seed", o.seed, "seed for initialisation, data order and samples");
    run->add_option("--threads", o.threads,
                    "worker threads per rank (0: CPUs in the affinity mask)");
    run->add_flag("--pin-threads", o.pin_threads, "bind each worker thread to one CPU");
    run->add_option("--log-level", o.log_level, "trace | debug | info | warn | error")
        ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
    run->add_option("--metrics-file", o.metrics_file, "append one JSON object per step/eval");
    run->add_option("--peak-gflops", o.peak_gflops,
                    "one core's peak GFLOP/s for MFU (0: documented default)");
    run->add_option("--benchmark", o.benchmark, "time N steps after warm-up, print figures, exit");
    run->add_option("--inject-nan-step", o.inject_nan_step,
                    "testing: poison the gradient at this step")
        ->group("");
    run->add_option("--stop-at-step", o.stop_at_step,
                    "testing: act as if SIGTERM came at this step")
        ->group("");

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int code = speaker ? app.exit(e) : e.get_exit_code();
        return code == 0 ? 0 : 2;
    }
    return o;
}

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
    require(o.model.empty() ? (o.n_layer > 0 && o.n_head > 0 && o.n_embd > 0) : true,
            "--n-layer, --n-head and --n-embd must be positive");
    require(!o.model.empty() || o.n_embd % o.n_head == 0, "--n-embd must be divisible by --n-head");
    require(o.block_size == 0 || o.block_size >= o.seq_len,
            "--block-size must be at least --seq-len");
    require(o.lr > 0.0f, "--lr must be positive");
    require(o.min_lr >= 0.0f && o.min_lr <= o.lr, "--min-lr must be between 0 and --lr");
    require(o.warmup_steps >= 0, "--warmup-steps must not be negative");
    require(o.beta1 >= 0.0f && o.beta1 < 1.0f, "--beta1 must be in [0, 1)");
    require(o.beta2 >= 0.0f && o.beta2 < 1.0f, "--beta2 must be in [0, 1)");
    require(o.eps > 0.0f, "--eps must be positive");
    require(o.weight_decay >= 0.0f, "--weight-decay must not be negative");
    require(o.grad_clip >= 0.0f, "--grad-clip must not be negative");
    require(o.val_fraction > 0.0 && o.val_fraction < 1.0, "--val-fraction must be in (0, 1)");
    require(o.val_every >= 0 && o.val_batches > 0, "--val-every/--val-batches must be positive");
    require(o.sample_every >= 0 && o.sample_tokens >= 0,
            "--sample-every/--sample-tokens must not be negative");
    require(o.checkpoint_every >= 0, "--checkpoint-every must not be negative");
    require(o.keep_checkpoints >= 0, "--keep-checkpoints must not be negative");
    require(o.max_bad_steps > 0, "--max-bad-steps must be positive");
    require(o.check_replicas >= 0, "--check-replicas must not be negative");
    require(o.benchmark >= 0, "--benchmark must not be negative");
    require(o.vocab_size >= 257 || o.tokenizer != "bpe",
            "--vocab-size must be at least 257 for --tokenizer bpe (256 bytes + end-of-text)");
    require(o.train_data.empty() == o.val_data.empty(), "--train-data and --val-data go together");
    require(o.grad_accum == 0 || o.total_batch_tokens == 0,
            "--grad-accum and --total-batch-tokens both set: give one");
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
