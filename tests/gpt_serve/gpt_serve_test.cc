// gpt_serve (serve/) on a small random GPT with the byte tokenizer,
// in-process on a free port through cpp-httplib's client:
//   * a seeded request gives the same text streamed and not, again, and as
//     GenerateTokens gives it (the sampling code gpt_generate uses); n
//     choices and a list of prompts each get their own;
//   * concurrent requests (continuous batching, more than max_batch so some
//     queue) each get what the request gets alone (greedy);
//   * chat completions are completions of the chat template's prompt, cut
//     at its stop string; stop strings spanning tokens are cut and left out;
//   * log-probabilities (echoed prompt's too) are the model's log-softmax;
//     include_usage ends a stream with the usage;
//   * LoRA adapters served by name share a batch with the base and each
//     other, and each gives its merged checkpoint's greedy text;
//   * every bad request is a 400 with OpenAI's error shape naming the
//     problem, an unknown model a 404, a missing or wrong API key a 401, a
//     large body a 413, all counted in /metrics; a full queue is a 503;
//   * a streamed request whose client goes away is cancelled (499);
//   * 500 slow connections and an endless header line neither delay a
//     client past a second nor grow the server by 64 MiB;
//   * the gpt_serve program serves a checkpoint with an adapter and an API
//     key file, and stops on SIGTERM;
//   * on CUDA (skipped without a GPU) the text equals the CPU server's.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "serve/choice_text.h"
#include "tests/child_process.h"
#include "tests/data/test_util.h"
#include "tests/gpt_serve/serve_fixture.h"
#include "tests/raw_connection.h"
#include "trainer/models/gpt_decoder.h"
#include "trainer/models/gpt_lora_files.h"
#include "trainer/models/gpt_sampling.h"

namespace fleet::serve::testing {
namespace {

using nlohmann::json;

std::string Text(const Reply& r, int choice = 0) {
  const json& c = r.body["choices"][choice];
  return c.contains("message") ? c["message"]["content"].get<std::string>()
                               : c["text"].get<std::string>();
}

TEST(GptServe, SeededRequestIsReproducibleStreamedOrNot) {
  Server s;
  const json request = {{"prompt", "Fortune: "}, {"max_tokens", 30}, {"temperature", 0.9},
                        {"top_k", 40},           {"top_p", 0.95},    {"seed", 7}};
  const Reply plain = s.Post(request);
  ASSERT_EQ(plain.status, 200) << plain.raw;
  const json& choice = plain.body["choices"][0];
  const std::string text = choice["text"];
  EXPECT_EQ(plain.body["object"], "text_completion");
  EXPECT_EQ(plain.body["model"], "gpt");
  EXPECT_TRUE(choice["logprobs"].is_null());
  EXPECT_EQ(plain.body["usage"]["prompt_tokens"], 9);
  const int64_t n = plain.body["usage"]["completion_tokens"];
  EXPECT_EQ(plain.body["usage"]["total_tokens"], 9 + n);
  EXPECT_EQ(choice["finish_reason"], n == 30 ? "length" : "stop");

  EXPECT_EQ(Text(s.Post(request)), text);
  json streamed_request = request;
  streamed_request["stream"] = true;
  const Reply streamed = s.Post(streamed_request);
  ASSERT_EQ(streamed.status, 200);
  const Streamed st = ParseStream(streamed.raw);
  EXPECT_EQ(st.texts, std::vector<std::string>{text});
  EXPECT_EQ(st.finish_reasons[0], choice["finish_reason"]);
  json other_seed = request;
  other_seed["seed"] = 8;
  EXPECT_NE(Text(s.Post(other_seed)), text);

  // The same tokens as gpt_generate's sampling code, given the same seed.
  Model m("cpu");
  data::ByteTokenizer tokenizer;
  auto decoder = std::move(trainer::GptDecoder::Create(m.model.get()).value());
  auto sampler = std::move(
      trainer::RandomSampler::Create({.temperature = 0.9, .top_k = 40, .top_p = 0.95}).value());
  std::mt19937_64 rng(7);
  auto tokens = trainer::GenerateTokens(
      decoder.get(), *sampler, &rng, tokenizer.Encode("Fortune: "),
      {.min_dec_len = 0, .max_dec_len = 30, .eot_id = tokenizer.eot_id(), .vocab_limit = 257});
  ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
  EXPECT_EQ(text, ToValidUtf8(tokenizer.Decode(tokens->sequences[0]).value()));

  // A token-id prompt is the same prompt; n choices and prompt lists: choice
  // 0 of the first prompt is the request's own draw, the others differ.
  json ids = request;
  ids["prompt"] = tokenizer.Encode("Fortune: ");
  EXPECT_EQ(Text(s.Post(ids)), text);
  json many = request;
  many["prompt"] = {"Fortune: ", "Other: "};
  many["n"] = 2;
  const Reply four = s.Post(many);
  ASSERT_EQ(four.status, 200) << four.raw;
  ASSERT_EQ(four.body["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(four.body["choices"][i]["index"], i);
  EXPECT_EQ(Text(four, 0), text);
  EXPECT_NE(Text(four, 1), text);
  EXPECT_EQ(four.body["usage"]["prompt_tokens"], 9 + 7);
  many["stream"] = true;
  const Streamed four_streamed = ParseStream(s.Post(many).raw);
  ASSERT_EQ(four_streamed.texts.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(four_streamed.texts[i], Text(four, i)) << i;
}

TEST(GptServe, ConcurrentRequestsEachGetWhatTheyGetAlone) {
  Server s;  // 4 slots: 10 requests means batches that change every few steps
  std::vector<json> requests;
  for (int i = 0; i < 10; ++i) {
    requests.push_back({{"prompt", std::string(1 + 3 * i, static_cast<char>('a' + i))},
                        {"max_tokens", 8 + 2 * i},
                        {"temperature", 0},
                        {"stream", i % 2 == 1}});
  }
  auto text_of = [](const Reply& r) {
    return r.body.is_discarded() ? ParseStream(r.raw).texts.at(0) : Text(r);
  };
  std::vector<std::string> alone;
  for (const json& r : requests) {
    const Reply reply = s.Post(r);
    ASSERT_EQ(reply.status, 200) << reply.raw;
    alone.push_back(text_of(reply));
  }
  std::vector<std::future<Reply>> together;
  for (const json& r : requests) {
    together.push_back(std::async(std::launch::async, [&s, r] { return s.Post(r); }));
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    const Reply reply = together[i].get();
    ASSERT_EQ(reply.status, 200) << reply.raw;
    EXPECT_EQ(text_of(reply), alone[i]) << "request " << i;
  }
}

// The chat template's prompt completed: the same greedy text as a
// completion of that prompt with the template's stop, in chat's shape.
TEST(GptServe, ChatIsACompletionOfTheTemplatesPrompt) {
  Server s;
  const json messages = {{{"role", "system"}, {"content", "Be brief."}},
                         {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Hi"}}}}}};
  const Reply chat =
      s.Chat({{"model", "gpt"}, {"messages", messages}, {"max_tokens", 20}, {"temperature", 0}});
  ASSERT_EQ(chat.status, 200) << chat.raw;
  EXPECT_EQ(chat.body["object"], "chat.completion");
  EXPECT_EQ(chat.body["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  const json& choice = chat.body["choices"][0];
  EXPECT_EQ(choice["message"]["role"], "assistant");
  const std::string prompt =
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
      "<|im_start|>assistant\n";
  const Reply plain =
      s.Post({{"prompt", prompt}, {"max_tokens", 20}, {"temperature", 0}, {"stop", "<|im_end|>"}});
  ASSERT_EQ(plain.status, 200) << plain.raw;
  EXPECT_EQ(choice["message"]["content"], Text(plain));
  EXPECT_EQ(chat.body["usage"], plain.body["usage"]);

  const Reply streamed = s.Chat({{"messages", messages},
                                 {"max_tokens", 20},
                                 {"temperature", 0},
                                 {"stream", true},
                                 {"stream_options", {{"include_usage", true}}},
                                 {"n", 2}});
  ASSERT_EQ(streamed.status, 200) << streamed.raw;
  const Streamed st = ParseStream(streamed.raw);
  ASSERT_EQ(st.texts.size(), 2u);
  EXPECT_EQ(st.texts[0], Text(plain));
  EXPECT_EQ(st.texts[1], Text(plain));  // greedy: every choice alike
  EXPECT_EQ(st.usage["completion_tokens"], 2 * plain.body["usage"]["completion_tokens"].get<int>());
  for (const json& chunk : st.chunks) {
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    EXPECT_TRUE(chunk.contains("usage"));  // null until the last chunk
  }
  EXPECT_EQ(st.chunks[0]["choices"][0]["delta"]["role"], "assistant");
}

// A stop string that spans several tokens (one byte each here) is found,
// and the text ends before it.
TEST(GptServe, StopStringsAcrossTokensEndTheTextBeforeThem) {
  Server s;
  // Letters only (the model's choice among them: logit_bias lifts all 26
  // alike), so any three in a row make a stop string three tokens long.
  json letters = json::object();
  for (char c = 'a'; c <= 'z'; ++c) letters[std::to_string(c)] = 100;
  const json request = {
      {"prompt", "Stop at "}, {"max_tokens", 40}, {"temperature", 0}, {"logit_bias", letters}};
  const std::string whole = Text(s.Post(request));
  ASSERT_EQ(whole.size(), 40u) << whole;
  const size_t at = 17;
  const std::string stop = whole.substr(at, 3);
  const size_t first = whole.find(stop);
  json stopped = request;
  stopped["stop"] = {"never appears", stop};
  const Reply r = s.Post(stopped);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(Text(r), whole.substr(0, first));
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "stop");
  stopped["stream"] = true;
  const Streamed st = ParseStream(s.Post(stopped).raw);
  EXPECT_EQ(st.texts[0], whole.substr(0, first));
  EXPECT_EQ(st.finish_reasons[0], "stop");
}

TEST(GptServe, LogprobsAreTheModelsLogSoftmax) {
  Server s;
  const Reply r = s.Post(
      {{"prompt", "abc"}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 3}, {"echo", true}});
  ASSERT_EQ(r.status, 200) << r.raw;
  const json& lp = r.body["choices"][0]["logprobs"];
  const size_t n = r.body["usage"]["completion_tokens"];
  ASSERT_EQ(lp["tokens"].size(), 3 + n);  // the echoed prompt's, then the completion's
  EXPECT_EQ(lp["tokens"][0], "a");
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(Text(r).substr(0, 3), "abc");
  for (size_t i = 1; i < 3 + n; ++i) {
    const double chosen = lp["token_logprobs"][i];
    EXPECT_LE(chosen, 0.0);
    ASSERT_LE(lp["top_logprobs"][i].size(), 3u);
    double best = -INFINITY;
    for (const auto& [token, logprob] : lp["top_logprobs"][i].items()) {
      best = std::max(best, logprob.get<double>());
    }
    // Greedy: the completion's tokens are the most likely ones.
    if (i >= 3) {
      EXPECT_DOUBLE_EQ(chosen, best) << i;
    }
    EXPECT_GE(lp["text_offset"][i].get<int>(), lp["text_offset"][i - 1].get<int>());
  }
  // The prompt alone (max_tokens 0 with echo): its log-probabilities.
  const Reply prompt_only =
      s.Post({{"prompt", "abc"}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 0}});
  ASSERT_EQ(prompt_only.status, 200) << prompt_only.raw;
  EXPECT_EQ(Text(prompt_only), "abc");
  EXPECT_EQ(prompt_only.body["choices"][0]["logprobs"]["token_logprobs"][1],
            lp["token_logprobs"][1]);
  // Chat's shape: content entries with bytes and top_logprobs.
  const Reply chat = s.Chat({{"messages", {{{"role", "user"}, {"content", "x"}}}},
                             {"max_tokens", 4},
                             {"logprobs", true},
                             {"top_logprobs", 2},
                             {"temperature", 0}});
  ASSERT_EQ(chat.status, 200) << chat.raw;
  const json& content = chat.body["choices"][0]["logprobs"]["content"];
  ASSERT_FALSE(content.empty());
  EXPECT_TRUE(content[0]["bytes"].is_array());
  EXPECT_EQ(content[0]["top_logprobs"].size(), 2u);
}

// Two adapters and the base, requested together while admission is paused,
// run in the same steps; each text is its merged checkpoint's (gpt_convert
// --merge_lora's MergeGptLoraCheckpoint, served alone).
TEST(GptServe, AdaptersShareABatchAndEqualTheirMergedModels) {
  data::testing::TempDir dir;
  const std::string base = dir.path() + "/base";
  {
    Model m;
    WriteCheckpoint(*m.model, base);
  }
  const trainer::GptLoraConfig shout{.rank = 4, .alpha = 8, .targets = {true, true, true, true}};
  const trainer::GptLoraConfig terse{.rank = 2, .alpha = 2, .targets = {true, false, false, true}};
  WriteAdapterDir(dir.path() + "/shout", shout, 21, base);
  WriteAdapterDir(dir.path() + "/terse", terse, 22, base);
  for (const auto& [name, lora] : {std::pair{"shout", shout}, std::pair{"terse", terse}}) {
    trainer::GptConfig c = SmallConfig();
    c.lora = lora;
    ASSERT_TRUE(trainer::MergeGptLoraCheckpoint(dir.path() + "/" + name, c, base,
                                                dir.path() + "/" + name + "_merged")
                    .ok());
  }
  Server multi(Server::Default(), "cpu", base,
               {{"shout", dir.path() + "/shout"}, {"terse", dir.path() + "/terse"}});
  const Reply models = multi.Get("/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.body["object"], "list");
  ASSERT_EQ(models.body["data"].size(), 3u);
  EXPECT_EQ(models.body["data"][1]["id"], "shout");
  EXPECT_EQ(multi.Get("/v1/models/terse").body["object"], "model");

  const std::vector<std::string> names = {"gpt", "shout", "terse"};
  auto request = [](const std::string& model) {
    return json{{"model", model}, {"prompt", "Adapt me"}, {"max_tokens", 24}, {"temperature", 0}};
  };
  multi.server().scheduler().PauseAdmission(true);
  std::vector<std::future<Reply>> replies;
  for (const std::string& name : names) {
    replies.push_back(
        std::async(std::launch::async, [&, name] { return multi.Post(request(name)); }));
  }
  ASSERT_TRUE(multi.server().scheduler().WaitForQueueLength(3, std::chrono::seconds(30)).ok());
  multi.server().scheduler().PauseAdmission(false);
  std::vector<std::string> texts;
  for (auto& f : replies) {
    const Reply r = f.get();
    ASSERT_EQ(r.status, 200) << r.raw;
    texts.push_back(Text(r));
  }
  EXPECT_EQ(multi.server().scheduler().max_adapters_per_step(), 3);
  for (size_t i = 1; i < names.size(); ++i) {
    Server merged(Server::Default(), "cpu", dir.path() + "/" + names[i] + "_merged");
    const Reply alone = merged.Post(request("gpt"));
    ASSERT_EQ(alone.status, 200) << alone.raw;
    EXPECT_EQ(texts[i], Text(alone)) << names[i];
    EXPECT_NE(texts[i], texts[0]) << names[i] << " changes nothing";
  }
  EXPECT_EQ(multi.Post(request("shout")).body["model"], "shout");
  const Reply unknown = multi.Post(request("gpt-4"));
  EXPECT_EQ(unknown.status, 404) << unknown.raw;
  EXPECT_EQ(unknown.body["error"]["code"], "model_not_found");
  EXPECT_EQ(unknown.body["error"]["param"], "model");
  EXPECT_NE(unknown.body["error"]["message"].get<std::string>().find("gpt, shout, terse"),
            std::string::npos);
}

TEST(GptServe, BadRequestsAre400sAndTheServerKeepsServing) {
  Server s;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"prompt\": \"a\"", "not valid JSON"},
      {"[1, 2]", "JSON object"},
      {R"({"max_tokens": 4})", "prompt is required"},
      {R"({"prompt": ""})", "no tokens"},
      {R"({"prompt": 3})", "prompt must be"},
      {R"({"prompt": []})", "prompt must be"},
      {json{{"prompt", std::string(129, 'x')}}.dump(), "context of 128"},
      {R"({"prompt": [1, 257]})", "[0, 257)"},
      {R"({"prompt": "a", "max_tokens": 0})", "0 only with echo"},
      {R"({"prompt": "a", "max_tokens": 129})", "max_tokens"},
      {R"({"prompt": "a", "max_tokens": 2.5})", "max_tokens"},
      {R"({"prompt": "a", "temperature": -0.1})", "temperature"},
      {R"({"prompt": "a", "temperature": 2.5})", "temperature"},
      {R"({"prompt": "a", "top_p": 0})", "top_p"},
      {R"({"prompt": "a", "top_p": 1.5})", "top_p"},
      {R"({"prompt": "a", "top_k": -2})", "top_k"},
      {R"({"prompt": "a", "seed": 1.5})", "seed"},
      {R"({"prompt": "a", "stream": 1})", "stream"},
      {R"({"prompt": "a", "n": 0})", "n must be"},
      {R"({"prompt": "a", "n": 17})", "--max_queue"},
      {R"({"prompt": "a", "stop": ["a", "b", "c", "d", "e"]})", "up to 4"},
      {R"({"prompt": "a", "stop": [""]})", "non-empty"},
      {R"({"prompt": "a", "logprobs": 21})", "logprobs"},
      {R"({"prompt": "a", "presence_penalty": 3})", "presence_penalty"},
      {R"({"prompt": "a", "logit_bias": {"300": 1}})", "logit_bias"},
      {R"({"prompt": "a", "stream_options": {"include_usage": true}})", "only allowed when"},
      {R"({"prompt": "a", "best_of": 2})", "best_of"},
      {R"({"prompt": "a", "frobnicate": 1})", "unknown field \"frobnicate\""},
  };
  for (const auto& [body, needle] : cases) {
    const Reply r = s.Post("/v1/completions", body);
    EXPECT_EQ(r.status, 400) << body;
    ASSERT_TRUE(r.body.is_object()) << body << " -> " << r.raw;
    EXPECT_EQ(r.body["error"]["type"], "invalid_request_error");
    EXPECT_TRUE(r.body["error"].contains("param") && r.body["error"].contains("code"));
    EXPECT_NE(r.body["error"]["message"].get<std::string>().find(needle), std::string::npos)
        << body << " -> " << r.raw;
  }
  const std::vector<std::pair<json, std::string>> chat_cases = {
      {json::object(), "messages is required"},
      {{{"messages", json::array()}}, "non-empty"},
      {{{"messages", {{{"role", "robot"}, {"content", "x"}}}}}, "role \"robot\""},
      {{{"messages", {{{"role", "user"}}}}}, "content is required"},
      {{{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"top_logprobs", 2}},
       "needs logprobs"},
      {{{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"tools", {{{"type", "function"}}}}},
       "calls no tools"},
  };
  for (const auto& [body, needle] : chat_cases) {
    const Reply r = s.Chat(body);
    EXPECT_EQ(r.status, 400) << body;
    EXPECT_NE(r.body["error"]["message"].get<std::string>().find(needle), std::string::npos)
        << body << " -> " << r.raw;
  }
  // Fields clients send with null, and the ones accepted as they are.
  EXPECT_EQ(s.Post({{"prompt", "a"},
                    {"max_tokens", 2},
                    {"user", "me"},
                    {"suffix", nullptr},
                    {"logit_bias", nullptr},
                    {"presence_penalty", 0.5},
                    {"frequency_penalty", 0.5},
                    {"best_of", 1}})
                .status,
            200);
  const Reply missing = s.Get("/v1/chat/completions");
  EXPECT_EQ(missing.status, 404);
  EXPECT_NE(missing.raw.find("no endpoint GET /v1/chat/completions"), std::string::npos)
      << missing.raw;
  const Reply ok = s.Post(json{{"prompt", "a"}, {"max_tokens", 128}, {"temperature", 0}});
  ASSERT_EQ(ok.status, 200) << ok.raw;
  // A prompt of 1 token leaves 127 positions to feed back: at most 128 tokens.
  EXPECT_LE(ok.body["usage"]["completion_tokens"].get<int>(), 128);
  // Over the 1 MiB body limit: refused on its headers (none of it is sent
  // here: a server that waited for it would not answer), the connection
  // not to be reused (its unread body follows). The client's own
  // "Connection: close" makes httplib close it at once, so ReadAll ends.
  ::fleet::testing::RawConnection big(s.port());
  ASSERT_TRUE(
      big.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
               "Content-Length: " +
               std::to_string(2 << 20) + "\r\n\r\n"));
  const std::string refused = big.ReadAll();
  EXPECT_EQ(refused.rfind("HTTP/1.1 413", 0), 0u) << refused;
  EXPECT_NE(refused.find("Connection: close"), std::string::npos) << refused;
  const std::string metrics = s.Metrics();
  for (const std::string& line : {"fleet_serve_requests_total{code=\"400\"} " +
                                      std::to_string(cases.size() + chat_cases.size()),
                                  std::string("fleet_serve_requests_total{code=\"404\"} 1"),
                                  std::string("fleet_serve_requests_total{code=\"413\"} 1")}) {
    EXPECT_NE(metrics.find(line), std::string::npos) << line << " in\n" << metrics;
  }
}

// Strangers against gpt_serve's port (no API key needed to connect): 500
// connections that send the start of a request and then a byte a second
// (slowloris), and one endless header line (300 MiB offered). A
// well-behaved client is served within a second all the while, the header
// line gets 431, and the server grows by less than 64 MiB. On cpp-httplib
// the slowloris held all of gpt_serve's threads (a client's request timed
// out after 20 s, the next took 7-18 s) and the header line grew it by
// ~500 MiB.
TEST(GptServe, StrangersNeitherStallTheServerNorGrowIt) {
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &files);
  Server s;
  const json request = {{"prompt", "abc"}, {"max_tokens", 4}, {"temperature", 0}};
  const std::string expected = Text(s.Post(request));
  const auto resident_kib = [] { return ::fleet::testing::ResidentKib(getpid()); };
  const int64_t before = resident_kib();
  std::vector<std::unique_ptr<::fleet::testing::RawConnection>> slow;
  for (int i = 0; i < 500; ++i) {
    slow.push_back(std::make_unique<::fleet::testing::RawConnection>(s.port()));
    slow.back()->Send("POST /v1/completions HTTP/1.1\r\n");
  }
  std::atomic<bool> done{false};
  std::thread trickle([&] {
    for (int tick = 0; !done.load(); ++tick) {
      if (tick % 100 == 0) {
        for (auto& c : slow) c->Send("X");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // a byte a second each
    }
  });
  double slowest = 0;
  auto served = [&](const char* when) {
    const auto start = std::chrono::steady_clock::now();
    const Reply r = s.Post(request);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    slowest = std::max(slowest, took);
    EXPECT_EQ(r.status, 200) << when << ": " << r.raw;
    if (r.status == 200) {
      EXPECT_EQ(Text(r), expected) << when;
    }
    EXPECT_LT(took, 1.0) << when;
  };
  for (int i = 0; i < 5; ++i) {
    served("beside the slow connections");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  int64_t peak = resident_kib();
  std::string header_reply;
  {
    ::fleet::testing::RawConnection endless(s.port());
    endless.Send("POST /v1/completions HTTP/1.1\r\nX-Endless: ");
    const std::string chunk(1 << 20, 'A');
    for (int mib = 0; mib < 300 && endless.Send(chunk); ++mib)
      peak = std::max(peak, resident_kib());
    header_reply = endless.ReadAll();
  }
  for (int i = 0; i < 3; ++i) served("after the endless header line");
  peak = std::max(peak, resident_kib());
  done.store(true);
  trickle.join();
  EXPECT_EQ(header_reply.rfind("HTTP/1.1 431", 0), 0u) << header_reply.substr(0, 200);
  ASSERT_GT(before, 0);
  EXPECT_LT(peak - before, 64 * 1024) << "grew by " << (peak - before) / 1024 << " MiB";
  std::printf("beside 500 slow connections: slowest request %.3f s; RSS %+lld KiB at the peak\n",
              slowest, static_cast<long long>(peak - before));
}

TEST(GptServe, ApiKeysGuardEveryRouteButHealth) {
  ServeOptions o = Server::Default();
  o.service.api_keys = {"first-key-0123456789", "second-key-0123456789"};
  Server s(o);
  const json request = {{"prompt", "k"}, {"max_tokens", 2}};
  const httplib::Headers good = {{"Authorization", "Bearer second-key-0123456789"}};
  const httplib::Headers wrong = {{"Authorization", "Bearer second-key-0123456788"}};
  EXPECT_EQ(s.Post("/v1/completions", request.dump(), good).status, 200);
  for (const httplib::Headers& h : {httplib::Headers{}, wrong}) {
    const Reply r = s.Post("/v1/completions", request.dump(), h);
    EXPECT_EQ(r.status, 401) << r.raw;
    EXPECT_EQ(r.body["error"]["code"], "invalid_api_key");
  }
  EXPECT_EQ(s.Get("/v1/models").status, 401);
  EXPECT_EQ(s.Get("/metrics").status, 401);
  EXPECT_EQ(s.Get("/health").status, 200);
  const Reply metrics = s.Get("/metrics", good);
  ASSERT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.raw.find("fleet_serve_requests_total{code=\"401\"} 4"), std::string::npos)
      << metrics.raw;
}

TEST(GptServe, HealthAndMetrics) {
  Server s;
  const Reply health = s.Get("/health");
  EXPECT_EQ(health.body["status"], "ok");
  EXPECT_EQ(health.body["context"], 128);
  ASSERT_EQ(s.Post(json{{"prompt", "ab"}, {"max_tokens", 5}, {"temperature", 0}}).status, 200);
  const std::string metrics = s.Metrics();
  for (const char* line :
       {"fleet_serve_requests_total{code=\"200\"} 1", "fleet_serve_prompt_tokens_total 2",
        "fleet_serve_queue_length 0", "fleet_serve_request_latency_seconds_count 1",
        "fleet_serve_request_latency_seconds{quantile=\"0.99\"}",
        "fleet_serve_time_to_first_token_seconds_count 1", "fleet_serve_running_batch_size",
        "fleet_serve_tokens_per_second", "fleet_serve_generated_tokens_total"}) {
    EXPECT_NE(metrics.find(line), std::string::npos) << line << " in\n" << metrics;
  }
  // Generated tokens: what the response said.
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(metrics, m, std::regex("fleet_serve_generated_tokens_total (\\d+)")));
  EXPECT_GE(std::stoi(m[1]), 1);
  EXPECT_LE(std::stoi(m[1]), 5);
}

TEST(GptServe, AFullQueueIs503) {
  ServeOptions o = Server::Default();
  o.service.scheduler.max_queue = 2;
  Server s(o);
  s.server().scheduler().PauseAdmission(true);
  const json request = {{"prompt", "q"}, {"max_tokens", 3}, {"temperature", 0}};
  std::vector<std::future<Reply>> queued;
  for (int i = 0; i < 2; ++i) {
    queued.push_back(std::async(std::launch::async, [&] { return s.Post(request); }));
  }
  ASSERT_TRUE(s.server().scheduler().WaitForQueueLength(2, std::chrono::seconds(30)).ok());
  const Reply busy = s.Post(request);
  EXPECT_EQ(busy.status, 503) << busy.raw;
  EXPECT_NE(busy.raw.find("--max_queue"), std::string::npos) << busy.raw;
  EXPECT_NE(s.Metrics().find("fleet_serve_queue_length 2"), std::string::npos);
  s.server().scheduler().PauseAdmission(false);
  for (auto& f : queued) EXPECT_EQ(f.get().status, 200);
  EXPECT_EQ(s.Post(request).status, 200);
}

TEST(GptServe, AStreamWhoseClientLeavesIsCancelled) {
  Server s;
  // The request waits in the queue, so nothing is generated before the
  // client leaves: the server must notice through its keep-alive writes.
  s.server().scheduler().PauseAdmission(true);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = json{{"prompt", "zz"}, {"max_tokens", 40}, {"stream", true}}.dump();
  req.set_header("Content-Type", "application/json");
  std::string first;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    first.assign(data, n);
    return false;  // the client closes the connection after the first chunk
  };
  s.Client()->send(req);
  EXPECT_EQ(first, ": keep-alive\n\n");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (s.Metrics().find("fleet_serve_requests_total{code=\"499\"} 1") == std::string::npos) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no 499 in\n" << s.Metrics();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Dropped from the queue, never prefilled (only the next request's 1
  // prompt token is counted).
  s.server().scheduler().PauseAdmission(false);
  EXPECT_EQ(s.Post(json{{"prompt", "z"}, {"max_tokens", 2}}).status, 200);
  EXPECT_NE(s.Metrics().find("fleet_serve_prompt_tokens_total 1\n"), std::string::npos)
      << s.Metrics();
}

TEST(GptServe, CudaGivesTheCpuText) {
  Server gpu(Server::Default(), "cuda:0");
  if (!gpu.status().ok()) {
    GTEST_SKIP() << "no CUDA device for gpt_serve on cuda:0: " << gpu.status().ToString();
  }
  Server cpu;
  const json request = {{"prompt", "GPU or not"}, {"max_tokens", 20}, {"temperature", 0}};
  const Reply a = cpu.Post(request), b = gpu.Post(request);
  ASSERT_EQ(b.status, 200) << b.raw;
  EXPECT_EQ(Text(b), Text(a));
}

TEST(GptServe, BadCommandLinesAreExitStatus2WithTheReason) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--checkpoint", "x"}, "-c CONFIG is required"},
      {{"-c", "a.yaml"}, "--checkpoint DIR is required"},
      {{"-c", "a.yaml", "--checkpoint", "x", "--port", "70000"}, "--port must be an integer in"},
      {{"-c", "a.yaml", "--checkpoint", "x", "--max_batch=0"}, "--max_batch must be"},
      {{"-c", "a.yaml", "--checkpoint", "x", "--max_queue"}, "--max_queue needs a value"},
      {{"-c", "a.yaml", "--checkpoint", "x", "--batch", "4"}, "unknown flag --batch"},
      {{"-c", "a.yaml", "--checkpoint", "x", "--lora", "dir"}, "--lora takes NAME=DIR"},
  };
  for (const auto& [args, needle] : cases) {
    std::ostringstream out, err;
    EXPECT_EQ(GptServeMain(args, out, err), 2) << err.str();
    EXPECT_NE(err.str().find(needle), std::string::npos) << err.str();
    EXPECT_TRUE(out.str().empty());
  }
}

// The program: -c CONFIG --checkpoint DIR --lora NAME=DIR --api_key_file
// FILE --port 0 serves the checkpoint and the adapter (same text as the
// in-process server over the same parameters), asks for the key, and
// SIGTERM stops it with exit status 0. Pointed at the adapters' directory
// as a model, it says to merge or serve them.
TEST(GptServe, ProgramServesACheckpointAndAnAdapterUntilSigterm) {
  data::testing::TempDir dir;
  const std::string config_path = data::testing::SourcePath("configs/gpt/pretrain_gpt_tiny.yaml");
  // The tiny config's context (128) with SmallConfig's width and depth.
  const std::vector<std::string> overrides = {
      "-o", "Model.hidden_size=32", "-o", "Model.num_attention_heads=4",
      "-o", "Model.num_layers=2",   "-o", "Model.ffn_hidden_size=128"};
  const std::string base = dir.path() + "/base", adapter = dir.path() + "/shout";
  {
    Model m;
    WriteCheckpoint(*m.model, base);
  }
  WriteAdapterDir(adapter, {.rank = 2, .alpha = 4, .targets = {true, true, true, true}}, 31, base);
  const std::string key_file = dir.path() + "/keys";
  std::ofstream(key_file) << "\n  key-for-the-program-test  \n";
  ASSERT_EQ(chmod(key_file.c_str(), 0600), 0);

  std::vector<std::string> args = {::fleet::testing::BinDir() + "/gpt_serve", "-c", config_path};
  args.insert(args.end(), overrides.begin(), overrides.end());
  {
    // The adapters' directory given as the model.
    std::vector<std::string> wrong(args.begin() + 1, args.end());
    wrong.insert(wrong.end(), {"--checkpoint", adapter});
    std::ostringstream out, err;
    EXPECT_EQ(GptServeMain(wrong, out, err), 1);
    EXPECT_NE(err.str().find("holds LoRA adapters"), std::string::npos) << err.str();
    EXPECT_NE(err.str().find("--merge_lora"), std::string::npos) << err.str();
  }
  args.insert(args.end(), {"--checkpoint", base, "--lora", "shout=" + adapter, "--api_key_file",
                           key_file, "--port", "0", "--threads", "1"});
  const std::string log = dir.path() + "/serve.log";
  ::fleet::testing::Child child(args, {}, log);
  // Its first line says where it listens (bounded wait on the log; any
  // other first line is an error).
  std::smatch port;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::string text;
  const std::regex listening("listening on http://127.0.0.1:(\\d+)");
  while (!std::regex_search(text = ::fleet::testing::ReadAll(log), port, listening)) {
    ASSERT_EQ(text.find('\n'), std::string::npos) << "gpt_serve did not start:\n" << text;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "gpt_serve never listened:\n" << text;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(text.find("models gpt, shout"), std::string::npos) << text;
  httplib::Client client("127.0.0.1", std::stoi(port[1]));
  client.set_read_timeout(60, 0);
  const httplib::Headers key = {{"Authorization", "Bearer key-for-the-program-test"}};
  Server in_process(Server::Default(), "cpu", base, {{"shout", adapter}});
  for (const char* model : {"gpt", "shout"}) {
    const json request = {
        {"model", model}, {"prompt", "abc"}, {"max_tokens", 10}, {"temperature", 0}};
    EXPECT_EQ(client.Post("/v1/completions", request.dump(), "application/json")->status, 401);
    auto r = client.Post("/v1/completions", key, request.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], Text(in_process.Post(request))) << model;
  }
  kill(child.pid(), SIGTERM);
  const ::fleet::testing::Exit exit = child.Wait(std::chrono::seconds(30));
  EXPECT_TRUE(exit.exited && exit.code == 0) << ::fleet::testing::ReadAll(log);
}

}  // namespace
}  // namespace fleet::serve::testing
