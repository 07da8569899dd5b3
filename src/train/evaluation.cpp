// What the training run measures between steps: the validation loss, HellaSwag's accuracy, and a
// text sample from the model.
#include <spdlog/spdlog.h>

#include <array>
#include <nlohmann/json.hpp>

#include "core/clock.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"
#include "core/utf8.hpp"
#include "model/generate.hpp"
#include "parallel/validation_loss.hpp"
#include "tokenizer/tokenizer.hpp"
#include "train/multiple_choice_eval.hpp"
#include "train/text_format.hpp"
#include "train/training_loop.hpp"

namespace gpt2 {

std::vector<MultipleChoiceExample> load_hellaswag(const TrainOptions& o, const Communicator& comm,
                                                  int vocab_size) {
    if (o.eval.hellaswag.empty()) return {};
    std::vector<std::uint8_t> bytes;
    if (comm.is_root()) bytes = read_file_bytes(o.eval.hellaswag);
    comm.broadcast_vector(bytes);
    std::vector<MultipleChoiceExample> examples = parse_multiple_choice(bytes, o.eval.hellaswag);
    if (const std::int32_t top = max_token(examples); top >= vocab_size) {
        throw InputError("--hellaswag " + o.eval.hellaswag + ": token " + std::to_string(top) +
                         " is outside the model's vocabulary of " + std::to_string(vocab_size) +
                         " (the file was made with another tokenizer; llm.c's is for GPT-2's)");
    }
    if (comm.is_root()) {
        spdlog::info("hellaswag: {} from {}, {}",
                     counted(static_cast<double>(examples.size()), "example"), o.eval.hellaswag,
                     o.eval.eval_every > 1   ? fmt::format("every {} steps", o.eval.eval_every)
                     : o.eval.eval_every > 0 ? std::string("every step")
                                             : std::string("with each validation"));
    }
    return examples;
}

void TrainingLoop::validate(std::int64_t completed) {
    if (val_windows_ == 0) return;  // said once at the start
    const auto t0 = Clock::now();
    const TokenStore& store = corpus_.val_store;
    const int T = T_;
    const ValidationLoss val = validation_loss(
        replica_.model, replica_.workers, comm_, val_windows_,
        [&store, T](std::uint64_t window, std::span<std::int32_t> inputs,
                    std::span<std::int32_t> targets) {
            store.copy_window(window, T, inputs, targets);
        },
        corpus_.document_start, token_bytes_);
    if (val.tokens == 0) {
        spdlog::warn(
            "{} | val loss: none, the loss mask trains no target in the {} validation windows",
            progress(completed), val_windows_);
        return;
    }
    spdlog::info("{} | val loss {:.4f} ({} {}tokens){} | {:.0f} ms", progress(completed), val.loss,
                 with_commas(static_cast<double>(val.tokens)), store.masked() ? "trained " : "",
                 val.bits_per_byte ? fmt::format(" | {:.4f} bits per byte", *val.bits_per_byte)
                                   : std::string(),
                 seconds_since(t0) * 1e3);
    nlohmann::json record = {
        {"type", "val"}, {"step", completed}, {"val_loss", val.loss}, {"val_tokens", val.tokens}};
    if (val.bits_per_byte) {
        record["val_bpb"] = *val.bits_per_byte;
        record["val_bytes"] = val.bytes;
    }
    metrics_.write(record);
}

std::string TrainingLoop::progress(std::int64_t completed) const {
    if (o_.eval.eval_only) return "eval of " + eval_source_;
    return fmt::format("step {}/{}", completed, o_.optimizer.max_steps);
}

void TrainingLoop::evaluate_hellaswag(std::int64_t completed) {
    if (hellaswag_.empty()) return;
    const auto t0 = Clock::now();
    const MultipleChoiceScore score =
        evaluate_multiple_choice(replica_.model, replica_.workers, comm_, hellaswag_);
    spdlog::info("{} | hellaswag acc_norm {:.4f} ({}/{}{}) | {:.0f} ms", progress(completed),
                 score.accuracy(), score.correct, score.scored,
                 score.too_long > 0
                     ? fmt::format(", {} longer than --seq-len {} left out", score.too_long, T_)
                     : std::string(),
                 seconds_since(t0) * 1e3);
    metrics_.write({{"type", "eval"},
                    {"step", completed},
                    {"hellaswag_acc_norm", score.accuracy()},
                    {"hellaswag_correct", score.correct},
                    {"hellaswag_scored", score.scored}});
}

void TrainingLoop::sample(std::int64_t completed) {
    if (!comm_.is_root() || o_.eval.sample_tokens == 0) return;
    std::vector<std::int32_t> tokens;
    if (const auto eot = corpus_.tokenizer->eot_id()) {
        tokens.push_back(*eot);
    } else {
        // No end-of-text token to start from: the first token of the validation data (of the
        // training data when validation has none).
        const TokenStore& store =
            corpus_.val_store.num_windows(1) > 0 ? corpus_.val_store : corpus_.train_store;
        std::array<std::int32_t, 1> input{}, target{};
        store.copy_window(0, 1, input, target);
        tokens.push_back(input[0]);
    }
    const std::size_t prompt = tokens.size();
    generate_recompute(replica_.model, tokens, o_.eval.sample_tokens, SamplingParams{},
                       plan_.sample_rng);
    const std::string text =
        corpus_.tokenizer->decode(std::span<const std::int32_t>(tokens).subspan(prompt));
    // Token bytes may split or break characters; the log only ever holds valid UTF-8.
    spdlog::info("sample at step {}:\n{}\n---", completed, sanitize_utf8(text));
}

}  // namespace gpt2
