// gpt_serve's request bodies (serve/openai_api.h) as any client could send
// them: the input is a u8 (bit 0: /v1/chat/completions, else
// /v1/completions; bits 1-2: the stop strings of the choice-text pass
// below) and the body (the rest). A body must parse or be refused with
// InvalidArgument; a parsed request's prompts then go through ChoiceText
// as if generated (stop strings and UTF-8 across tokens) and a response
// body and chunk are built, which must be valid JSON.
#include <glog/logging.h>

#include <nlohmann/json.hpp>

#include "serve/choice_text.h"
#include "serve/openai_api.h"
#include "tests/fuzz/fuzz_util.h"

using namespace fleet;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const data::ByteTokenizer* tokenizer = new data::ByteTokenizer();
  static const serve::ChatTemplate* chat = new serve::ChatTemplate();
  fuzz::ByteReader in(data, size);
  const uint8_t flags = in.U8();
  const std::string body = in.Rest();
  const serve::ApiLimits limits{
      .context = 256, .max_tokens = 256, .vocab_size = 257, .max_choices = 64};
  Result<serve::GenerationRequest> r =
      (flags & 1) ? serve::ParseChatRequest(body, *tokenizer, *chat, limits)
                  : serve::ParseCompletionRequest(body, *tokenizer, limits);
  if (!r.ok()) {
    CHECK(r.status().IsInvalidArgument()) << r.status().ToString();
    return 0;
  }
  std::vector<std::string> stops = r->stop;
  if (flags & 2) stops.push_back("\xE2\x82");
  if (flags & 4) stops.push_back("ab");
  for (const std::vector<int32_t>& prompt : r->prompts) {
    serve::ChoiceText text(tokenizer, stops);
    std::string shown;
    for (size_t i = 0; i < prompt.size(); i += 3) {
      const std::span<const int32_t> piece(prompt.data() + i,
                                           std::min<size_t>(3, prompt.size() - i));
      shown += text.Append(piece).value().text;
    }
    shown += text.Finish().text;
    CHECK_EQ(serve::ToValidUtf8(shown), shown);
    CHECK_LE(text.tokens_used(), static_cast<int64_t>(prompt.size()));
    const serve::ResponseInfo info{.endpoint = r->endpoint, .id = "x", .created = 1, .model = "m"};
    const serve::ChoiceOutput choice{
        .index = 0, .text = shown, .finish = serve::FinishReason::kStop};
    CHECK(!nlohmann::json::parse(serve::ResponseBody(info, {choice}, {1, 1}), nullptr, false)
               .is_discarded());
    const std::string chunk = serve::ChunkEvent(info, choice, true, r->include_usage);
    CHECK(!nlohmann::json::parse(chunk.substr(6), nullptr, false).is_discarded());
  }
  return 0;
}

extern "C" void FleetFuzzSeeds(std::vector<std::string>* seeds) {
  const std::vector<std::pair<uint8_t, std::string>> bodies = {
      {0, R"({"prompt": "Hello", "max_tokens": 5, "stop": ["l", "lo"], "n": 2})"},
      {2, R"({"prompt": ["a\u20ac", [104, 105]], "logprobs": 2, "echo": true, "seed": -1})"},
      {4, R"({"prompt": [1, 2, 3], "logit_bias": {"97": -100}, "stream": true,
              "stream_options": {"include_usage": true}, "temperature": 0})"},
      {1, R"({"messages": [{"role": "system", "content": "S"},
              {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
              "logprobs": true, "top_logprobs": 3, "max_completion_tokens": 4})"},
      {3, R"({"messages": [{"role": "user", "content": "x"}], "tools": [], "stop": "y",
              "presence_penalty": 1.5, "user": "u", "response_format": {"type": "text"}})"},
  };
  for (const auto& [flags, body] : bodies) seeds->push_back(std::string(1, char(flags)) + body);
}
