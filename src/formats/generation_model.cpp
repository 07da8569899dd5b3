#include "formats/generation_model.hpp"

#include <exception>
#include <optional>
#include <string_view>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "formats/checkpoint.hpp"
#include "formats/model_file.hpp"
#include "formats/model_tokenizer.hpp"
#include "formats/resume_state.hpp"

namespace gpt2 {

namespace {

std::string_view as_text(const std::vector<std::uint8_t>& bytes) {
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

// Refuses a training resume state given where a model belongs, naming the model file to use.
void refuse_resume_state(const std::string& path) {
    if (!is_resume_state_file(path)) return;
    const std::optional<std::int64_t> step = checkpoint_step(path);
    const std::string model =
        step ? model_path("", *step).string() : std::string("the model_N.bin");
    throw InputError(path + " is a training resume state (optimizer moments), not a model: use " +
                     model + " from the same directory");
}

// A tokenizer and how to name where it came from in messages.
struct Named {
    std::unique_ptr<Tokenizer> tokenizer;
    std::string origin;
};

// The tokenizer --tokenizer asks for.
Named requested_tokenizer(const TokenizerRequest& r, int vocab_size) {
    const TokenizerKind kind = tokenizer_kinds_by_name().at(r.name);
    if (kind == TokenizerKind::Gpt2) return {load_gpt2_tokenizer(r.dir), "from " + r.dir};
    const std::vector<std::uint8_t> corpus = read_file_bytes(r.corpus);
    auto tokenizer = kind == TokenizerKind::Char ? make_char_tokenizer(as_text(corpus))
                                                 : train_bpe_tokenizer(as_text(corpus), vocab_size);
    return {std::move(tokenizer), "rebuilt from " + r.corpus};
}

// GPT-2's tokenizer for a model file without one whose vocabulary is GPT-2's.
Named gpt2_tokenizer_for(const std::string& path, const TokenizerRequest& r, int vocab_size,
                         std::vector<std::string>& notes) {
    notes.push_back(path + " has no tokenizer; its vocabulary (" + std::to_string(vocab_size) +
                    ") is GPT-2's, so it uses the GPT-2 tokenizer from " + r.dir +
                    " (--tokenizer to choose another)");
    try {
        return {load_gpt2_tokenizer(r.dir), "from " + r.dir};
    } catch (const InputError& e) {
        throw InputError(path + " needs the GPT-2 tokenizer (it has none), " +
                         "which could not be loaded: " + e.what() +
                         " (--tokenizer-dir DIR names its directory)");
    }
}

// The model's tokenizer by the rule train_gpt2 shares (model_tokenizer_source), with the checks of
// generation: a --tokenizer beside a checkpoint's own must reproduce it exactly, one for a file
// without a tokenizer must have the model's vocabulary. A tokenizer whose vocabulary cannot be the
// model's would turn every generated id into the wrong text, so it is refused rather than used.
Named choose_tokenizer(const std::string& path, const TokenizerRequest& r, const LoadedModel& file,
                       std::vector<std::string>& notes) {
    const int V = file.model.config.vocab_size;
    switch (model_tokenizer_source(file, !r.name.empty())) {
        case ModelTokenizerSource::Embedded: {
            std::unique_ptr<Tokenizer> own;
            try {
                own = embedded_tokenizer(file);
            } catch (const std::exception& e) {
                throw InputError(path + ": its tokenizer is unreadable: " + e.what());
            }
            if (r.name.empty()) return {std::move(own), "from the checkpoint"};
            Named requested = requested_tokenizer(r, V);
            if (requested.tokenizer->serialize() != own->serialize()) {
                throw UsageError(path + " carries its own tokenizer, " + describe_tokenizer(*own) +
                                 ", and --tokenizer " + r.name + " (" + requested.origin +
                                 ") is a different one, " +
                                 describe_tokenizer(*requested.tokenizer) +
                                 ": leave out --tokenizer to use the checkpoint's");
            }
            return requested;
        }
        case ModelTokenizerSource::Requested: {
            Named requested = requested_tokenizer(r, V);
            if (requested.tokenizer->vocab_size() != V) {
                throw UsageError(path + ": the model's vocabulary has " + std::to_string(V) +
                                 " tokens but --tokenizer " + r.name + " (" + requested.origin +
                                 ") has " + std::to_string(requested.tokenizer->vocab_size()) +
                                 ": a tokenizer must have exactly the model's vocabulary");
            }
            return requested;
        }
        case ModelTokenizerSource::Gpt2:
            return gpt2_tokenizer_for(path, r, V, notes);
        case ModelTokenizerSource::Unknown:
            break;
    }
    // GPT-2's tokenizer cannot fit this vocabulary, so only the rebuilt ones are offered.
    throw UsageError(path + ": has no tokenizer, and its vocabulary (" + std::to_string(V) +
                     " tokens) is not GPT-2's (" + std::to_string(kGpt2VocabSize) +
                     "): pass --tokenizer char|bpe --tokenizer-corpus FILE (the text "
                     "its tokenizer was built from)");
}

}  // namespace

std::string describe_tokenizer(const Tokenizer& t) {
    return std::string(tokenizer_kind_name(t.kind())) + " (vocab " +
           std::to_string(t.vocab_size()) + ")";
}

GenerationModel load_generation_model(const std::string& path, const TokenizerRequest& request) {
    refuse_resume_state(path);
    std::vector<std::string> notes;
    LoadedModel file = load_model_file(path, &notes);
    Named chosen = choose_tokenizer(path, request, file, notes);
    const int V = file.model.config.vocab_size;
    // A checkpoint may carry a smaller tokenizer than its model (trained from a larger model's
    // weights): generation then samples only the ids the tokenizer can print.
    if (chosen.tokenizer->vocab_size() > V) {
        throw InputError("the tokenizer's vocabulary (" +
                         std::to_string(chosen.tokenizer->vocab_size()) +
                         " tokens) is larger than the model's vocab_size (" + std::to_string(V) +
                         ") in " + path);
    }
    return GenerationModel{std::move(file.model), std::move(chosen.tokenizer),
                           std::move(chosen.origin), std::move(notes)};
}

}  // namespace gpt2
