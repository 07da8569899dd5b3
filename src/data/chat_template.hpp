// The one chat template: how prepare_data lays out a chat's messages as a document's text, and
// how inference --chat lays out a conversation for the model to continue with the assistant's
// next message. A model trained on chat data through prepare_data sees at inference exactly the
// layout it was trained on.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gpt2 {

struct ChatMessage {
    std::string role;
    std::string content;
};

// Between a message's role and its content, and between two messages.
inline constexpr std::string_view kChatRoleSeparator = ": ";
inline constexpr std::string_view kChatMessageSeparator = "\n\n";
// The role whose messages inference --chat asks the model for, and the user's.
inline constexpr std::string_view kChatAssistantRole = "assistant";
inline constexpr std::string_view kChatUserRole = "user";

// Each message as role + ": " + content, the messages joined by "\n\n" (appended to `text`).
void append_chat_text(std::span<const ChatMessage> messages, std::string& text);

// The conversation so far, then the start of the assistant's next message ("\n\nassistant: "):
// the text after which the model writes that message (a document begins at end-of-text, which
// the caller puts before it as its token).
[[nodiscard]] std::string chat_prompt(std::span<const ChatMessage> conversation);

// Where an assistant's message ends in the text the model writes after chat_prompt: the start
// of another turn ("\n\nuser:", "\n\nsystem:"), besides the end-of-text token that ends a
// training document.
[[nodiscard]] std::vector<std::string> chat_turn_ends();

}  // namespace gpt2
