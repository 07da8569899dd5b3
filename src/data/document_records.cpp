// The records of a corpus: a JSON Lines line (a text field, prompt/response or prompt/completion
// fields, a chat) or a Parquet row made a whole document with its loss-mask spans, and bad ones
// counted or refused (the stream that calls these is in documents.cpp).
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/error.hpp"
#include "data/document_reader_state.hpp"
#include "data/documents.hpp"
#include "data/parquet/parquet.hpp"

namespace gpt2 {

namespace {

// A JSON Lines object as a record (its string field; without one, unless the field was given,
// prompt/response, prompt/completion or a chat), or why it is none.
[[nodiscard]] std::string jsonl_record(const nlohmann::json& object,
                                       const DocumentReaderOptions& options, ParquetRecord& out) {
    const auto string_field = [&object](const char* name) -> const nlohmann::json* {
        const auto field = object.find(name);
        return field != object.end() && field->is_string() ? &*field : nullptr;
    };
    out.messages.clear();
    if (const auto field = object.find(options.text_field);
        field != object.end() && field->is_string()) {
        out.kind = ParquetRecordKind::Text;
        out.text = field->get<std::string>();
        return {};
    }
    const std::string none = "no string field '" + options.text_field + "'";
    if (options.text_field_given) return none;
    const nlohmann::json* prompt = string_field("prompt");
    if (prompt != nullptr) {
        if (const nlohmann::json* response = string_field("response")) {
            out.kind = ParquetRecordKind::PromptResponse;
            out.prompt = prompt->get<std::string>();
            out.response = response->get<std::string>();
            return {};
        }
        if (const nlohmann::json* completion = string_field("completion")) {
            out.kind = ParquetRecordKind::PromptCompletion;
            out.prompt = prompt->get<std::string>();
            out.response = completion->get<std::string>();
            return {};
        }
    }
    auto chat = object.find("messages");
    if (chat == object.end()) chat = object.find("conversations");
    if (chat == object.end() || !chat->is_array()) {
        return none + " (nor prompt/response, prompt/completion, or a chat's \"messages\")";
    }
    for (std::size_t i = 0; i < chat->size(); ++i) {
        const nlohmann::json& message = (*chat)[i];
        const auto field = [&message](const char* a, const char* b) -> const nlohmann::json* {
            if (!message.is_object()) return nullptr;
            for (const char* name : {a, b}) {
                const auto it = message.find(name);
                if (it != message.end() && it->is_string()) return &*it;
            }
            return nullptr;
        };
        const nlohmann::json* role = field("role", "from");
        const nlohmann::json* content = field("content", "value");
        if (role == nullptr || content == nullptr) {
            return "message " + std::to_string(i + 1) +
                   " of the chat has no string role and content (or from and value)";
        }
        out.messages.push_back(ChatMessage{role->get<std::string>(), content->get<std::string>()});
    }
    if (out.messages.empty()) return "the chat has no messages";
    out.kind = ParquetRecordKind::Chat;
    return {};
}

}  // namespace

void DocumentReader::Impl::bad_input(const std::string& where) {
    if (!options.skip_bad_lines) {
        throw InputError(where + " (--skip-bad-lines skips such " +
                         (files[file].format == CorpusFormat::Parquet ? "rows" : "lines") +
                         ", counted)");
    }
    if (skipped++ == 0) first_skipped = where;
}

bool DocumentReader::Impl::next_jsonl(DocumentPiece& out) {
    for (;;) {
        std::size_t newline = pending.find('\n', head);
        while (newline == std::string::npos) {
            const std::size_t searched = pending.size() - head;  // fill() moves it to the front
            if (!fill()) break;
            newline = pending.find('\n', searched);
        }
        if (newline == std::string::npos && head == pending.size()) {
            ++file;
            open_next_file();
            return false;  // caller moves on to the next file
        }
        const std::size_t length = (newline == std::string::npos ? pending.size() : newline) - head;
        ++line;
        std::string_view text(pending.data() + head, length);
        head = std::min(pending.size(), head + length + 1);
        if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
        if (text.find_first_not_of(" \t") == std::string_view::npos) continue;  // blank line
        std::string reason;
        try {
            const nlohmann::json object = nlohmann::json::parse(text);
            if (!object.is_object()) {
                reason = "not a JSON object";
            } else {
                reason = jsonl_record(object, options, record);
            }
        } catch (const nlohmann::json::exception& e) {
            // nlohmann's message names the byte; invalid UTF-8 in a string is one of these.
            reason = std::string("not valid JSON (") + e.what() + ")";
        }
        if (!reason.empty()) {
            bad_input(files[file].path.string() + ":" + std::to_string(line) + ": " + reason);
            continue;
        }
        if (options.require_responses && record.kind == ParquetRecordKind::Text) {
            throw InputError(files[file].path.string() + ":" + std::to_string(line) +
                             ": a plain text document (field '" + options.text_field +
                             "'), which has no response to train: the loss on the response only "
                             "needs prompt/response or chat records (--loss-on all trains on "
                             "every token)");
        }
        record_text(record, out.text);
        record_spans(record, out.spans);
        whole_document(out);
        return true;
    }
}

bool DocumentReader::Impl::next_parquet(DocumentPiece& out) {
    while (parquet->next(record)) {
        if (!record.problem.empty()) {
            bad_input(files[file].path.string() + ": row " + std::to_string(record.row + 1) + ": " +
                      record.problem);
            continue;
        }
        if (options.require_responses && record.kind == ParquetRecordKind::Text) {
            throw InputError(files[file].path.string() + ": " + parquet->layout().description +
                             " holds plain text, which has no response to train: the loss on "
                             "the response only needs prompt/response or chat records (--loss-on "
                             "all trains on every token)");
        }
        record_text(record, out.text);
        record_spans(record, out.spans);
        whole_document(out);
        return true;
    }
    ++file;
    open_next_file();
    return false;  // caller moves on to the next file
}

}  // namespace gpt2
