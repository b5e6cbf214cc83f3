// gpt_serve (examples/gpt/serve_*.h) on a small random GPT with the byte
// tokenizer, in-process on a free port through cpp-httplib's client:
//   * a seeded request gives the same text streamed and not, again, and as
//     GenerateTokens gives it (the sampling code gpt_generate uses);
//   * concurrent requests (continuous batching, more than max_batch so some
//     queue) each get what the request gets alone (greedy);
//   * every bad request is a 400 with a JSON message naming the problem, and
//     the server keeps serving; a full queue is a 503;
//   * /health and /metrics;
//   * a streamed request whose client goes away is cancelled (499);
//   * the gpt_serve program serves a checkpoint and stops on SIGTERM;
//   * on CUDA (skipped without a GPU) the text equals the CPU server's.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "examples/gpt/generate_app.h"
#include "examples/gpt/serve_app.h"
#include "tests/child_process.h"
#include "tests/data/test_util.h"
#include "trainer/backend.h"
#include "trainer/checkpoint.h"
#include "trainer/kernels/gpt_cpu_kernels.h"
#include "trainer/kernels/gpt_kernels_factory.h"
#include "trainer/models/gpt_decoder.h"
#include "trainer/models/gpt_sampling.h"
#include "trainer/optimizer.h"

namespace fleet::examples::gpt {
namespace {

using nlohmann::json;

trainer::GptConfig SmallConfig() {
  trainer::GptConfig c;
  c.vocab_size = 257;  // the byte tokenizer's
  c.max_position_embeddings = 48;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.num_layers = 2;
  return c;
}

// Parameters large enough that the logits spread over several units, so a
// greedy choice is never a near tie that rounding could flip.
std::vector<float> SmallParams(size_t n) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-0.4f, 0.4f);
  std::vector<float> p(n);
  for (float& x : p) x = u(rng);
  return p;
}

// A model on `device` holding SmallParams.
struct Model {
  explicit Model(const std::string& device) {
    Result<trainer::GptCompute> c = trainer::CreateGptCompute(device, trainer::Precision::kFp32, 1);
    if (!c.ok()) {
      status = c.status();
      return;
    }
    compute = std::move(*c);
    model = std::move(
        trainer::GptModel::Create(SmallConfig(), compute.backend.get(), compute.kernels.get())
            .value());
    CHECK(model->arena().ParamsFromHost(SmallParams(model->arena().size())).ok());
  }
  Status status;
  trainer::GptCompute compute;
  std::unique_ptr<trainer::GptModel> model;
};

struct Reply {
  int status = -1;
  json body;
  std::string raw;
};

class Server {
 public:
  explicit Server(ServeOptions options = Default(), const std::string& device = "cpu")
      : model_(device) {
    if (!model_.status.ok()) return;
    auto server = CompletionServer::Start(model_.model.get(), &tokenizer_, options);
    CHECK(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
  }
  static ServeOptions Default() {
    ServeOptions o;
    o.scheduler.max_batch = 4;
    o.scheduler.max_queue = 16;
    o.request_timeout = std::chrono::seconds(60);
    return o;
  }
  const Status& status() const { return model_.status; }
  CompletionServer& server() { return *server_; }

  std::unique_ptr<httplib::Client> Client() {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    c->set_read_timeout(60, 0);
    return c;
  }
  Reply Post(const std::string& body) {
    auto r = Client()->Post("/v1/completions", body, "application/json");
    if (!r) return {};
    return {r->status, json::parse(r->body, nullptr, false), r->body};
  }
  Reply Post(const json& body) { return Post(body.dump()); }
  std::string Get(const std::string& path) {
    auto r = Client()->Get(path.c_str());
    CHECK(r && r->status == 200) << path;
    return r->body;
  }

 private:
  data::ByteTokenizer tokenizer_;
  Model model_;
  std::unique_ptr<CompletionServer> server_;
};

// The text of a streamed response: checks each event's shape, that only the
// last chunk has a finish_reason (and usage), that [DONE] ends it.
struct Streamed {
  std::string text, finish_reason;
  json usage;
};
Streamed ParseStream(const std::string& raw) {
  Streamed s;
  size_t pos = 0;
  bool done = false;
  while (pos < raw.size()) {
    const size_t end = raw.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << raw;
    if (end == std::string::npos) break;
    const std::string event = raw.substr(pos, end - pos);
    pos = end + 2;
    if (event.rfind(": ", 0) == 0) continue;  // a comment (keep-alive)
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    EXPECT_FALSE(done) << "an event after [DONE]: " << event;
    if (event == "data: [DONE]") {
      done = true;
      continue;
    }
    EXPECT_TRUE(s.finish_reason.empty()) << "a chunk after the finish: " << event;
    const json j = json::parse(event.substr(6));
    EXPECT_EQ(j["object"], "text_completion");
    s.text += j["choices"][0]["text"].get<std::string>();
    if (!j["choices"][0]["finish_reason"].is_null()) {
      s.finish_reason = j["choices"][0]["finish_reason"];
      s.usage = j["usage"];
    }
  }
  EXPECT_TRUE(done) << raw;
  return s;
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
  EXPECT_EQ(plain.body["usage"]["prompt_tokens"], 9);
  const int64_t n = plain.body["usage"]["completion_tokens"];
  EXPECT_EQ(plain.body["usage"]["total_tokens"], 9 + n);
  EXPECT_EQ(choice["finish_reason"], n == 30 ? "length" : "stop");

  EXPECT_EQ(s.Post(request).body["choices"][0]["text"], text);
  json streamed_request = request;
  streamed_request["stream"] = true;
  const Reply streamed = s.Post(streamed_request);
  ASSERT_EQ(streamed.status, 200);
  const Streamed st = ParseStream(streamed.raw);
  EXPECT_EQ(st.text, text);
  EXPECT_EQ(st.finish_reason, choice["finish_reason"]);
  EXPECT_EQ(st.usage, plain.body["usage"]);
  json other_seed = request;
  other_seed["seed"] = 8;
  EXPECT_NE(s.Post(other_seed).body["choices"][0]["text"], text);

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

  // A token-id prompt is the same prompt.
  json ids = request;
  ids["prompt"] = tokenizer.Encode("Fortune: ");
  EXPECT_EQ(s.Post(ids).body["choices"][0]["text"], text);
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
    return r.body.is_discarded() ? ParseStream(r.raw).text
                                 : r.body["choices"][0]["text"].get<std::string>();
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

TEST(GptServe, BadRequestsAre400sAndTheServerKeepsServing) {
  Server s;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"prompt\": \"a\"", "not valid JSON"},
      {"[1, 2]", "JSON object"},
      {R"({"max_tokens": 4})", "prompt is required"},
      {R"({"prompt": ""})", "no tokens"},
      {R"({"prompt": 3})", "prompt must be"},
      {json{{"prompt", std::string(49, 'x')}}.dump(), "context of 48"},
      {R"({"prompt": [1, 257]})", "[0, 257)"},
      {R"({"prompt": "a", "max_tokens": 0})", "max_tokens"},
      {R"({"prompt": "a", "max_tokens": 49})", "max_tokens"},
      {R"({"prompt": "a", "max_tokens": 2.5})", "max_tokens"},
      {R"({"prompt": "a", "temperature": -0.1})", "temperature"},
      {R"({"prompt": "a", "temperature": 2.5})", "temperature"},
      {R"({"prompt": "a", "top_p": 0})", "top_p"},
      {R"({"prompt": "a", "top_p": 1.5})", "top_p"},
      {R"({"prompt": "a", "top_k": -1})", "top_k"},
      {R"({"prompt": "a", "seed": -1})", "seed"},
      {R"({"prompt": "a", "stream": 1})", "stream"},
      {R"({"prompt": "a", "n": 2})", "unknown field \"n\""},
  };
  for (const auto& [body, needle] : cases) {
    const Reply r = s.Post(body);
    EXPECT_EQ(r.status, 400) << body;
    ASSERT_TRUE(r.body.is_object()) << body << " -> " << r.raw;
    EXPECT_EQ(r.body["error"]["type"], "invalid_request_error");
    EXPECT_NE(r.body["error"]["message"].get<std::string>().find(needle), std::string::npos)
        << body << " -> " << r.raw;
  }
  auto missing = s.Client()->Get("/v1/chat/completions");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_NE(missing->body.find("no endpoint GET /v1/chat/completions"), std::string::npos)
      << missing->body;
  const Reply ok = s.Post(json{{"prompt", "a"}, {"max_tokens", 48}, {"temperature", 0}});
  ASSERT_EQ(ok.status, 200) << ok.raw;
  // A prompt of 1 token leaves 47 positions to feed back: at most 48 tokens.
  EXPECT_LE(ok.body["usage"]["completion_tokens"].get<int>(), 48);
  EXPECT_NE(s.Get("/metrics")
                .find("fleet_serve_requests_total{code=\"400\"} " + std::to_string(cases.size())),
            std::string::npos);
}

TEST(GptServe, HealthAndMetrics) {
  Server s;
  const json health = json::parse(s.Get("/health"));
  EXPECT_EQ(health["status"], "ok");
  EXPECT_EQ(health["context"], 48);
  ASSERT_EQ(s.Post(json{{"prompt", "ab"}, {"max_tokens", 5}, {"temperature", 0}}).status, 200);
  const std::string metrics = s.Get("/metrics");
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
  o.scheduler.max_queue = 2;
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
  EXPECT_NE(s.Get("/metrics").find("fleet_serve_queue_length 2"), std::string::npos);
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
  while (s.Get("/metrics").find("fleet_serve_requests_total{code=\"499\"} 1") ==
         std::string::npos) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no 499 in\n" << s.Get("/metrics");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Admitted after the cancel: skipped, never prefilled (only the next
  // request's 1 prompt token is counted).
  s.server().scheduler().PauseAdmission(false);
  EXPECT_EQ(s.Post(json{{"prompt", "z"}, {"max_tokens", 2}}).status, 200);
  EXPECT_NE(s.Get("/metrics").find("fleet_serve_prompt_tokens_total 1\n"), std::string::npos)
      << s.Get("/metrics");
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
  EXPECT_EQ(b.body["choices"][0]["text"], a.body["choices"][0]["text"]);
}

TEST(GptServe, BadCommandLinesAreExitStatus2WithTheReason) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--checkpoint", "x"}, "-c CONFIG is required"},
      {{"-c", "a.yaml"}, "--checkpoint DIR is required"},
      {{"-c", "a.yaml", "--checkpoint", "x", "--port", "70000"}, "--port must be an integer in"},
      {{"-c", "a.yaml", "--checkpoint", "x", "--max_batch=0"}, "--max_batch must be"},
      {{"-c", "a.yaml", "--checkpoint", "x", "--max_queue"}, "--max_queue needs a value"},
      {{"-c", "a.yaml", "--checkpoint", "x", "--batch", "4"}, "unknown flag --batch"},
  };
  for (const auto& [args, needle] : cases) {
    std::ostringstream out, err;
    EXPECT_EQ(GptServeMain(args, out, err), 2) << err.str();
    EXPECT_NE(err.str().find(needle), std::string::npos) << err.str();
    EXPECT_TRUE(out.str().empty());
  }
}

// The program: -c CONFIG --checkpoint DIR --port 0 serves the checkpoint
// (same text as the in-process server over the same parameters), and
// SIGTERM stops it with exit status 0.
TEST(GptServe, ProgramServesACheckpointUntilSigterm) {
  data::testing::TempDir dir;
  const std::string config_path = data::testing::SourcePath("configs/gpt/pretrain_gpt_tiny.yaml");
  const std::vector<std::string> overrides = {
      "-o", "Model.max_position_embeddings=48", "-o", "Model.hidden_size=32",
      "-o", "Model.num_attention_heads=4",      "-o", "Model.num_layers=2",
      "-o", "Model.ffn_hidden_size=128",        "-o", "Data.Train.dataset.max_seq_len=48",
      "-o", "Data.Eval.dataset.max_seq_len=48"};
  {
    Model m("cpu");
    trainer::Sgd sgd(&m.model->arena(), 0.1f);
    ASSERT_TRUE(
        trainer::SaveCheckpoint(dir.path() + "/" + kGptCheckpointFile, m.model->arena(), sgd).ok());
  }
  std::vector<std::string> args = {testing::BinDir() + "/gpt_serve", "-c", config_path};
  args.insert(args.end(), overrides.begin(), overrides.end());
  for (const char* a : {"--checkpoint", "", "--port", "0", "--threads", "1"}) args.push_back(a);
  args[args.size() - 5] = dir.path();
  const std::string log = dir.path() + "/serve.log";
  testing::Child child(args, {}, log);
  // Its first line says where it listens (bounded wait on the log; any
  // other first line is an error).
  std::smatch port;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::string text;
  const std::regex listening("listening on http://127.0.0.1:(\\d+)");
  while (!std::regex_search(text = testing::ReadAll(log), port, listening)) {
    ASSERT_EQ(text.find('\n'), std::string::npos) << "gpt_serve did not start:\n" << text;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "gpt_serve never listened:\n" << text;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  httplib::Client client("127.0.0.1", std::stoi(port[1]));
  client.set_read_timeout(60, 0);
  const json request = {{"prompt", "abc"}, {"max_tokens", 10}, {"temperature", 0}};
  auto r = client.Post("/v1/completions", request.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  Server in_process;
  EXPECT_EQ(json::parse(r->body)["choices"][0]["text"],
            in_process.Post(request).body["choices"][0]["text"]);
  kill(child.pid(), SIGTERM);
  const testing::Exit exit = child.Wait(std::chrono::seconds(30));
  EXPECT_TRUE(exit.exited && exit.code == 0) << testing::ReadAll(log);
}

}  // namespace
}  // namespace fleet::examples::gpt
