// What a training run is asked to do: every setting of train_gpt2 with its default (the command
// line that fills it lives in apps/train_gpt2), and the checks that refuse impossible
// combinations up front (one message naming the flag).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "model/model.hpp"
#include "optim/optimizer.hpp"
#include "optim/schedule.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {

// The groups follow train_gpt2 --help's option groups.
struct TrainOptions {
    // Model shape (a preset or explicit dimensions), or weights to start from.
    struct Model {
        std::string preset;  // --model; empty: the dimensions below
        int num_layers = 4;  // --n-layer
        int num_heads = 4;   // --n-head
        int channels = 128;  // --n-embd
        int block_size = 0;  // maxT; 0: the preset's, else the sequence length
        std::string arch;    // --arch: the block's fields over the preset's (or GPT-2's)
        std::string init_from;
    } model;

    // Data and tokenizer.
    struct Data {
        std::string data = "data/tinyshakespeare.txt";
        std::string train_data;  // llm.c shard glob (instead of --data)
        std::string val_data;
        TokenizerKind tokenizer = TokenizerKind::Char;
        int vocab_size = 4096;  // for --tokenizer bpe
        std::string tokenizer_dir = "data/gpt2";
        std::string eot_in_text = "token";  // a literal <|endoftext|> in --data: token | text
        double val_fraction = 0.1;
        bool no_shuffle = false;
        // Document masking in attention: a token attends only to the tokens of its own document
        // (a document begins at each end-of-text token); false: to every earlier token of the
        // window, as GPT-2 trained.
        bool attention_within_documents = false;
    } data;

    // Batch.
    struct Batch {
        int batch_size = 64;  // per rank, per micro-step
        int seq_len = 64;
        int grad_accum = 0;                   // 0: derived from total_batch_tokens, else 1
        std::int64_t total_batch_tokens = 0;  // 0: B * T * ranks * grad_accum
    } batch;

    // The optimizer, its schedule and the run's length.
    struct Optimizer {
        // --optimizer: AdamW for everything, or Muon for the hidden matrices (AdamW for the rest,
        // with --lr and the AdamW flags). `automatic` (--optimizer auto, the default): Muon for
        // a run from scratch where it pays (run.cpp), AdamW for fine-tuning (--init-from, LoRA),
        // the state's own when resuming; run_training settles `kind` before the replica is built.
        OptimizerKind kind = OptimizerKind::AdamW;
        bool automatic = false;
        std::string chosen_because;  // auto, once settled: why `kind` (for the log)
        float muon_lr = 0.02f;       // Muon's peak learning rate; the schedule scales it as --lr
        float muon_momentum = 0.95f;
        float muon_weight_decay = 0.0f;
        float lr = 3e-3f;
        // The decay's final learning rate: --min-lr as given, else lr / 10 (nanoGPT's advice), so
        // that any --lr has a schedule (parse_train_options fills it in).
        float min_lr = 3e-4f;
        int warmup_steps = 30;
        LrSchedule schedule = LrSchedule::Cosine;
        // Steps the schedule decays over; 0: --max-steps of the run's first start. Stored in the
        // checkpoint, so resuming with a larger --max-steps keeps the learning rate where it was.
        int lr_decay_steps = 0;
        float weight_decay = 0.1f;
        float beta1 = 0.9f;
        float beta2 = 0.95f;
        float eps = 1e-8f;
        float grad_clip = 1.0f;
        // Dropout rate where GPT-2 applies it (model/forward_backward.hpp's Dropout); 0: none.
        float dropout = 0.0f;
        int max_steps = 600;
    } optimizer;

    // Validation, HellaSwag and samples.
    struct Evaluation {
        int val_every = 100;
        // The validation set: the first this many tokens of the validation data, in whole windows
        // of seq_len (the same set, and the same loss, on any launch). 32,768: the cost of the
        // default run's validation before it was fixed (8 micro-batches of 64 x 64).
        std::int64_t val_tokens = 32768;
        // llm.c's HellaSwag file (hellaswag_val.bin) for acc_norm, every eval_every steps (0: with
        // each validation).
        std::string hellaswag;
        int eval_every = 0;
        // Evaluate the weights (validation loss and bits per byte, HellaSwag with --hellaswag)
        // and exit: no step, no checkpoint.
        bool eval_only = false;
        int sample_every = 200;
        int sample_tokens = 200;
    } eval;

    // Checkpoints and resume.
    struct Checkpoints {
        int checkpoint_every = 200;
        // Also checkpoint when this many minutes have passed since the start or the last
        // checkpoint (rank 0's clock, decided for every rank at the same step); 0: off.
        double checkpoint_minutes = 30.0;
        int keep_checkpoints = 3;
        std::string out_dir = "out";
        std::string resume;  // "", "auto" or a path
    } checkpoints;

    // Steps that go wrong: non-finite or spiking ones skipped, replicas compared.
    struct Safety {
        int max_bad_steps = 5;
        // Skip the update when the loss's (gradient norm's) z-score against the last 128 steps
        // exceeds this (0: never), as llm.c's -sl / -sg.
        double skip_loss_z = 0.0;
        double skip_norm_z = 0.0;
        int check_replicas = 0;
    } safety;

    // Worker threads and ranks: how a step is divided and how the gradient travels.
    struct Parallel {
        int threads = 0;  // worker threads per rank; 0: one per core in the affinity mask
        bool pin_threads = false;
        // MiB of gradient (with shared memory across machines: of each rank's slice) per
        // allreduce bucket, sent while backward runs (0: one allreduce, or ZeRO-1's
        // reduce-scatter, after it); negative: auto, 25 when the ranks span several machines and
        // no --zero (on one machine the copies compete with the workers for the same cores,
        // measured slower), else 0.
        double bucket_mb = -1.0;
        // Ranks on one machine share one copy of the weights and sum the gradient in shared memory
        // (no --zero; on one machine, no buckets); false: off.
        bool share_memory = true;
        // ZeRO stage: 0, or 1 (each rank keeps and updates only its slice of the AdamW moments).
        int zero = 0;
    } parallel;

    // Precision, memory and speed.
    struct Compute {
        Precision precision = Precision::Fp32;  // of the matrix products
        // What backward recomputes instead of storing (model.hpp); empty: auto, the least that
        // fits in the memory available.
        std::optional<Recompute> recompute;
        double peak_gflops = 0.0;  // one core's fp32 peak, the MFU yardstick (0: measured)
        int benchmark = 0;         // >0: time this many steps after warm-up and report
    } compute;

    // LoRA fine-tuning (model/lora.hpp): the base weights frozen, a low-rank adapter trained.
    struct Lora {
        int rank = 0;                 // --lora-rank: 0 trains the whole model
        float alpha = 8.0f;           // --lora-alpha (PEFT's default)
        std::string targets = "all";  // --lora-targets: PEFT's GPT-2 module names
        std::string from;             // --lora-from: a PEFT adapter directory to continue from
        float dropout = 0.0f;         // --lora-dropout: PEFT's lora_dropout on adapter inputs
        // --lora-base bf16 (with --precision bf16): the frozen base's layer matrices kept only
        // as their bf16 copy (Model::layer_matrices_bf16_only); false: fp32 and bf16 both.
        bool bf16_base = false;
        // Whether the run trains an adapter (--lora-rank or --lora-from).
        [[nodiscard]] bool enabled() const { return rank > 0 || !from.empty(); }
    } lora;

    std::uint64_t seed = 1337;  // initialisation, data order, dropout masks and samples
    std::string log_level = "info";
    std::string metrics_file;
    // Every log_every-th step line is printed (0: auto, log_every_for); the first and last steps
    // and skipped ones always are, and every step goes to the metrics file.
    int log_every = 0;
    bool verbose = false;  // start-up: also the per-worker memory table and the rank's parts

    // The hidden flags tests drive the program with (never needed by a user).
    struct TestHooks {
        int inject_nan_step = -1;    // poison the gradient at this step
        int inject_spike_step = -1;  // scale the gradient by 10^4 at this step
        int stop_at_step = -1;       // behave as if SIGTERM arrived during this step
        // Treat the ranks as this many machines of consecutive ranks (0: as MPI sees them).
        int simulate_machines = 0;
        // Machines other than the first report that they could not share memory.
        bool inject_share_failure = false;
        // --lora-base bf16 overwrites the fp32 layer matrices with NaN instead of releasing them.
        bool poison_released_base = false;
        // The --checkpoint-minutes clock advances this many minutes per step (0: real time).
        double minutes_per_step = 0.0;
        std::int64_t mpi_chunk_elements = 0;  // elements per MPI call (0: default)
    } test;

    // How the options were given: the flags set explicitly (on the command line or in the
    // config file, by their long name without dashes, e.g. "n-layer"), and the config file.
    std::set<std::string> given;
    std::string config_file;
    [[nodiscard]] bool was_given(const std::string& flag) const { return given.count(flag) > 0; }
};

// The flags given that this run cannot use, one warning each ("--eval-every only applies with
// --hellaswag; ignored"): never silently ignored, and not refused either (a config file shared
// between runs may carry them).
[[nodiscard]] std::vector<std::string> unused_flag_warnings(const TrainOptions& options,
                                                            int world_size);

// --log-every 0's choice for a run of `steps` steps: the smallest of 1, 2, 5, 10, 20, 50, ...
// that prints at most 50 step lines (nanoGPT prints every 10th iteration, llm.c every one).
[[nodiscard]] int log_every_for(std::int64_t steps);

// Cross-flag checks independent of the data (throws InputError naming the flag): also the model
// the flags ask for (a known preset, a valid shape, --seq-len within its block size) when no
// weights are named, and --tokenizer against a GPT-2 preset.
void validate_train_options(const TrainOptions& options, int world_size);

// The model shape the flags ask for: a preset, with any explicitly given dimension overriding it,
// or the dimensions alone; its block size is --block-size, else the preset's, else --seq-len.
[[nodiscard]] ModelConfig requested_model(const TrainOptions& options, int vocab_size);

// The tokenizer kind a run uses when neither weights nor shards bring one: --tokenizer if given,
// else gpt2 for one of GPT-2's presets (--model gpt2-124M...), else the default (char).
[[nodiscard]] TokenizerKind requested_tokenizer(const TrainOptions& options);

// Muon's flags given for a run that trains with AdamW (once the optimizer is settled): InputError.
void require_muon_flags_apply(const TrainOptions& o);

// Muon's settings from the flags.
[[nodiscard]] inline MuonSettings muon_settings(const TrainOptions& o) {
    return MuonSettings{o.optimizer.muon_momentum, o.optimizer.muon_weight_decay};
}

}  // namespace gpt2
