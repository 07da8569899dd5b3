// What the training run prints about itself: the start-up banner (model, layout, the memory line
// and table, data, validation set, precision) and the benchmark's summary.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "model/lora.hpp"
#include "ops/attention.hpp"
#include "ops/bf16.hpp"
#include "ops/gemm.hpp"
#include "ops/peak_flops.hpp"
#include "optim/muon.hpp"
#include "threads/cpu_topology.hpp"
#include "train/memory_plan.hpp"
#include "train/model_shape.hpp"
#include "train/text_format.hpp"
#include "train/training_loop.hpp"

namespace gpt2 {

// The memory line: activations and gradient windows per worker, the rank's gradient, weights
// and moments, and the start-up time.
void TrainingLoop::log_memory(spdlog::level::level_enum level) const {
    const WorkerGroup& workers = replica_.workers;
    const int W = workers.size();
    const Model& model = replica_.model;
    if (model.lora != nullptr) {
        // LoRA: no model gradient and no windows; the adapter and its moments instead.
        spdlog::log(
            level,
            "memory: {} activations per worker | rank: {} frozen weights, {} adapter, {} adapter "
            "AdamW moments | startup {:.0f} ms",
            human_bytes(static_cast<double>(workers.context(0).activation_bytes())),
            human_bytes(static_cast<double>(model.params.size() * 4 + model.params_bf16.size() * 2 -
                                            model.released_fp32_bytes)),
            human_bytes(static_cast<double>(model.lora->params.size() * 4)),
            human_bytes(static_cast<double>(replica_.optimizer->state.m.size() * 8)),
            startup_seconds_ * 1e3);
        return;
    }
    const bool shared = exchange_.shared();
    const int machine_ranks = exchange_.machines->machine.size();
    const int with_window = workers.contributing_workers() - 1;
    const std::string windows =
        with_window == 0
            ? std::string("no gradient windows")
            : fmt::format(
                  "gradient window {} on {} of {} workers",
                  human_bytes(static_cast<double>(workers.context(1).gradient_window.size() * 4)),
                  with_window, W);
    spdlog::log(
        level,
        "memory: {} activations per worker, {} | rank: {} gradient, {} weights{}, {} {}{} | "
        "startup {:.0f} ms",
        human_bytes(static_cast<double>(workers.context(0).activation_bytes())), windows,
        human_bytes(static_cast<double>(workers.gradient_bytes())),
        human_bytes(static_cast<double>(model.params.size() * 4 + model.params_bf16.size() * 2)),
        shared ? fmt::format(" (one copy for the {} ranks of this machine)", machine_ranks)
               : std::string(),
        human_bytes(static_cast<double>(replica_.optimizer->resident_bytes(model.layout))),
        replica_.optimizer->kind() == OptimizerKind::Muon ? "Muon momentum and AdamW moments"
                                                          : "AdamW moments",
        replica_.update_slices.empty() ? std::string()
        : shared                       ? fmt::format(" (this rank's slice of {})", machine_ranks)
                 : fmt::format(" (ZeRO-1: this rank's slice of {})", comm_.size()),
        startup_seconds_ * 1e3);
}

// The precision line with the GEMM backend and the MFU yardstick.
void TrainingLoop::log_precision() const {
    if (replica_.model.precision == Precision::Bf16) {
        spdlog::info(
            "precision bf16: products on {}, attention in {}, fp32 weights, gradients and "
            "AdamW{} | MFU against the fp32 peak {:.0f} GFLOP/s ({})",
            bf16_backend_name(bf16_backend()), bf16_attention_pays() ? "bf16" : "fp32",
            replica_.optimizer->kind() != OptimizerKind::Muon ? ""
            : newton_schulz_in_bf16(Precision::Bf16)
                ? ", Muon's Newton-Schulz products in bf16"
                : ", Muon's Newton-Schulz in fp32 (bf16 products are not faster here)",
            peak_gflops_, yardstick_.describe());
        if (bf16_backend() == Bf16Backend::Avx512Bf16 && comm_.is_root()) {
            // Without AMX, bf16 products are AVX512_BF16 dot products: oneDNN's kernels run at
            // 90-97% of their peak (docs/performance.md), so this core's two peaks say what bf16
            // can gain (on a Sapphire Rapids the dot products issue at half the FMAs' rate: 0.48x).
            // Measured and said once, by rank 0 (a warning would print on every rank).
            const double dot = measure_bf16_dot_peak();
            const FmaPeak fma = measure_fma_peak();
            const double ratio = dot / fma.gflops;
            const std::string line = fmt::format(
                "bf16 without AMX: this core's bf16 dot products peak at {:.0f} GFLOP/s, {:.2f}x "
                "its fp32 multiply-adds ({:.0f} GFLOP/s, {}; measured), {}",
                dot, ratio, fma.gflops, fma.isa,
                ratio < 1.0 ? "so bf16 products run slower than fp32's here: --precision fp32 "
                              "trains faster"
                            : "the most bf16 products can gain here: compare the two precisions "
                              "with --benchmark before a long run");
            // A warning only where bf16 loses; on AMD Zen 4 (1.7-2.0x) it is the faster choice.
            if (ratio < 1.0) {
                spdlog::warn("{}", line);
            } else {
                spdlog::info("{}", line);
            }
        }
    } else {
        spdlog::info("precision fp32: GEMM {} | MFU peak {:.0f} GFLOP/s ({})",
                     gemm_library() == GemmLibrary::OpenBlas
                         ? fmt::format("kernels {}", gemm_kernel_name())
                         : std::string("oneDNN sgemm"),
                     peak_gflops_, yardstick_.describe());
    }
    if (gemm_library() == GemmLibrary::OneDnn) {
        const int W = replica_.workers.size();
        spdlog::info("fp32 products on oneDNN's sgemm: {}",
                     W > openblas_calls_at_once()
                         ? fmt::format("{} workers call them at once, more than the {} OpenBLAS "
                                       "takes (its build's buffer pool; past it OpenBLAS crashes)",
                                       W, openblas_calls_at_once())
                         : std::string("GPT2_GEMM_LIBRARY=onednn"));
    }
}

void TrainingLoop::log_banner() const {
    const ModelConfig& config = replica_.model.config;
    const WorkerGroup& workers = replica_.workers;
    const int W = workers.size();
    spdlog::info("model {} | {} parameters ({})", describe(config),
                 with_commas(static_cast<double>(replica_.model.layout.total())),
                 human_bytes(static_cast<double>(replica_.model.layout.total()) * 4));
    spdlog::info("ranks x workers {} x {} | batch {} x {} per rank, grad accum {} | {} tokens/step",
                 comm_.size(), W, B_, T_, plan_.grad_accum,
                 with_commas(static_cast<double>(tokens_per_step_)));
    if (const std::string lora = describe_lora(replica_.model); !lora.empty()) {
        spdlog::info("{}", lora);
    }
    const std::string why = o_.optimizer.automatic
                                ? " (--optimizer auto: " + o_.optimizer.chosen_because + ")"
                                : std::string();
    if (replica_.optimizer->kind() == OptimizerKind::Muon) {
        spdlog::info(
            "optimizer: Muon on the hidden matrices (lr {}, momentum {}), AdamW on the rest (lr "
            "{}){}",
            o_.optimizer.muon_lr, o_.optimizer.muon_momentum, o_.optimizer.lr, why);
    } else {
        spdlog::info("optimizer: AdamW (lr {}){}", o_.optimizer.lr, why);
    }
    if (o_.optimizer.dropout > 0.0f) {
        spdlog::info(
            "dropout {} on the embeddings, the attention probabilities and the attention "
            "and MLP outputs (training steps only)",
            o_.optimizer.dropout);
    }
    if (corpus_.document_start) {
        spdlog::info(
            "attention within documents: a token attends only to its own document's tokens, a "
            "document beginning at each end-of-text token (id {}) and at each window's start",
            *corpus_.document_start);
    }
    // The per-rank total and what is available, always; its parts behind --verbose.
    const spdlog::level::level_enum details =
        o_.verbose ? spdlog::level::info : spdlog::level::debug;
    log_memory(details);
    const std::vector<std::string> memory = describe_memory(replica_.memory);
    for (std::size_t i = 0; i + 1 < memory.size(); ++i)
        spdlog::log(details, "{}", memory[i]);
    spdlog::info("{}", memory.back());
    if (B_ % W != 0) {
        const int fewer = W - B_ % W;
        spdlog::warn(
            "batch {} per rank does not divide over {} workers: {} of them take {}, the "
            "others {}, and wait for the rest at every layer; a --batch-size that is a multiple of "
            "{} keeps them all busy",
            B_, W, fewer, counted(B_ / W, "sequence"), B_ / W + 1, W);
    }
    // The default takes one worker per core, but a worker takes whole sequences.
    if (const int cores = available_cores(); o_.parallel.threads == 0 && W < cores) {
        spdlog::warn(
            "batch {} per rank gives {} worker{} to the {} cores this rank may run on, leaving {} "
            "idle (a worker takes whole sequences): a --batch-size of {} (or a multiple) uses "
            "them all",
            B_, W, W == 1 ? "" : "s", cores, cores - W, cores);
    }
    if (comm_.size() == 1 && o_.parallel.zero == 1) {
        spdlog::warn("--zero 1 with one rank: there is nothing to slice, the optimizer is whole");
    }
    if (!exchange_.share_error.empty()) {
        spdlog::warn(
            "shared memory is off for this run ({}): each rank keeps its own weights and a "
            "slice of the optimizer instead (ZeRO-1)",
            exchange_.share_error);
    }
    if (const std::string line = describe_exchange(exchange_, replica_, o_, comm_); !line.empty()) {
        spdlog::info("{}", line);
    }
    spdlog::info("data: {} train windows, {} val windows of {} tokens",
                 with_commas(static_cast<double>(corpus_.train_store.num_windows(T_))),
                 with_commas(static_cast<double>(corpus_.val_store.num_windows(T_))), T_);
    log_validation_set();
    log_precision();
    for (int w = 0; w < W; ++w) {
        const Range sequences = split_range(static_cast<std::size_t>(B_), w, W);
        spdlog::debug("rank {} worker {}: {} sequences, context {}", comm_.rank(), w,
                      sequences.end - sequences.begin,
                      human_bytes(static_cast<double>(workers.context(w).total_bytes())));
    }
}

// What validation covers, once: the tokens, or why there is none.
void TrainingLoop::log_validation_set() const {
    if (!comm_.is_root()) return;
    const std::string split = o_.data.train_data.empty()
                                  ? fmt::format("--data {}'s validation split (--val-fraction {})",
                                                o_.data.data, o_.data.val_fraction)
                                  : "--val-data " + o_.data.val_data;
    if (val_windows_ == 0) {
        spdlog::warn(
            "no validation: {} holds {} tokens, fewer than one window of --seq-len {} + 1; the "
            "validation loss is left out",
            split, with_commas(static_cast<double>(corpus_.val_store.num_tokens())), T_);
        return;
    }
    const std::uint64_t tokens = val_windows_ * static_cast<std::uint64_t>(T_);
    spdlog::info("validation: the first {} tokens of {}, {} windows of {}{}",
                 with_commas(static_cast<double>(tokens)), split,
                 with_commas(static_cast<double>(val_windows_)), T_,
                 tokens < static_cast<std::uint64_t>(o_.eval.val_tokens)
                     ? fmt::format(" (--val-tokens {}: {})",
                                   with_commas(static_cast<double>(o_.eval.val_tokens)),
                                   val_windows_ < corpus_.val_store.num_windows(T_)
                                       ? "rounded down to whole windows"
                                       : "more than the validation data holds")
                     : std::string());
}

void TrainingLoop::report_benchmark() {
    std::sort(step_ms_.begin(), step_ms_.end());
    const double median_ms = step_ms_[step_ms_.size() / 2];
    const double tok_s = static_cast<double>(tokens_per_step_) / (median_ms / 1e3);
    const double gflops = flops_per_step_ / (median_ms / 1e3) / 1e9;
    fmt::print(
        "benchmark: median {:.1f} ms/step | {:.1f} tok/s | {:.1f} GFLOP/s | MFU {:.1f}% "
        "| peak RSS {} | startup {:.0f} ms | {}, ranks {} x workers {}\n",
        median_ms, tok_s, gflops, 100.0 * gflops / peak_gflops_, human_bytes(peak_rss_bytes()),
        startup_seconds_ * 1e3, counted(static_cast<double>(step_ms_.size()), "step"), comm_.size(),
        replica_.workers.size());
    std::fflush(stdout);
}

}  // namespace gpt2
