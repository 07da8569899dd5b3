#include "train/start_point.hpp"

#include <spdlog/fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "core/error.hpp"
#include "formats/model_file.hpp"
#include "formats/model_tokenizer.hpp"
#include "formats/resume_state.hpp"
#include "model/lora.hpp"
#include "tokenizer/tokenizer.hpp"
#include "train/log_lines.hpp"

namespace gpt2 {

namespace {

// Model files in `dir` without their state file (a checkpoint whose state could not be written,
// or whose writer was stopped between the two files), newest first.
std::vector<std::filesystem::path> models_without_state(const std::filesystem::path& dir) {
    std::vector<std::pair<std::int64_t, std::filesystem::path>> lone;
    for (const std::string& name : checkpoint_file_names(dir)) {
        const std::optional<std::int64_t> step = checkpoint_step(name);
        if (!step || !name.starts_with("model_")) continue;
        if (!std::filesystem::exists(state_path(dir, *step))) lone.emplace_back(*step, dir / name);
    }
    std::sort(lone.rbegin(), lone.rend());
    std::vector<std::filesystem::path> files;
    for (auto& [step, file] : lone)
        files.push_back(std::move(file));
    return files;
}

// What a model file without its state is, and what can be done with it, for the refusals below.
std::string finished_models_advice(const std::vector<std::filesystem::path>& lone) {
    std::string listed;
    for (std::size_t i = 0; i < lone.size() && i < 3; ++i)
        listed += (i > 0 ? ", " : "") + lone[i].filename().string();
    if (lone.size() > 3) listed += ", ... (" + std::to_string(lone.size()) + " files)";
    return listed + (lone.size() == 1 ? " has" : " have") +
           " no state file: a finished model, not a run to resume (train from its weights with "
           "--init-from " +
           lone.front().string() + " and another --out-dir, or move it away)";
}

// A fresh run must not share --out-dir with another run's checkpoints: its pruning would mix
// lineages and a later --resume auto would pick whichever is newest.
void refuse_foreign_checkpoints(const TrainOptions& o) {
    const std::vector<std::string> names = checkpoint_file_names(o.checkpoints.out_dir);
    if (names.empty()) return;
    if (list_checkpoints(o.checkpoints.out_dir).empty()) {
        const std::vector<std::filesystem::path> lone = models_without_state(o.checkpoints.out_dir);
        if (!lone.empty()) {
            throw UsageError("--out-dir " + o.checkpoints.out_dir +
                             " is not empty: " + finished_models_advice(lone));
        }
    }
    std::string listed;
    for (std::size_t i = 0; i < names.size() && i < 4; ++i)
        listed += (i > 0 ? ", " : "") + names[i];
    if (names.size() > 4) listed += ", ... (" + std::to_string(names.size()) + " files)";
    throw UsageError("--out-dir " + o.checkpoints.out_dir + " already holds checkpoints (" +
                     listed +
                     "): continue that run with --resume auto, or give another or an empty "
                     "--out-dir");
}

StartPoint load_init_from(const TrainOptions& o) {
    StartPoint start;
    std::vector<std::string> notes;
    start.model = load_model_file(o.model.init_from, &notes);
    for (const std::string& note : notes)
        spdlog::info("{}", note);
    start.source = "--init-from " + o.model.init_from;
    return start;
}

// --resume auto: the newest checkpoint whose model file and state file both verify; those that
// do not are skipped, each with its reason. Nothing usable where checkpoints were is refused
// rather than started afresh over them.
StartPoint find_auto_start(const TrainOptions& o) {
    const std::filesystem::path dir = o.checkpoints.out_dir;
    std::vector<std::filesystem::path> not_ours;
    const std::vector<std::int64_t> steps = list_checkpoints(dir, &not_ours);
    for (const std::filesystem::path& file : not_ours) {
        spdlog::warn("{}: not a checkpoint of ours (step number out of range), skipped",
                     file.string());
    }
    std::vector<std::string> skipped;
    for (const std::int64_t step : steps) {
        try {
            StartPoint start;
            start.state_file = state_path(dir, step);
            verify_resume_state(start.state_file);
            start.model = load_checkpoint(model_path(dir, step));
            start.source = "--resume " + start.state_file.string();
            if (!skipped.empty()) {
                spdlog::warn(
                    "--resume auto: {} skipped; resuming from the newest usable one, "
                    "at step {}",
                    skipped.size() == 1 ? "1 damaged checkpoint"
                                        : std::to_string(skipped.size()) + " damaged checkpoints",
                    step);
            }
            if (!o.model.init_from.empty() && !o.lora.enabled()) {
                spdlog::info("--init-from {} not used: {} {}", o.model.init_from,
                             log_lines::kResumingFrom, start.state_file.string());
            }
            return start;
        } catch (const InputError& e) {
            spdlog::warn("skipping checkpoint at step {}: {}", step, e.what());
            skipped.push_back(std::to_string(step));
        }
    }
    if (!skipped.empty()) {
        throw InputError("--resume auto: no checkpoint in " + dir.string() +
                         " can be resumed: every one is damaged (steps " +
                         fmt::format("{}", fmt::join(skipped, ", ")) +
                         ", reasons above); move them away to start afresh");
    }
    const std::vector<std::filesystem::path> lone = models_without_state(dir);
    if (!lone.empty()) {
        throw UsageError("--resume auto: no checkpoint to resume in " + dir.string() + ": " +
                         finished_models_advice(lone));
    }
    if (!o.model.init_from.empty()) {
        spdlog::info("--resume auto: no checkpoint in {}; starting from --init-from {}",
                     dir.string(), o.model.init_from);
        return load_init_from(o);
    }
    spdlog::info("--resume auto: no checkpoint in {}, starting fresh", dir.string());
    return {};
}

// --resume FILE: the state file named, and the model file beside it.
StartPoint find_named_start(const TrainOptions& o) {
    const std::filesystem::path state_file = o.checkpoints.resume;
    const auto step = checkpoint_step(state_file);
    if (!step || !state_file.filename().string().starts_with("state_")) {
        throw InputError("--resume " + o.checkpoints.resume +
                         ": expected 'auto' or a state_NNNNNN.bin file");
    }
    std::error_code ec;
    if (!std::filesystem::is_regular_file(state_file, ec)) {
        throw InputError("--resume " + o.checkpoints.resume + ": " +
                         (std::filesystem::exists(state_file, ec) ? "not a file" : "no such file"));
    }
    const std::filesystem::path model_file = model_path(state_file.parent_path(), *step);
    if (!std::filesystem::exists(model_file, ec)) {
        throw InputError("--resume " + o.checkpoints.resume + ": its model file " +
                         model_file.string() + " is missing (a checkpoint is both files)");
    }
    StartPoint start;
    start.model = load_checkpoint(model_file);
    start.state_file = state_file;
    start.source = "--resume " + o.checkpoints.resume;
    return start;
}

StartPoint find_start(const TrainOptions& o) {
    if (o.checkpoints.resume == "auto") return find_auto_start(o);
    if (!o.checkpoints.resume.empty()) return find_named_start(o);
    if (o.compute.benchmark == 0 && !o.eval.eval_only) refuse_foreign_checkpoints(o);
    if (!o.model.init_from.empty()) return load_init_from(o);
    return {};
}

// A LoRA run resumes on the base it adapted, not on the checkpoint's merged weights: the state
// says whether it was a LoRA run, with which configuration and on which base; flags that disagree
// are refused here, before the corpus is read. The base comes again from --init-from (its
// fingerprint checked; a random base is rebuilt from --seed and checked once built), the
// checkpoint's tokenizer stays, and the adapter comes from the checkpoint's .adapter directory.
void resume_lora_on_its_base(const TrainOptions& o, StartPoint& start) {
    const std::optional<ResumeState> state = read_state_header(start.state_file);
    if (!state) return;  // loading it reports why
    const std::string file = "--resume " + start.state_file.string();
    start.state_optimizer = state->optimizer;
    if (!o.optimizer.automatic && state->optimizer != o.optimizer.kind) {
        throw UsageError(fmt::format(
            "{}: the state is of a run trained with --optimizer {}, this run asks for {}: resume "
            "with --optimizer {}, or start a new run from its weights with --init-from {}",
            file, optimizer_name(state->optimizer), optimizer_name(o.optimizer.kind),
            optimizer_name(state->optimizer),
            model_path(start.state_file.parent_path(), state->step).string()));
    }
    const LoraRecord& saved = state->lora;
    const auto describe_config = [](const LoraConfig& c) {
        return fmt::format("r {}, alpha {}, targets {}{}", c.rank, c.alpha,
                           fmt::join(lora_target_modules(c.targets), ","),
                           c.dropout > 0.0f ? fmt::format(", dropout {}", c.dropout) : "");
    };
    if (saved.config.rank == 0) {
        if (!o.lora.enabled()) return;
        throw UsageError(
            file +
            ": the state is of full training (optimizer state for every weight), not of "
            "a LoRA run: drop --lora-rank to resume it");
    }
    if (!o.lora.enabled()) {
        throw UsageError(file + ": the state is of a LoRA run (" + describe_config(saved.config) +
                         "): resume it with the same " +
                         (saved.config.dropout > 0.0f
                              ? "--lora-rank, --lora-alpha, --lora-targets and --lora-dropout"
                              : "--lora-rank, --lora-alpha and --lora-targets") +
                         (saved.base_from_file ? " and the --init-from base it adapted" : ""));
    }
    const LoraConfig asked{o.lora.rank, o.lora.alpha,
                           parse_lora_targets(o.lora.targets, "--lora-targets", saved.modules),
                           o.lora.dropout};
    std::vector<std::string> differs;
    if (asked.rank != saved.config.rank) {
        differs.push_back(
            fmt::format("--lora-rank {} (the state's r {})", asked.rank, saved.config.rank));
    }
    if (asked.alpha != saved.config.alpha) {
        differs.push_back(
            fmt::format("--lora-alpha {} (the state's {})", asked.alpha, saved.config.alpha));
    }
    if (asked.targets != saved.config.targets) {
        differs.push_back(fmt::format("--lora-targets {} (the state's {})", o.lora.targets,
                                      fmt::join(lora_target_modules(saved.config.targets), ",")));
    }
    if (asked.dropout != saved.config.dropout) {
        differs.push_back(
            fmt::format("--lora-dropout {} (the state's {})", asked.dropout, saved.config.dropout));
    }
    if (!differs.empty()) {
        throw UsageError(
            fmt::format("{}: the LoRA run had another adapter: {}; give the flags it "
                        "was trained with",
                        file, fmt::join(differs, ", ")));
    }
    if (saved.base_from_file && o.model.init_from.empty()) {
        throw UsageError(file +
                         ": a LoRA run resumes on the base it adapted, which came from "
                         "--init-from: give that --init-from (the checkpoint's model file holds "
                         "the merged weights, not the base)");
    }
    if (!saved.base_from_file && o.seed != state->seed) {
        throw UsageError(file + ": the LoRA run adapted a random base built from --seed " +
                         std::to_string(state->seed) + ": give --seed " +
                         std::to_string(state->seed));
    }
    if (!saved.base_from_file && !o.model.init_from.empty()) {
        throw UsageError(
            file + ": the LoRA run adapted a random base built from --seed, not --init-from " +
            o.model.init_from + ": drop --init-from");
    }
    start.adapter_dir =
        adapter_path(start.state_file.parent_path(), *checkpoint_step(start.state_file));
    if (!std::filesystem::is_regular_file(start.adapter_dir / "adapter_config.json")) {
        throw InputError(file + ": the LoRA run's adapter " + start.adapter_dir.string() +
                         " is missing (no adapter_config.json there)");
    }
    if (!saved.base_from_file) {
        // The base is built again from --seed with the replica; run_plan checks its fingerprint.
        start.base_from_seed = true;
        spdlog::info(
            "resuming LoRA: the random base built again from --seed {}, the adapter "
            "from {}",
            o.seed, start.adapter_dir.string());
        return;
    }
    // The checkpoint's merged weights are not what resumes: dropped before the base is read, so
    // that a large model is never in memory twice.
    const ModelConfig resumed = start.model->model.config;
    start.model->model.params = AlignedBuffer<float>();
    StartPoint base = load_init_from(o);
    if (base.model->model.config != resumed) {
        throw UsageError("--init-from " + o.model.init_from + " (" +
                         describe(base.model->model.config) + ") is not the base of " + file +
                         " (" + describe(resumed) + "): give the --init-from the run adapted");
    }
    const auto weights = base.model->model.params.span();
    const std::uint64_t fingerprint = lora_base_fingerprint(weights);
    if (fingerprint != saved.base_fingerprint) {
        throw UsageError(fmt::format(
            "--init-from {} is not the base the LoRA run of {} adapted (base fingerprint {:016x}, "
            "the state's {:016x}): give the --init-from the run adapted",
            o.model.init_from, start.state_file.string(), fingerprint, saved.base_fingerprint));
    }
    start.model->model = std::move(base.model->model);
    spdlog::info(
        "resuming LoRA: the frozen base from --init-from {} (fingerprint {:016x}), the "
        "adapter from {}",
        o.model.init_from, fingerprint, start.adapter_dir.string());
}

// The shared rule (model_tokenizer_source) with train_gpt2's refusals: a checkpoint of ours with an
// empty tokenizer, a --tokenizer of another kind than the checkpoint's (the corpus is tokenized
// with the checkpoint's own), a tokenizer-less file of a vocabulary that is not GPT-2's.
TokenizerChoice choose_tokenizer(const TrainOptions& o, const StartPoint& start) {
    TokenizerChoice choice;
    choice.kind = requested_tokenizer(o);
    choice.preset_implies = !o.was_given("tokenizer") && choice.kind != o.data.tokenizer;
    choice.reason = o.was_given("tokenizer") ? "--tokenizer"
                    : choice.preset_implies  ? "as --model " + o.model.preset + " implies"
                                             : "default --tokenizer";
    if (!start.model) return choice;
    if (start.model->extras && start.model->extras->tokenizer.empty()) {
        throw InputError(start.source + ": the checkpoint has no tokenizer");
    }
    switch (model_tokenizer_source(*start.model, o.was_given("tokenizer"))) {
        case ModelTokenizerSource::Embedded: {
            choice.from_checkpoint = start.model->extras->tokenizer;
            const TokenizerKind kind = embedded_tokenizer(*start.model)->kind();
            if (o.was_given("tokenizer") && kind != o.data.tokenizer) {
                throw UsageError("--tokenizer " +
                                 std::string(tokenizer_kind_name(o.data.tokenizer)) +
                                 " contradicts " + start.source + ", whose tokenizer is " +
                                 std::string(tokenizer_kind_name(kind)) +
                                 " (the weights only make sense with it): drop --tokenizer");
            }
            choice.kind = kind;
            choice.reason = "the checkpoint's own";
            choice.preset_implies = false;
            break;
        }
        case ModelTokenizerSource::Requested:
            break;  // --tokenizer, built from the corpus
        case ModelTokenizerSource::Gpt2:
            choice.kind = TokenizerKind::Gpt2;
            choice.preset_implies = false;
            choice.reason = "GPT-2's, for a plain llm.c model file of vocabulary 50257 (from " +
                            o.data.tokenizer_dir + ")";
            break;
        case ModelTokenizerSource::Unknown:
            throw UsageError(start.source +
                             " is a plain llm.c model file without a tokenizer "
                             "and its vocabulary (" +
                             std::to_string(start.model->model.config.vocab_size) +
                             ") is not GPT-2's: give the --tokenizer it was trained with");
    }
    return choice;
}

}  // namespace

// Rank 0 decides where the run starts and which tokenizer it uses.
void choose_start(const TrainOptions& o, StartPoint& start, TokenizerChoice& choice) {
    start = find_start(o);
    if (!start.state_file.empty()) resume_lora_on_its_base(o, start);
    choice = choose_tokenizer(o, start);
    if (choice.from_checkpoint.empty()) {
        spdlog::debug("tokenizer: {} ({})", tokenizer_kind_name(choice.kind), choice.reason);
    }
    if (start.model && !start.model->extras && choice.reason.starts_with("GPT-2")) {
        spdlog::info("{}: no tokenizer in the file; using {}", start.source, choice.reason);
    }
}

}  // namespace gpt2
