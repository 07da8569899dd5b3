#include "apps/inference/prompts.hpp"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/bytes.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"

namespace gpt2::inference {

namespace {

// The prompt's tokens; an empty prompt starts from end-of-text, or "\n" for the char tokenizer
// (which has no end-of-text), or token 0. InputError naming `source` if it cannot be encoded.
std::vector<std::int32_t> encode_prompt(const Tokenizer& tokenizer, const Model& model,
                                        std::string_view text, std::string_view source,
                                        EotInText eot) {
    std::vector<std::int32_t> tokens;
    if (!text.empty()) {
        try {
            tokens = tokenizer.encode(text, eot);
        } catch (const std::exception& e) {
            throw InputError(std::string(source) + ": cannot encode the prompt: " + e.what());
        }
    }
    if (tokens.empty()) {
        if (const auto eot = tokenizer.eot_id()) {
            tokens.push_back(*eot);
        } else {
            try {
                tokens = tokenizer.encode("\n");
            } catch (const InputError&) {
                tokens.clear();
            }
            if (tokens.size() != 1) tokens = {0};
        }
    }
    for (const std::int32_t t : tokens) {
        if (t < 0 || t >= model.config.vocab_size) {
            throw InputError(std::string(source) + ": token id " + std::to_string(t) +
                             " is outside the model's vocabulary [0, " +
                             std::to_string(model.config.vocab_size) + ")");
        }
    }
    const auto maxT = static_cast<std::size_t>(model.config.max_seq_len);
    if (tokens.size() > maxT) {
        spdlog::warn("{}: {} prompt tokens, only the last {} fit the context", source,
                     tokens.size(), maxT);
    }
    return tokens;
}

}  // namespace

bool stdin_holds_data() {
    struct stat status {};
    if (::fstat(STDIN_FILENO, &status) != 0) return false;
    if (!S_ISFIFO(status.st_mode) && !S_ISREG(status.st_mode)) return false;
    pollfd fd{STDIN_FILENO, POLLIN, 0};
    if (::poll(&fd, 1, 0) != 1 || (fd.revents & POLLIN) == 0) return false;
    char byte = 0;
    return ::read(STDIN_FILENO, &byte, 1) == 1;  // 0: end of input, nothing was there
}

Prompt single_prompt(const Options& o, const Communicator& comm, const Tokenizer& tokenizer,
                     const Model& model) {
    Prompt prompt;
    std::vector<std::uint8_t> bytes;
    if (comm.is_root()) {
        std::string source = "--prompt";
        if (o.prompt_from_stdin()) {
            source = "standard input (--prompt-file -)";
            prompt.text.assign(std::istreambuf_iterator<char>(std::cin),
                               std::istreambuf_iterator<char>());
            if (std::cin.bad()) throw InputError(source + ": read error");
        } else if (!o.prompt_file.empty()) {
            source = o.prompt_file;
            const auto file = read_file_bytes(o.prompt_file);
            prompt.text.assign(file.begin(), file.end());
        } else {
            prompt.text = o.prompt;
        }
        try {
            prompt.tokens = encode_prompt(tokenizer, model, prompt.text, source,
                                          parse_eot_in_text(o.eot_in_text));
        } catch (const InputError& e) {
            // --prompt is the command line's own text; a file's content is a bad input file.
            if (o.prompt_file.empty()) throw UsageError(e.what());
            throw;
        }
        bytes.resize(prompt.tokens.size() * sizeof(std::int32_t));
        std::memcpy(bytes.data(), prompt.tokens.data(), bytes.size());
    }
    comm.broadcast_vector(bytes);
    prompt.tokens.resize(bytes.size() / sizeof(std::int32_t));
    std::memcpy(prompt.tokens.data(), bytes.data(), bytes.size());
    return prompt;
}

std::optional<Prompt> next_prompt(const Communicator& comm, const Tokenizer& tokenizer,
                                  const Model& model, EotInText eot, std::uint64_t& lines_read) {
    Prompt prompt;
    std::vector<std::uint8_t> message;  // [line number (8 bytes), token ids...], empty at the end
    if (comm.is_root()) {
        std::string line;
        while (std::getline(std::cin, line)) {
            ++lines_read;
            try {
                prompt.tokens = encode_prompt(tokenizer, model, line,
                                              "stdin line " + std::to_string(lines_read), eot);
            } catch (const InputError& e) {
                spdlog::warn("{}; skipped, going on with the next line", e.what());
                continue;
            }
            prompt.line = lines_read;
            prompt.text = std::move(line);
            ByteWriter out;
            out.put(prompt.line);
            for (const std::int32_t t : prompt.tokens)
                out.put(t);
            message = out.take();
            break;
        }
    }
    comm.idle_barrier();
    comm.broadcast_vector(message);
    if (message.empty()) return std::nullopt;
    if (!comm.is_root()) {
        ByteReader in(message, "inference: prompt message");
        prompt.line = in.get<std::uint64_t>("line");
        prompt.tokens.resize(in.remaining() / sizeof(std::int32_t));
        for (std::int32_t& t : prompt.tokens)
            t = in.get<std::int32_t>("token");
    }
    return prompt;
}

std::optional<Prompt> next_chat_prompt(std::vector<ChatMessage>& conversation,
                                       const Tokenizer& tokenizer, const Model& model,
                                       std::uint64_t& lines_read) {
    std::string line;
    while (std::getline(std::cin, line)) {
        ++lines_read;
        conversation.push_back(ChatMessage{std::string(kChatUserRole), line});
        Prompt prompt;
        prompt.line = lines_read;
        const std::string text = chat_prompt(conversation);
        spdlog::debug(
            "chat prompt: {}",
            nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
        try {
            prompt.tokens =
                encode_prompt(tokenizer, model, text, "stdin line " + std::to_string(lines_read),
                              EotInText::Text);
        } catch (const InputError& e) {
            spdlog::warn("{}; this message is left out, going on with the next line", e.what());
            conversation.pop_back();
            continue;
        }
        if (const auto eot = tokenizer.eot_id()) prompt.tokens.insert(prompt.tokens.begin(), *eot);
        return prompt;
    }
    return std::nullopt;
}

}  // namespace gpt2::inference
