#include "serve/requests.hpp"

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "core/utf8.hpp"
#include "data/chat_template.hpp"

namespace gpt2::serve {

namespace {

using nlohmann::json;

// Nesting deeper than any request needs is refused before parsing (a body of 8 MiB of '[' would
// otherwise build millions of levels).
constexpr int kMaxDepth = 16;

json parse_body(std::string_view body, const RequestLimits& limits) {
    if (body.size() > limits.max_body_bytes) {
        throw RequestError("", "the request body is " + std::to_string(body.size()) +
                                   " bytes, more than the " +
                                   std::to_string(limits.max_body_bytes) + " this server accepts");
    }
    int depth = 0;
    bool in_string = false;
    for (std::size_t i = 0; i < body.size(); ++i) {
        const char c = body[i];
        if (in_string) {
            if (c == '\\') ++i;
            if (c == '"') in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > kMaxDepth) throw RequestError("", "the request body nests too deeply");
        } else if (c == ']' || c == '}') {
            --depth;
        }
    }
    json j = json::parse(body, nullptr, false);
    if (j.is_discarded()) throw RequestError("", "the request body is not valid JSON");
    if (!j.is_object()) throw RequestError("", "the request body must be a JSON object");
    return j;
}

std::string type_name(const json& v) {
    return v.type_name();
}

[[noreturn]] void wrong_type(const std::string& field, const std::string& expected, const json& v) {
    throw RequestError(field, "'" + field + "' must be " + expected + ", not " + type_name(v));
}

double number(const json& body, const std::string& field, double fallback, double lo, double hi) {
    const auto it = body.find(field);
    if (it == body.end() || it->is_null()) return fallback;
    if (!it->is_number()) wrong_type(field, "a number", *it);
    const double v = it->get<double>();
    if (!std::isfinite(v) || v < lo || v > hi) {
        throw RequestError(field, "'" + field + "' must be in [" + json(lo).dump() + ", " +
                                      json(hi).dump() + "], not " + it->dump());
    }
    return v;
}

std::int64_t integer(const json& body, const std::string& field, std::int64_t fallback,
                     std::int64_t lo, std::int64_t hi) {
    const auto it = body.find(field);
    if (it == body.end() || it->is_null()) return fallback;
    if (!it->is_number_integer()) wrong_type(field, "an integer", *it);
    const std::int64_t v = it->is_number_unsigned()
                               ? static_cast<std::int64_t>(std::min<std::uint64_t>(
                                     it->get<std::uint64_t>(), std::uint64_t{1} << 62))
                               : it->get<std::int64_t>();
    if (v < lo || v > hi) {
        throw RequestError(field, "'" + field + "' must be in [" + std::to_string(lo) + ", " +
                                      std::to_string(hi) + "], not " + std::to_string(v));
    }
    return v;
}

bool boolean(const json& body, const std::string& field) {
    const auto it = body.find(field);
    if (it == body.end() || it->is_null()) return false;
    if (!it->is_boolean()) wrong_type(field, "true or false", *it);
    return it->get<bool>();
}

std::string text(const json& v, const std::string& field) {
    if (!v.is_string()) wrong_type(field, "a string", v);
    return v.get<std::string>();
}

// Every field of `body` must be one of `known`; the neutral values of what is not supported pass.
void check_fields(const json& body, const std::set<std::string>& known) {
    for (const auto& [key, value] : body.items()) {
        if (known.count(key) > 0) continue;
        const bool neutral =
            ((key == "presence_penalty" || key == "frequency_penalty") && value.is_number() &&
             value.get<double>() == 0.0) ||
            (key == "logit_bias" && (value.is_null() || (value.is_object() && value.empty()))) ||
            ((key == "n" || key == "best_of") && value.is_number_integer() &&
             value.get<std::int64_t>() == 1) ||
            value.is_null();
        if (neutral) continue;
        if (key == "n" || key == "best_of") {
            throw RequestError(key, "'" + key +
                                        "' other than 1 is not supported: send the request again "
                                        "for another completion");
        }
        throw RequestError(key, "'" + key + "' is not supported by this server");
    }
}

std::vector<std::string> stops(const json& body, const RequestLimits& limits) {
    std::vector<std::string> out;
    const auto it = body.find("stop");
    if (it == body.end() || it->is_null()) return out;
    if (it->is_string()) {
        out.push_back(it->get<std::string>());
    } else if (it->is_array()) {
        if (it->size() > limits.max_stops) {
            throw RequestError("stop", "'stop' holds " + std::to_string(it->size()) +
                                           " strings, at most " + std::to_string(limits.max_stops) +
                                           " are accepted");
        }
        for (const json& s : *it)
            out.push_back(text(s, "stop"));
    } else {
        wrong_type("stop", "a string or an array of strings", *it);
    }
    for (const std::string& s : out) {
        if (s.empty()) throw RequestError("stop", "'stop' strings must not be empty");
        if (s.size() > limits.max_stop_bytes) {
            throw RequestError("stop", "'stop' strings are at most " +
                                           std::to_string(limits.max_stop_bytes) + " bytes");
        }
    }
    return out;
}

std::vector<std::int32_t> checked_ids(const json& ids, const ModelLimits& model) {
    std::vector<std::int32_t> out;
    out.reserve(ids.size());
    for (const json& id : ids) {
        if (!id.is_number_integer()) wrong_type("prompt", "token ids (integers)", id);
        // JSON's non-negative integers parse as unsigned; an id past int64 is out of range too.
        const std::int64_t v = id.is_number_unsigned()
                                   ? static_cast<std::int64_t>(std::min<std::uint64_t>(
                                         id.get<std::uint64_t>(), std::uint64_t{1} << 62))
                                   : id.get<std::int64_t>();
        if (v < 0 || v >= model.vocab_size) {
            throw RequestError("prompt", "token id " + id.dump() +
                                             " is outside the model's vocabulary [0, " +
                                             std::to_string(model.vocab_size) + ")");
        }
        out.push_back(static_cast<std::int32_t>(v));
    }
    return out;
}

std::vector<std::int32_t> encoded(const Tokenizer& tokenizer, const std::string& prompt) {
    try {
        return tokenizer.encode(prompt, EotInText::Token);
    } catch (const std::exception& e) {
        throw RequestError("prompt", std::string("the prompt cannot be encoded: ") + e.what());
    }
}

// The sampling fields both endpoints share, and the checks of the prompts against the context.
void fill_common(const json& body, const ModelLimits& model, const RequestLimits& limits,
                 std::uint64_t default_seed, int max_tokens_default, CompletionRequest& request,
                 std::vector<Generation>& generations) {
    const std::string max_field =
        body.contains("max_completion_tokens") && !body.contains("max_tokens")
            ? "max_completion_tokens"
            : "max_tokens";
    const auto max_tokens = static_cast<int>(
        integer(body, max_field, max_tokens_default, request.chat ? 1 : 0, model.context));
    SamplingParams sampling;
    sampling.temperature = static_cast<float>(number(body, "temperature", 1.0, 0.0, 2.0));
    sampling.top_p = static_cast<float>(number(body, "top_p", 1.0, 0.0, 1.0));
    if (sampling.top_p == 0.0f) sampling.temperature = 0.0f;  // only the likeliest token is left
    sampling.top_k = static_cast<int>(integer(body, "top_k", 0, 0, model.vocab_size));
    const auto seed = static_cast<std::uint64_t>(integer(
        body, "seed", static_cast<std::int64_t>(default_seed >> 2),
        std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max()));
    const std::vector<std::string> stop_strings = stops(body, limits);
    request.stream = boolean(body, "stream");
    if (const auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
        if (!it->is_object()) wrong_type("stream_options", "an object", *it);
        if (!request.stream) {
            throw RequestError("stream_options", "'stream_options' needs 'stream': true");
        }
        for (const auto& [key, value] : it->items()) {
            if (key != "include_usage") {
                throw RequestError("stream_options." + key,
                                   "'stream_options." + key + "' is not supported");
            }
            request.include_usage = boolean(*it, "include_usage");
        }
    }
    for (Generation& g : generations) {
        if (g.prompt.size() > static_cast<std::size_t>(model.context)) {
            throw RequestError(request.chat ? "messages" : "prompt",
                               "the prompt is " + std::to_string(g.prompt.size()) +
                                   " tokens, longer than the context of " +
                                   std::to_string(model.context));
        }
        g.max_tokens = max_tokens;
        g.sampling = sampling;
        g.seed = seed;
        g.stops = stop_strings;
    }
    request.generations = std::move(generations);
}

}  // namespace

CompletionRequest parse_completion_request(std::string_view body_text, const Tokenizer& tokenizer,
                                           const ModelLimits& model, const RequestLimits& limits,
                                           std::uint64_t default_seed) {
    const json body = parse_body(body_text, limits);
    check_fields(body, {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed",
                        "stop", "echo", "logprobs", "stream", "stream_options", "user"});
    CompletionRequest request;
    const auto it = body.find("prompt");
    if (it == body.end()) throw RequestError("prompt", "'prompt' is required");
    // A string, an array of ids, or an array of strings or of arrays of ids.
    std::vector<Generation> generations;
    const auto add_string = [&](const std::string& s) {
        Generation g;
        g.prompt = encoded(tokenizer, s);
        g.prompt_text = s;
        generations.push_back(std::move(g));
    };
    const auto add_ids = [&](const json& ids) {
        Generation g;
        g.prompt = checked_ids(ids, model);
        g.prompt_text = sanitize_utf8(tokenizer.decode(g.prompt));
        generations.push_back(std::move(g));
    };
    if (it->is_string()) {
        add_string(it->get<std::string>());
    } else if (it->is_array() && !it->empty() && it->front().is_number()) {
        add_ids(*it);
    } else if (it->is_array() && !it->empty()) {
        if (it->size() > limits.max_prompts) {
            throw RequestError("prompt", "'prompt' holds " + std::to_string(it->size()) +
                                             " prompts, at most " +
                                             std::to_string(limits.max_prompts) + " are accepted");
        }
        for (const json& p : *it) {
            if (p.is_string()) {
                add_string(p.get<std::string>());
            } else if (p.is_array() && !p.empty()) {
                add_ids(p);
            } else {
                wrong_type("prompt", "a string, token ids or a list of either", p);
            }
        }
    } else {
        wrong_type("prompt", "a non-empty string, token ids or a list of either", *it);
    }
    for (Generation& g : generations) {
        if (g.prompt.empty()) {
            throw RequestError("prompt", "the prompt encodes to no tokens: give some text");
        }
        g.echo = boolean(body, "echo");
        if (const auto lp = body.find("logprobs"); lp != body.end() && !lp->is_null()) {
            g.logprobs = static_cast<int>(integer(body, "logprobs", 0, 0, limits.max_logprobs));
        }
    }
    fill_common(body, model, limits, default_seed, 16, request, generations);
    for (const Generation& g : request.generations) {
        if (g.max_tokens == 0 && !g.echo) {
            throw RequestError("max_tokens", "'max_tokens' 0 needs 'echo': true");
        }
    }
    if (request.stream && request.generations.size() > 1) {
        throw RequestError("prompt", "'stream' takes one prompt per request");
    }
    return request;
}

CompletionRequest parse_chat_request(std::string_view body_text, const Tokenizer& tokenizer,
                                     const ModelLimits& model, const RequestLimits& limits,
                                     std::uint64_t default_seed) {
    const json body = parse_body(body_text, limits);
    check_fields(body, {"model", "messages", "max_tokens", "max_completion_tokens", "temperature",
                        "top_p", "top_k", "seed", "stop", "stream", "stream_options", "user"});
    CompletionRequest request;
    request.chat = true;
    const auto it = body.find("messages");
    if (it == body.end()) throw RequestError("messages", "'messages' is required");
    if (!it->is_array() || it->empty()) wrong_type("messages", "a non-empty array", *it);
    std::vector<ChatMessage> conversation;
    for (const json& m : *it) {
        if (!m.is_object()) wrong_type("messages", "an array of objects", m);
        const auto role = m.find("role");
        const auto content = m.find("content");
        if (role == m.end()) throw RequestError("messages.role", "every message needs a 'role'");
        if (content == m.end()) {
            throw RequestError("messages.content", "every message needs a 'content'");
        }
        const std::string r = text(*role, "messages.role");
        if (r != "system" && r != "user" && r != "assistant") {
            throw RequestError("messages.role",
                               "'role' must be system, user or assistant, not " + role->dump());
        }
        std::string c;
        if (content->is_string()) {
            c = content->get<std::string>();
        } else if (content->is_array()) {  // parts: the text ones joined
            for (const json& part : *content) {
                if (!part.is_object() || part.value("type", "") != "text" ||
                    !part.contains("text") || !part["text"].is_string()) {
                    throw RequestError("messages.content", "only text content parts are supported");
                }
                c += part["text"].get<std::string>();
            }
        } else {
            wrong_type("messages.content", "a string", *content);
        }
        conversation.push_back(ChatMessage{r, std::move(c)});
    }
    Generation g;
    g.prompt_text = chat_prompt(conversation);
    try {
        g.prompt = tokenizer.encode(g.prompt_text, EotInText::Text);
    } catch (const std::exception& e) {
        throw RequestError("messages", std::string("the messages cannot be encoded: ") + e.what());
    }
    if (const auto eot = tokenizer.eot_id()) g.prompt.insert(g.prompt.begin(), *eot);
    std::vector<Generation> generations;
    generations.push_back(std::move(g));
    fill_common(body, model, limits, default_seed, model.context, request, generations);
    for (std::string& end : chat_turn_ends())
        request.generations.front().stops.push_back(std::move(end));
    return request;
}

}  // namespace gpt2::serve
