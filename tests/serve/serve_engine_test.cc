// serve/'s pieces without a model or a socket:
//   * ChoiceText: stop strings found across token boundaries and left out,
//     bytes that might begin one held back, UTF-8 characters split between
//     tokens kept whole; the pieces joined are the text however the tokens
//     come; token counts for usage and log-probabilities;
//   * ChatTemplate: ChatML by default, CPM-9G's form from the shipped
//     config, and every refusal naming its key or message;
//   * SequenceSampler: logit_bias, presence and frequency penalties against
//     the rule written out, log-probabilities against a plain log-softmax;
//   * the OpenAI request parser and response builder: prompt forms, the
//     chat's prompt and stop, defaults, and the shapes of bodies and chunks.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "comm/yaml_config.h"
#include "serve/chat_template.h"
#include "serve/choice_text.h"
#include "serve/openai_api.h"
#include "serve/sampling.h"
#include "tests/data/test_util.h"

namespace fleet::serve {
namespace {

using nlohmann::json;

std::vector<int32_t> Bytes(std::string_view s) {
  std::vector<int32_t> ids;
  for (char c : s) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

// Feeds `text`'s bytes in pieces of `step` tokens; the shown text and
// whether it stopped.
std::pair<std::string, bool> Feed(std::string_view text, size_t step,
                                  std::vector<std::string> stops, int64_t* used = nullptr) {
  data::ByteTokenizer tokenizer;
  ChoiceText c(&tokenizer, std::move(stops));
  const std::vector<int32_t> ids = Bytes(text);
  std::string shown;
  for (size_t i = 0; i < ids.size() && !c.stopped(); i += step) {
    const std::span<const int32_t> piece(ids.data() + i, std::min(step, ids.size() - i));
    shown += c.Append(piece).value().text;
  }
  shown += c.Finish().text;
  if (used != nullptr) *used = c.tokens_used();
  return {shown, c.stopped()};
}

TEST(ChoiceText, StopStringsAcrossTokensAreCutAndLeftOut) {
  const std::string text = "Hello<|im_end|>more text";
  for (size_t step : {1, 2, 3, 5, 100}) {
    int64_t used = 0;
    auto [shown, stopped] = Feed(text, step, {"<|im_end|>"}, &used);
    EXPECT_EQ(shown, "Hello") << "step " << step;
    EXPECT_TRUE(stopped);
    EXPECT_EQ(used, 15) << "tokens through the stop string's end";
  }
  // The earliest of several; one at the very start; a near miss is shown.
  EXPECT_EQ(Feed("abcXYdefXY", 1, {"def", "XY"}).first, "abc");
  EXPECT_EQ(Feed("stop now", 2, {"stop"}).first, "");
  EXPECT_EQ(Feed("<|im_en|> shown", 1, {"<|im_end|>"}),
            std::make_pair(std::string("<|im_en|> shown"), false));
}

TEST(ChoiceText, PiecesJoinedAreTheWholeTextHoweverTheTokensCome) {
  // Valid multi-byte characters and invalid bytes, split anywhere.
  const std::string text = "na\xC3\xAFve \xE2\x82\xAC \xF0\x9F\x99\x82 \xFF\xC3 end";
  for (size_t step = 1; step <= text.size(); ++step) {
    EXPECT_EQ(Feed(text, step, {}).first, ToValidUtf8(text)) << "step " << step;
  }
  // A stop string made of a character's bytes.
  EXPECT_EQ(Feed("a\xE2\x82\xAC b", 1, {"\xE2\x82\xAC"}).first, "a");
}

TEST(ChoiceText, HeldBackTokensAreReleasedWithTheirText) {
  data::ByteTokenizer tokenizer;
  ChoiceText c(&tokenizer, {"<end>"});
  auto piece = c.Append(Bytes("ab<e")).value();
  EXPECT_EQ(piece.text, "ab");  // "<e" may begin the stop
  EXPECT_EQ(piece.tokens, 2u);
  piece = c.Append(Bytes("x")).value();
  EXPECT_EQ(piece.text, "<ex");
  EXPECT_EQ(piece.tokens, 5u);
  piece = c.Append(Bytes("\xE2\x82")).value();  // half of a character
  EXPECT_EQ(piece.text, "");
  EXPECT_EQ(piece.tokens, 5u);
  EXPECT_EQ(c.token_bytes(5), "\xE2");
  piece = c.Finish();
  EXPECT_EQ(piece.text, "\xEF\xBF\xBD\xEF\xBF\xBD");  // two bytes of no character
  EXPECT_EQ(piece.tokens, 7u);
}

TEST(TokenDisplay, BytesThatAreNotUtf8AreNamedByValue) {
  EXPECT_EQ(TokenDisplay(" the"), " the");
  EXPECT_EQ(TokenDisplay("\xE2\x82"), "bytes:\\xe2\\x82");
}

TEST(ChatTemplate, ChatMlByDefault) {
  const ChatTemplate chat;
  auto prompt = chat.Render({{"system", "S"}, {"user", "U"}, {"assistant", "A"}, {"user", "V"}});
  ASSERT_TRUE(prompt.ok()) << prompt.status().ToString();
  EXPECT_EQ(*prompt,
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
            "<|im_start|>assistant\nA<|im_end|>\n<|im_start|>user\nV<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(chat.stop(), "<|im_end|>");
  EXPECT_EQ(chat.Render({{"developer", "D"}}).value(),
            "<|im_start|>system\nD<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_NE(chat.Render({{"user", "x"}, {"tool", "y"}}).status().message().find("messages[1]"),
            std::string::npos);
  EXPECT_TRUE(chat.Render({}).status().IsInvalidArgument());
}

TEST(ChatTemplate, Cpm9gFromTheShippedConfig) {
  auto doc = ConfigDocument::Load(data::testing::SourcePath("configs/gpt/chat_cpm9g.yaml"));
  ASSERT_TRUE(doc.ok()) << doc.status().ToString();
  auto chat = ChatTemplate::Load(*doc);
  ASSERT_TRUE(chat.ok()) << chat.status().ToString();
  EXPECT_EQ(
      chat->Render(
              {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}})
          .value(),
      "Be brief.<用户>Hi<AI>Hello<用户>Bye<AI>");
  EXPECT_EQ(chat->stop(), "<用户>");
  // Overrides (YAML: quoted, or {content} reads as a map) and refusals
  // name the key.
  ASSERT_TRUE(doc->Override("Serving.chat_template.user=\"U: {content}\\n\"").ok());
  EXPECT_EQ(ChatTemplate::Load(*doc)->Render({{"user", "x"}}).value(), "U: x\n<AI>");
  ASSERT_TRUE(doc->Override("Serving.chat_template.user=no placeholder").ok());
  EXPECT_NE(ChatTemplate::Load(*doc).status().message().find("Serving.chat_template.user"),
            std::string::npos);
  ASSERT_TRUE(doc->Override("Serving.chat_template.user=\"{content}\"").ok());
  ASSERT_TRUE(doc->Override("Serving.chat_template.usr=x").ok());
  EXPECT_NE(ChatTemplate::Load(*doc).status().message().find("usr"), std::string::npos);
}

// A row of logits where token 3 is the argmax by far.
std::vector<float> Row() {
  std::vector<float> row(20);
  for (size_t i = 0; i < row.size(); ++i) row[i] = 0.1f * static_cast<float>(i % 7);
  row[3] = 5.0f;
  return row;
}

TEST(SequenceSampler, BiasAndPenaltiesMoveTheLogitsTheyName) {
  const std::vector<float> row = Row();
  auto greedy = [&](SamplingParams p, int draws) {
    p.temperature = 0;
    auto s = std::move(SequenceSampler::Create(p, 20).value());
    std::vector<int32_t> out;
    for (int i = 0; i < draws; ++i) out.push_back(s->Next(row, nullptr).value());
    return out;
  };
  EXPECT_EQ(greedy({}, 3), (std::vector<int32_t>{3, 3, 3}));
  EXPECT_EQ(greedy({.logit_bias = {{7, 10.0f}}}, 2), (std::vector<int32_t>{7, 7}));
  // Token 3 leads by 4.4: a frequency penalty of 2 takes it below the next
  // after 3 draws (5 - 3 * 2 < 0.6), presence 2 alone never does.
  EXPECT_EQ(greedy({.frequency_penalty = 2}, 4), (std::vector<int32_t>{3, 3, 3, 6}));
  EXPECT_EQ(greedy({.presence_penalty = 2}, 4), (std::vector<int32_t>{3, 3, 3, 3}));
  EXPECT_EQ(greedy({.presence_penalty = 2, .frequency_penalty = 1.5}, 3),
            (std::vector<int32_t>{3, 3, 6}));
  // Ids at or beyond the vocabulary limit are never drawn.
  auto limited = std::move(SequenceSampler::Create({.temperature = 0}, 3).value());
  EXPECT_LT(limited->Next(row, nullptr).value(), 3);
  EXPECT_TRUE(
      SequenceSampler::Create({.logit_bias = {{20, 1.0f}}}, 20).status().IsInvalidArgument());
  EXPECT_TRUE(SequenceSampler::Create({.presence_penalty = 2.5}, 20).status().IsInvalidArgument());
}

TEST(SequenceSampler, LogprobsAreALogSoftmaxOfTheRawLogits) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-4, 4);
  std::vector<float> row(1000);
  for (float& x : row) x = u(rng);
  double lse = 0;
  for (float x : row) lse += std::exp(double{x});
  lse = std::log(lse);
  // Biased and penalised draws still report the model's own numbers.
  auto s = std::move(
      SequenceSampler::Create({.logit_bias = {{10, 50.0f}}, .top_logprobs = 4, .seed = 1}, 1000)
          .value());
  TokenLogprob lp;
  ASSERT_EQ(s->Next(row, &lp).value(), 10);
  EXPECT_NEAR(lp.logprob, row[10] - lse, 1e-4);
  ASSERT_EQ(lp.top.size(), 4u);
  std::vector<int32_t> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 4, order.end(),
                    [&](int32_t a, int32_t b) { return row[a] > row[b]; });
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(lp.top[i].first, order[i]);
    EXPECT_NEAR(lp.top[i].second, row[order[i]] - lse, 1e-4);
  }
}

ApiLimits Limits() {
  return {.context = 64, .max_tokens = 64, .vocab_size = 257, .max_choices = 8};
}

TEST(OpenAiApi, PromptsInEveryFormAndTheDefaults) {
  data::ByteTokenizer tokenizer;
  const auto parse = [&](const json& body) {
    return ParseCompletionRequest(body.dump(), tokenizer, Limits());
  };
  auto r = parse({{"prompt", "ab"}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->prompts, (std::vector<std::vector<int32_t>>{{'a', 'b'}}));
  EXPECT_EQ(r->max_tokens, 16);
  EXPECT_EQ(r->sampling.temperature, 1.0);
  EXPECT_EQ(r->sampling.top_logprobs, -1);
  EXPECT_FALSE(r->has_seed);
  r = parse({{"prompt", {"a", "bc"}}, {"n", 2}, {"seed", -3}, {"logprobs", 0}, {"top_k", -1}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->prompts.size(), 2u);
  EXPECT_EQ(r->sampling.seed, static_cast<uint64_t>(-3));
  EXPECT_EQ(r->sampling.top_logprobs, 0);
  EXPECT_EQ(r->sampling.top_k, 0);
  r = parse({{"prompt", {{1, 2}, {3}}}, {"logit_bias", {{"65", -100}}}, {"stop", "x"}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->prompts[1], std::vector<int32_t>{3});
  EXPECT_EQ(r->sampling.logit_bias, (std::vector<std::pair<int32_t, float>>{{65, -100.0f}}));
  EXPECT_EQ(r->stop, std::vector<std::string>{"x"});
  // 3 prompts x n 3 = 9 choices, over the 8 this server queues.
  EXPECT_TRUE(parse({{"prompt", {"a", "b", "c"}}, {"n", 3}}).status().IsInvalidArgument());
  EXPECT_TRUE(parse({{"prompt", "a"}, {"echo", true}, {"max_tokens", 0}}).ok());
}

TEST(OpenAiApi, ChatBecomesTheTemplatesPromptWithItsStop) {
  data::ByteTokenizer tokenizer;
  auto r = ParseChatRequest(json{{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                 {"stop", {"x"}},
                                 {"logprobs", true},
                                 {"max_completion_tokens", 5},
                                 {"tool_choice", "none"},
                                 {"response_format", {{"type", "text"}}}}
                                .dump(),
                            tokenizer, ChatTemplate(), Limits());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->prompts[0], Bytes("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"));
  EXPECT_EQ(r->stop, (std::vector<std::string>{"x", "<|im_end|>"}));
  EXPECT_EQ(r->sampling.top_logprobs, 0);
  EXPECT_EQ(r->max_tokens, 5);
  // Without max_tokens: as much as the server allows.
  r = ParseChatRequest(R"({"messages": [{"role": "user", "content": "hi"}]})", tokenizer,
                       ChatTemplate(), Limits());
  EXPECT_EQ(r->max_tokens, 64);
}

TEST(OpenAiApi, BodiesAndChunksHaveOpenAisFields) {
  const ResponseInfo completion{
      .endpoint = Endpoint::kCompletions, .id = "cmpl-1", .created = 5, .model = "m"};
  ChoiceOutput choice{
      .index = 0, .text = "hi", .has_logprobs = true, .finish = FinishReason::kStop};
  choice.logprobs.push_back({.chosen = {"h", -0.5f}, .top = {{"h", -0.5f}, {"\xE2", -1.0f}}});
  choice.logprobs.push_back({.chosen = {"i", -0.25f}, .top = {}, .text_offset = 1});
  const json body = json::parse(ResponseBody(completion, {choice}, {3, 2}));
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["usage"],
            json({{"prompt_tokens", 3}, {"completion_tokens", 2}, {"total_tokens", 5}}));
  const json& lp = body["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"h", "i"}));
  EXPECT_EQ(lp["token_logprobs"], json({-0.5, -0.25}));
  EXPECT_EQ(lp["top_logprobs"][0]["bytes:\\xe2"], -1.0);
  EXPECT_EQ(lp["text_offset"], json({0, 1}));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");

  const ResponseInfo chat{
      .endpoint = Endpoint::kChat, .id = "chatcmpl-1", .created = 5, .model = "m"};
  const json message = json::parse(ResponseBody(chat, {choice}, {3, 2}))["choices"][0];
  EXPECT_EQ(message["message"],
            json({{"role", "assistant"}, {"content", "hi"}, {"refusal", nullptr}}));
  EXPECT_EQ(message["logprobs"]["content"][0]["bytes"], json({104}));
  const std::string first = ChunkEvent(chat, {.index = 1}, /*opening=*/true, true);
  ASSERT_EQ(first.rfind("data: ", 0), 0u);
  const json opening = json::parse(first.substr(6));
  EXPECT_EQ(opening["object"], "chat.completion.chunk");
  EXPECT_EQ(opening["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(opening["usage"].is_null());
  const json usage = json::parse(UsageEvent(chat, {3, 2}).substr(6));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 5);
  const json error = json::parse(ErrorBody("no", "invalid_request_error", "model", "x"));
  EXPECT_EQ(error["error"], json({{"message", "no"},
                                  {"type", "invalid_request_error"},
                                  {"param", "model"},
                                  {"code", "x"}}));
}

}  // namespace
}  // namespace fleet::serve
