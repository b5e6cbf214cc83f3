#include "serve/chat_template.h"

#include <string_view>

namespace fleet::serve {
namespace {

constexpr std::string_view kContent = "{content}";

std::string Fill(const std::string& text, const std::string& content) {
  std::string out;
  size_t from = 0;
  for (size_t at; (at = text.find(kContent, from)) != std::string::npos;
       from = at + kContent.size()) {
    out.append(text, from, at - from);
    out += content;
  }
  out.append(text, from);
  return out;
}

}  // namespace

ChatTemplate::ChatTemplate()
    : system_("<|im_start|>system\n{content}<|im_end|>\n"),
      user_("<|im_start|>user\n{content}<|im_end|>\n"),
      assistant_("<|im_start|>assistant\n{content}<|im_end|>\n"),
      generation_prompt_("<|im_start|>assistant\n"),
      stop_("<|im_end|>") {}

Result<ChatTemplate> ChatTemplate::Load(const ConfigDocument& doc) {
  ChatTemplate t;
  ConfigSection serving(doc, "Serving");
  ConfigSection s = serving.Sub("chat_template");
  FLEET_RETURN_IF_ERROR(s.String("prefix", &t.prefix_));
  for (auto [key, text] : {std::pair<const char*, std::string*>{"system", &t.system_},
                           {"user", &t.user_},
                           {"assistant", &t.assistant_}}) {
    FLEET_RETURN_IF_ERROR(s.String(key, text));
    if (!text->empty() && text->find(kContent) == std::string::npos) {
      return s.Error(key, "has no {content} for the message's text");
    }
  }
  FLEET_RETURN_IF_ERROR(s.String("generation_prompt", &t.generation_prompt_));
  FLEET_RETURN_IF_ERROR(s.String("stop", &t.stop_));
  FLEET_RETURN_IF_ERROR(s.Finish());
  FLEET_RETURN_IF_ERROR(serving.Finish());
  return t;
}

Result<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages) const {
  if (messages.empty()) return Status::InvalidArgument("messages: at least one message is needed");
  std::string prompt = prefix_;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const std::string* text = m.role == "system" || m.role == "developer" ? &system_
                              : m.role == "user"                          ? &user_
                              : m.role == "assistant"                     ? &assistant_
                                                                          : nullptr;
    if (text == nullptr || text->empty()) {
      return Status::InvalidArgument("messages[" + std::to_string(i) + "]: role \"" + m.role +
                                     "\" is not one this model's chat template has (" +
                                     (system_.empty() ? "" : "system, ") + "user, assistant)");
    }
    prompt += Fill(*text, m.content);
  }
  return prompt + generation_prompt_;
}

}  // namespace fleet::serve
