#include "data/chat_template.hpp"

namespace gpt2 {

void append_chat_text(std::span<const ChatMessage> messages, std::string& text) {
    bool first = true;
    for (const ChatMessage& message : messages) {
        if (!first) text += kChatMessageSeparator;
        first = false;
        text += message.role;
        text += kChatRoleSeparator;
        text += message.content;
    }
}

std::string chat_prompt(std::span<const ChatMessage> conversation) {
    std::string text;
    append_chat_text(conversation, text);
    if (!conversation.empty()) text += kChatMessageSeparator;
    text += kChatAssistantRole;
    text += kChatRoleSeparator;
    return text;
}

std::vector<std::string> chat_turn_ends() {
    std::vector<std::string> ends;
    for (const std::string_view role : {kChatUserRole, std::string_view("system")}) {
        std::string end(kChatMessageSeparator);
        end += role;
        end += kChatRoleSeparator.substr(0, 1);  // "\n\nuser:" whatever follows the colon
        ends.push_back(std::move(end));
    }
    return ends;
}

}  // namespace gpt2
