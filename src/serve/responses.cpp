#include "serve/responses.hpp"

#include <nlohmann/json.hpp>

#include "core/utf8.hpp"

namespace gpt2::serve {

namespace {

using nlohmann::json;

std::string dump(const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// The legacy logprobs object of `tokens`, text offsets counted from `offset` in bytes.
json logprobs_object(const std::vector<TokenInfo>& tokens, std::size_t offset) {
    json strings = json::array(), logprobs = json::array(), tops = json::array(),
         offsets = json::array();
    for (const TokenInfo& t : tokens) {
        const std::string piece = sanitize_utf8(t.bytes);
        strings.push_back(piece);
        logprobs.push_back(t.logprob ? json(*t.logprob) : json(nullptr));
        if (!t.logprob) {
            tops.push_back(nullptr);
        } else {
            // OpenAI's form: token text -> logprob (two ids that print alike keep the likelier).
            json top = json::object();
            for (const TopToken& alt : t.top) {
                const std::string key = sanitize_utf8(alt.bytes);
                if (!top.contains(key)) top[key] = alt.logprob;
            }
            tops.push_back(std::move(top));
        }
        offsets.push_back(offset);
        offset += piece.size();
    }
    return json{{"tokens", strings},
                {"token_logprobs", logprobs},
                {"top_logprobs", tops},
                {"text_offset", offsets}};
}

}  // namespace

std::string completion_response(const ResponseHead& head, const std::vector<ChoiceResult>& choices,
                                bool logprobs) {
    json out_choices = json::array();
    int prompt_tokens = 0, completion_tokens = 0;
    for (std::size_t i = 0; i < choices.size(); ++i) {
        const ChoiceResult& c = choices[i];
        prompt_tokens += c.prompt_tokens;
        completion_tokens += c.completion_tokens;
        json choice{{"index", i}, {"finish_reason", c.finish_reason}};
        if (head.chat) {
            choice["message"] = json{{"role", "assistant"}, {"content", c.text}};
        } else {
            choice["text"] = c.text;
            choice["logprobs"] = logprobs ? logprobs_object(c.tokens, 0) : json(nullptr);
        }
        out_choices.push_back(std::move(choice));
    }
    return dump(json{{"id", head.id},
                     {"object", head.chat ? "chat.completion" : "text_completion"},
                     {"created", head.created},
                     {"model", head.model},
                     {"choices", out_choices},
                     {"usage",
                      {{"prompt_tokens", prompt_tokens},
                       {"completion_tokens", completion_tokens},
                       {"total_tokens", prompt_tokens + completion_tokens}}}});
}

std::string stream_chunk(const ResponseHead& head, const std::string& text,
                         const std::vector<TokenInfo>& tokens, bool logprobs,
                         std::size_t text_offset, const std::string& finish_reason, bool first) {
    json choice{{"index", 0},
                {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}};
    if (head.chat) {
        json delta = json::object();
        if (first) delta["role"] = "assistant";
        if (!text.empty() || finish_reason.empty()) delta["content"] = text;
        choice["delta"] = std::move(delta);
    } else {
        choice["text"] = text;
        choice["logprobs"] = logprobs ? logprobs_object(tokens, text_offset) : json(nullptr);
    }
    const json chunk{{"id", head.id},
                     {"object", head.chat ? "chat.completion.chunk" : "text_completion"},
                     {"created", head.created},
                     {"model", head.model},
                     {"choices", json::array({choice})}};
    return "data: " + dump(chunk) + "\n\n";
}

std::string stream_usage(const ResponseHead& head, int prompt_tokens, int completion_tokens) {
    const json chunk{{"id", head.id},
                     {"object", head.chat ? "chat.completion.chunk" : "text_completion"},
                     {"created", head.created},
                     {"model", head.model},
                     {"choices", json::array()},
                     {"usage",
                      {{"prompt_tokens", prompt_tokens},
                       {"completion_tokens", completion_tokens},
                       {"total_tokens", prompt_tokens + completion_tokens}}}};
    return "data: " + dump(chunk) + "\n\n";
}

std::string error_body(const std::string& message, const std::string& type,
                       const std::string& param, const std::string& code) {
    return dump(json{{"error",
                      {{"message", message},
                       {"type", type},
                       {"param", param.empty() ? json(nullptr) : json(param)},
                       {"code", code.empty() ? json(nullptr) : json(code)}}}});
}

}  // namespace gpt2::serve
