// inference: text generation from a checkpoint with the KV-cache generator
// (build/inference CHECKPOINT [flags]; --help lists them). Under mpirun rank 0 loads and
// broadcasts the model, the samples are shared between ranks and rank 0 prints them in order.
// Generated text goes to stdout (always valid UTF-8); statistics and diagnostics to stderr.
// The flags are in options.cpp, the prompts in prompts.cpp, the samples (and the message that
// carries them to rank 0) in samples.cpp and sample_wire.cpp; this file loads and wires.
#include <spdlog/spdlog.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "apps/cli/cli.hpp"
#include "apps/inference/options.hpp"
#include "apps/inference/prompts.hpp"
#include "apps/inference/samples.hpp"
#include "core/error.hpp"
#include "core/stop_signal.hpp"
#include "data/chat_template.hpp"
#include "formats/generation_model.hpp"
#include "model/decode_weights.hpp"
#include "model/kv_cache.hpp"
#include "ops/gemm.hpp"
#include "parallel/comm.hpp"
#include "parallel/model_broadcast.hpp"
#include "threads/cpu_topology.hpp"
#include "tokenizer/tokenizer.hpp"

namespace {

namespace app = gpt2::app;
using gpt2::inference::Options;

// Rank 0's view of the checkpoint before it is shared: model and serialized tokenizer.
struct Loaded {
    std::optional<gpt2::Model> model;
    std::vector<std::uint8_t> tokenizer;
};

Loaded load(const Options& o) {
    gpt2::GenerationModel loaded = gpt2::load_generation_model(
        o.checkpoint, gpt2::TokenizerRequest{o.tokenizer, o.tokenizer_dir, o.tokenizer_corpus});
    for (const std::string& note : loaded.notes)
        spdlog::info("{}", note);
    spdlog::info("loaded {}: model {}, tokenizer {}, {}", o.checkpoint,
                 gpt2::describe(loaded.model.config), gpt2::describe_tokenizer(*loaded.tokenizer),
                 loaded.tokenizer_origin);
    Loaded out;
    out.tokenizer = loaded.tokenizer->serialize();
    out.model.emplace(std::move(loaded.model));
    return out;
}

// Every rank ends up with the same model and tokenizer (rank 0 reads, the others receive).
struct Shared {
    std::optional<gpt2::Model> model;
    std::unique_ptr<gpt2::Tokenizer> tokenizer;
};

Shared share(const Options& o, const gpt2::Communicator& comm) {
    Loaded loaded;
    if (comm.is_root()) loaded = load(o);
    // Waiting ranks sleep instead of spinning in the broadcast while rank 0 reads.
    comm.idle_barrier();
    const gpt2::ModelConfig config =
        gpt2::broadcast_config(comm, comm.is_root() ? loaded.model->config : gpt2::ModelConfig{});
    if (!comm.is_root()) loaded.model.emplace(config);
    gpt2::broadcast_weights(comm, *loaded.model);
    comm.broadcast_vector(loaded.tokenizer);
    return Shared{std::move(loaded.model), gpt2::deserialize_tokenizer(loaded.tokenizer)};
}

// Below ~16M parameters one token's work is too small to gain from a second worker (a small
// model's token takes about as long on one thread as on two, and several times longer on two when
// the cores are busy with other work), so small models default to one thread.
int default_threads(const gpt2::Model& model) {
    constexpr std::size_t kParallelParams = std::size_t{16} << 20;
    return model.layout.total() >= kParallelParams ? gpt2::available_cores() : 1;
}

int run(const Options& o, const gpt2::Communicator& world) {
    namespace inference = gpt2::inference;
    // With one sample per prompt only rank 0 works: the others wait without taking the CPUs.
    const bool solo = o.num_samples == 1 || world.size() == 1;
    if (solo && !world.is_root()) {
        world.idle_barrier();
        return app::kExitOk;
    }
    const gpt2::Communicator comm = solo ? gpt2::Communicator::single_process() : world;
    const Shared shared = share(o, comm);
    const gpt2::Model& model = *shared.model;
    const gpt2::Tokenizer& tokenizer = *shared.tokenizer;
    // Checked once the model is loaded, when text piped in has most likely arrived (under mpirun
    // it travels through mpirun first).
    if (comm.is_root() && !o.interactive && !o.chat && !o.prompt_from_stdin() &&
        inference::stdin_holds_data()) {
        throw gpt2::UsageError(
            "standard input holds text that nothing reads: pass --interactive (one prompt per "
            "line) or --prompt-file - (all of it as one prompt)");
    }
    gpt2::ThreadPool pool(o.threads > 0 ? o.threads : default_threads(model));
    std::unique_ptr<gpt2::DecodeWeights> compact;
    if (o.weight_format() != gpt2::WeightFormat::Fp32) {
        compact = std::make_unique<gpt2::DecodeWeights>(model, o.weight_format());
        spdlog::info(
            "weights {} for decoding: matrices {:.1f} MiB (fp32: {:.1f} MiB)",
            gpt2::weight_format_name(o.weight_format()),
            static_cast<double>(compact->bytes()) / (1 << 20),
            static_cast<double>(gpt2::decode_matrix_count(model) * sizeof(float)) / (1 << 20));
    }
    gpt2::KvCacheSession session(model, pool, 0, compact.get());
    spdlog::info("KV cache + scratch {:.1f} MiB, {} working rank(s) of {} x {} thread(s)",
                 static_cast<double>(session.memory_bytes()) / (1 << 20), comm.size(), world.size(),
                 pool.size());
    spdlog::info("prompts as matrix products: {}", session.prompt_products_name());

    if (o.chat) {
        // One conversation: the reply is printed (the user's line is on the terminal already)
        // and becomes the assistant's message; it ends where the model begins another turn.
        std::vector<gpt2::ChatMessage> conversation;
        if (!o.system.empty()) conversation.push_back({"system", o.system});
        std::vector<std::string> stops = o.stop;
        for (std::string& end : gpt2::chat_turn_ends())
            stops.push_back(std::move(end));
        std::uint64_t lines_read = 0;
        while (gpt2::stop_signal().load() == 0) {
            const std::optional<inference::Prompt> prompt =
                inference::next_chat_prompt(conversation, tokenizer, model, lines_read);
            if (!prompt) break;
            std::string reply = inference::run_prompt(o, comm, session, tokenizer, prompt->tokens,
                                                      "", prompt->line - 1, stops);
            conversation.push_back({std::string(gpt2::kChatAssistantRole), std::move(reply)});
        }
    } else if (o.interactive) {
        std::uint64_t lines_read = 0;
        // Every rank that shares the samples decides to stop alike (else one would wait for a
        // prompt the others never read).
        while (comm.allreduce_max(std::int64_t{gpt2::stop_signal().load()}) == 0) {
            const std::optional<inference::Prompt> prompt = inference::next_prompt(
                comm, tokenizer, model, gpt2::parse_eot_in_text(o.eot_in_text), lines_read);
            if (!prompt) break;
            (void)inference::run_prompt(o, comm, session, tokenizer, prompt->tokens, prompt->text,
                                        prompt->line - 1, o.stop);
        }
    } else {
        const inference::Prompt prompt = inference::single_prompt(o, comm, tokenizer, model);
        (void)inference::run_prompt(o, comm, session, tokenizer, prompt.tokens, prompt.text, 0,
                                    o.stop);
    }
    if (solo) world.idle_barrier();
    return app::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
    // Ctrl-C (SIGUSR1 under scripts/mpirun.sh) ends the sample being made and the program, exit
    // 0, rather than killing it mid-line; a read of standard input waiting for a line returns.
    gpt2::install_signal_handlers(false);
    gpt2::select_gemm_kernels(argv);
    gpt2::MpiSession mpi(&argc, &argv);
    const gpt2::Communicator comm;
    auto parsed = gpt2::inference::parse_options(argc, argv, comm.is_root());
    if (const int* code = std::get_if<int>(&parsed)) return *code;
    const Options& options = std::get<Options>(parsed);
    app::setup_logging(options.log_level, app::LogStream::Stderr, comm.rank(), comm.size());
    // An error is found the same way on every rank that looks, or only on rank 0: either way the
    // whole job must end, and MPI_Abort does that without waiting for anyone.
    try {
        return run(options, comm);
    } catch (const std::bad_alloc&) {
        comm.abort("out of memory loading or running " + options.checkpoint,
                   app::kExitRuntimeError);
    } catch (const gpt2::UsageError& e) {
        comm.abort(e.what(), app::kExitBadFlags);
    } catch (const std::exception& e) {
        comm.abort(e.what(), app::kExitRuntimeError);
    }
}
