// The training run's checkpoints: the weights (under LoRA the merged weights and the PEFT adapter
// beside them), the resume state, then the pruning of older ones.
#include <spdlog/spdlog.h>

#include <filesystem>

#include "core/clock.hpp"
#include "formats/checkpoint.hpp"
#include "formats/peft.hpp"
#include "formats/resume_state.hpp"
#include "model/lora.hpp"
#include "tokenizer/tokenizer.hpp"
#include "train/training_loop.hpp"

namespace gpt2 {

void TrainingLoop::save(std::int64_t completed) {
    std::unique_ptr<OptimizerState> gathered;
    const OptimizerState& optimizer = full_optimizer(replica_, comm_, gathered);
    if (!comm_.is_root()) return;
    const auto t0 = Clock::now();
    const std::filesystem::path out_dir = o_.checkpoints.out_dir;
    const CheckpointExtras extras{corpus_.tokenizer->serialize(), run_config_};
    std::filesystem::path path;
    if (const std::shared_ptr<LoraAdapter>& adapter = replica_.model.lora) {
        // LoRA: the adapter as PEFT saves it, and beside it the merged weights, which every
        // reader of a checkpoint takes as they are (no adapter needed). They are merged one
        // matrix at a time as they are written: a merged copy of the model would double the
        // frozen weights' memory on rank 0 (5.8 GiB more for GPT-2 1558M).
        write_peft_adapter(
            adapter_path(out_dir, completed), *adapter,
            o_.model.init_from.empty() ? std::string("gpt2-mpi random base") : o_.model.init_from);
        path = save_checkpoint(
            model_path(out_dir, completed), replica_.model.config,
            [&](const ParameterSink& sink) { merged_lora_pieces(replica_.model, *adapter, sink); },
            extras);
    } else {
        path = save_checkpoint(model_path(out_dir, completed), replica_.model, extras);
    }
    ResumeState state;
    state.step = completed;
    state.seed = o_.seed;
    state.sequences_per_step = plan_.global_sequences;
    state.seq_len = T_;
    state.sample_rng = plan_.sample_rng.state();
    state.run_id = plan_.run_id;
    state.lr_decay_steps = plan_.decay_steps;
    state.loss_window = plan_.spikes.loss;
    state.norm_window = plan_.spikes.norm;
    state.optimizer = replica_.optimizer->kind();
    if (const std::shared_ptr<LoraAdapter>& adapter = replica_.model.lora) {
        // What a resume must give again: the same adapter on the same base.
        state.lora = LoraRecord{adapter->config, !o_.model.init_from.empty(),
                                replica_.base_fingerprint, lora_modules(replica_.model.config)};
    }
    save_resume_state(state_path(out_dir, completed), state, replica_.model.config, optimizer);
    last_checkpoint_ = path;
    checkpoint_clock_.saved();
    prune_checkpoints(out_dir, o_.checkpoints.keep_checkpoints, plan_.run_id, completed);
    metrics_.sync();
    spdlog::info("checkpoint {}{} ({:.2f} s)", path.string(),
                 replica_.model.lora != nullptr
                     ? fmt::format(" (merged weights) and LoRA adapter {}",
                                   adapter_path(out_dir, completed).string())
                     : std::string(),
                 seconds_since(t0));
}

}  // namespace gpt2
