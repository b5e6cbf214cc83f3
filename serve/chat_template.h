// ChatTemplate: how a chat (system / user / assistant messages) becomes the
// one prompt a GPT continues, from the config's Serving.chat_template:
//
//   Serving:
//     chat_template:
//       prefix: ""                                   # once, before the messages
//       system: "<|im_start|>system\n{content}<|im_end|>\n"
//       user: "<|im_start|>user\n{content}<|im_end|>\n"
//       assistant: "<|im_start|>assistant\n{content}<|im_end|>\n"
//       generation_prompt: "<|im_start|>assistant\n"  # after them: the reply's start
//       stop: "<|im_end|>"                            # ends the reply ("" for none)
//
// Each message becomes its role's text with "{content}" replaced by the
// message's content; then generation_prompt. The reply ends at `stop` (a
// stop string of every chat request, left out of the reply) or at
// end-of-text. Every key is optional; the defaults above are ChatML's
// (OpenAI's own format, and the one most open chat models are trained
// with), which suits a model fine-tuned on them. A role whose text is ""
// is refused in requests (say so in the config for a model without a system
// prompt). configs/gpt/chat_cpm9g.yaml ships CPM-9G's form:
// "<用户>{content}" then "<AI>" for the reply.
//
// The template is text: its markers are tokenized like any text (GPT-2's
// tokenizer has no special ids for them).
//
// Thread safety: immutable after Load.
#pragma once

#include <string>
#include <vector>

#include "comm/status.h"
#include "comm/yaml_config.h"

namespace fleet::serve {

struct ChatMessage {
  std::string role;  // "system" ("developer" reads as it), "user" or "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  // ChatML (the defaults above).
  ChatTemplate();
  // Serving.chat_template of `doc` over the defaults; InvalidArgument
  // naming the key (and its file) for a value that is not a string, an
  // unknown key, or a role text without "{content}".
  static Result<ChatTemplate> Load(const ConfigDocument& doc);

  // The prompt for `messages`. InvalidArgument naming the message for a
  // role this template has no text for, or no messages at all.
  Result<std::string> Render(const std::vector<ChatMessage>& messages) const;
  // The stop string of every reply; empty for none.
  const std::string& stop() const { return stop_; }

 private:
  std::string prefix_, system_, user_, assistant_, generation_prompt_, stop_;
};

}  // namespace fleet::serve
