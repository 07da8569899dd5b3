#include "formats/model_tokenizer.hpp"

namespace gpt2 {

bool carries_tokenizer(const LoadedModel& model) {
    return model.extras && !model.extras->tokenizer.empty();
}

ModelTokenizerSource model_tokenizer_source(const LoadedModel& model, bool requested) {
    if (carries_tokenizer(model)) return ModelTokenizerSource::Embedded;
    if (requested) return ModelTokenizerSource::Requested;
    if (model.model.config.vocab_size == kGpt2VocabSize) return ModelTokenizerSource::Gpt2;
    return ModelTokenizerSource::Unknown;
}

std::unique_ptr<Tokenizer> embedded_tokenizer(const LoadedModel& model) {
    if (!carries_tokenizer(model)) return nullptr;
    return deserialize_tokenizer(model.extras->tokenizer);
}

}  // namespace gpt2
