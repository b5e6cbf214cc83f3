// serve_bench: gpt_serve's completion tokens/s and latency with N concurrent
// streamed clients, on GPT-2's 50,257-token vocabulary, with the API's
// default sampling (temperature 1, every token) and greedy, against the same
// decoder stepped directly (no HTTP, no scheduler, no sampling) in the same
// run.
//
//   server    CompletionServer (serve/gpt_serve_app.h) in this process on a
//             free port: a GPT of --layers x --hidden (GPT-2's vocabulary and
//             tokenizer, context --context) with random weights,
//             --max_batch slots, on --threads CPU threads (or --device).
//   clients   N threads, each with its own keep-alive connection, sending
//             streamed completions (a --prompt_tokens prompt of its own,
//             max_tokens --max_tokens, stream_options.include_usage) back to
//             back for --seconds: {"prompt", "max_tokens"} alone (the API's
//             default sampling) or with temperature 0 (greedy).
//   figures   per mode and N in --clients: completion tokens/s over the wall
//             time, requests, p50/p99 (min, max) of a request's latency, and
//             the speedup over 1 client. Target: --clients' largest >= 4x one
//             client's tokens/s in both modes (one decode step serves every
//             running stream, and the rows are sampled in parallel at the
//             cost of what they keep).
//   reference the decoder alone: tokens/s of StepSlots at batch 1 and at the
//             largest N (the ceiling batching approaches), and the cost of
//             drawing one token from a 50,257-logit row, default and greedy.
//
// Before timing it checks that concurrent copies of a seeded request get
// the text it gets alone, in both modes. Exit status: 0; 1 when that check or
// the target fails; 2 bad flags or no GPT-2 vocabulary (scripts/setup.sh
// fetches it).
//
//   serve_bench [--clients=1,8] [--seconds=6] [--max_tokens=32]
//               [--prompt_tokens=32] [--hidden=512] [--layers=4] [--threads=1]
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "data/tokenizer.h"
#include "serve/gpt_serve_app.h"
#include "serve/sampling.h"
#include "trainer/kernels/gpt_kernels_factory.h"
#include "trainer/models/gpt_decoder.h"

DEFINE_string(clients, "1,8", "Concurrent streamed clients per case, comma-separated.");
DEFINE_double(seconds, 6.0, "Seconds of requests per case.");
DEFINE_int32(max_tokens, 32, "max_tokens of every request.");
DEFINE_int32(prompt_tokens, 32, "Prompt length in tokens.");
DEFINE_int32(hidden, 512, "Model width (heads of 64).");
DEFINE_int32(layers, 4, "Transformer blocks.");
DEFINE_int32(context, 256, "Model context (max_position_embeddings).");
DEFINE_int32(max_batch, 8, "gpt_serve --max_batch.");
DEFINE_int32(threads, 1, "CPU threads of the model (and of the rows' sampling).");
DEFINE_string(device, "cpu", "cpu or cuda:K.");
DEFINE_string(vocab_dir, "", "GPT-2's encoder.json and vocab.bpe (default: .cache/gpt2-bpe).");

namespace fleet::bench {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Mode {
  const char* name;
  json fields;  // added to every request
};

struct Case {
  int clients = 0;
  double tokens_per_s = 0;
  size_t requests = 0;
  Summary latency;  // microseconds
};

std::vector<int32_t> Prompt(int client) {
  std::vector<int32_t> p;
  for (int i = 0; i < FLAGS_prompt_tokens; ++i) p.push_back((client * 7919 + i * 104729) % 50000);
  return p;
}

json Request(const Mode& mode, int client) {
  json r = {{"prompt", Prompt(client)},
            {"max_tokens", FLAGS_max_tokens},
            {"stream", true},
            {"stream_options", {{"include_usage", true}}}};
  r.update(mode.fields);
  return r;
}

std::unique_ptr<httplib::Client> Connect(int port) {
  auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
  c->set_keep_alive(true);
  c->set_read_timeout(600, 0);
  return c;
}

// A streamed completion's text and token count (from the usage chunk);
// CHECK-fails on a failed request (the bench's own server: a failure is a
// bug to see, not to average).
std::pair<std::string, int64_t> Complete(httplib::Client* client, const json& request) {
  auto r = client->Post("/v1/completions", request.dump(), "application/json");
  CHECK(r) << "request failed: " << httplib::to_string(r.error());
  CHECK_EQ(r->status, 200) << r->body;
  std::string text;
  int64_t tokens = -1;
  for (absl::string_view event : absl::StrSplit(r->body, "\n\n", absl::SkipEmpty())) {
    if (!absl::ConsumePrefix(&event, "data: ") || event == "[DONE]") continue;
    const json chunk = json::parse(event);
    if (!chunk["choices"].empty()) text += chunk["choices"][0]["text"].get<std::string>();
    if (chunk["usage"].is_object()) tokens = chunk["usage"]["completion_tokens"];
  }
  CHECK_GE(tokens, 0) << "no usage chunk in " << r->body;
  return {text, tokens};
}

bool CheckBatchedEqualsAlone(int port, const Mode& mode, int copies) {
  json request = Request(mode, 0);
  request["seed"] = 7;
  auto client = Connect(port);
  const std::string alone = Complete(client.get(), request).first;
  std::vector<std::future<std::string>> together;
  for (int i = 0; i < copies; ++i) {
    together.push_back(std::async(std::launch::async, [port, &request] {
      auto c = Connect(port);
      return Complete(c.get(), request).first;
    }));
  }
  bool ok = true;
  for (auto& f : together) ok &= f.get() == alone;
  std::printf("check (%s): %d concurrent copies of a seeded request get its text alone: %s\n",
              mode.name, copies, ok ? "yes" : "NO");
  return ok;
}

Case RunClients(int port, const Mode& mode, int clients) {
  std::vector<std::vector<double>> latencies(clients);
  std::vector<int64_t> tokens(clients, 0);
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration<double>(FLAGS_seconds);
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      auto client = Connect(port);
      const json request = Request(mode, c);
      while (Clock::now() < end) {
        const auto t0 = Clock::now();
        tokens[c] += Complete(client.get(), request).second;
        latencies[c].push_back(
            std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  Case out;
  out.clients = clients;
  std::vector<double> all;
  int64_t total = 0;
  for (int c = 0; c < clients; ++c) {
    all.insert(all.end(), latencies[c].begin(), latencies[c].end());
    total += tokens[c];
  }
  out.requests = all.size();
  out.tokens_per_s = static_cast<double>(total) / wall;
  out.latency = Summarize(all);
  return out;
}

// Tokens/s of the decoder stepping `batch` slots directly (each slot
// prefilled with a prompt of its own), for about `seconds`.
double DecoderTokensPerSecond(trainer::GptModel* model, int batch, double seconds) {
  auto decoder = std::move(trainer::GptDecoder::Create(model, {.batch = batch}).value());
  std::vector<int> slots(batch);
  std::vector<int32_t> tokens(batch, 464);
  const int steps = FLAGS_max_tokens;
  int64_t done = 0;
  const auto start = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - start).count() < seconds) {
    for (int b = 0; b < batch; ++b) {
      slots[b] = b;
      CHECK(decoder->PrefillSlot(b, Prompt(b)).ok());
    }
    for (int s = 0; s < steps; ++s) CHECK(decoder->StepSlots(slots, tokens).ok());
    done += int64_t(batch) * steps;
  }
  return static_cast<double>(done) / std::chrono::duration<double>(Clock::now() - start).count();
}

// One draw from a row of the model's vocabulary: p50 microseconds.
double SamplingMicros(const serve::SamplingParams& params, const std::vector<float>& row,
                      int64_t vocab) {
  auto sampler = std::move(serve::SequenceSampler::Create(params, vocab).value());
  const auto draw = [&] { CHECK(sampler->Next(row, nullptr).ok()); };
  return Summarize(TimeEach(draw, IterationsFor(draw, 0.3))).p50;
}

void PrintCases(const Mode& mode, const std::vector<Case>& cases) {
  std::printf("\n%s sampling\n%8s %10s %9s %12s %12s %12s %12s %9s\n", mode.name, "clients",
              "tokens/s", "requests", "p50 ms", "p99 ms", "min ms", "max ms", "vs 1");
  const double one = cases.front().clients == 1 ? cases.front().tokens_per_s : 0;
  for (const Case& c : cases) {
    std::printf("%8d %10.1f %9zu %12.1f %12.1f %12.1f %12.1f %8.1fx\n", c.clients, c.tokens_per_s,
                c.requests, c.latency.p50 / 1e3, c.latency.p99 / 1e3, c.latency.min / 1e3,
                c.latency.max / 1e3, one > 0 ? c.tokens_per_s / one : 0.0);
  }
}

int Main() {
  PrintEnvironment("serve_bench");
  std::vector<int> clients;
  for (absl::string_view part : absl::StrSplit(FLAGS_clients, ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1) {
      std::fprintf(stderr, "serve_bench: --clients takes numbers >= 1, got \"%s\"\n",
                   FLAGS_clients.c_str());
      return 2;
    }
    clients.push_back(n);
  }
  std::sort(clients.begin(), clients.end());
  if (FLAGS_prompt_tokens + FLAGS_max_tokens > FLAGS_context) {
    std::fprintf(stderr, "serve_bench: --prompt_tokens + --max_tokens exceed --context\n");
    return 2;
  }
  auto tokenizer = data::MakeTokenizer("gpt2", FLAGS_vocab_dir);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "serve_bench: %s (scripts/setup.sh fetches GPT-2's vocabulary)\n",
                 tokenizer.status().ToString().c_str());
    return 2;
  }
  auto compute = trainer::CreateGptCompute(FLAGS_device, trainer::Precision::kFp32, FLAGS_threads);
  if (!compute.ok()) {
    std::fprintf(stderr, "serve_bench: %s\n", compute.status().ToString().c_str());
    return 2;
  }
  trainer::GptConfig config;
  config.vocab_size = (*tokenizer)->vocab_size();
  config.max_position_embeddings = FLAGS_context;
  config.hidden_size = FLAGS_hidden;
  config.num_attention_heads = std::max(1, FLAGS_hidden / 64);
  config.num_layers = FLAGS_layers;
  auto model = std::move(
      trainer::GptModel::Create(config, compute->backend.get(), compute->kernels.get()).value());
  // Weights large enough that greedy choices are far from ties (the checks
  // compare texts exactly).
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-0.1f, 0.1f);
  std::vector<float> params(model->arena().size());
  for (float& p : params) p = u(rng);
  CHECK(model->arena().ParamsFromHost(params).ok());
  std::printf(
      "model: L %d, C %d, NH %d, context %d, vocab %d (%.1fM parameters), device %s, "
      "%d thread(s), max_batch %d; requests: %d prompt + %d generated tokens, streamed\n",
      config.num_layers, config.hidden_size, config.num_attention_heads,
      config.max_position_embeddings, config.vocab_size, params.size() / 1e6, FLAGS_device.c_str(),
      FLAGS_threads, FLAGS_max_batch, FLAGS_prompt_tokens, FLAGS_max_tokens);

  // The references first (before the server's scheduler owns the model).
  const int widest = std::min(clients.back(), FLAGS_max_batch);
  const double ref1 = DecoderTokensPerSecond(model.get(), 1, FLAGS_seconds / 2);
  const double refn = DecoderTokensPerSecond(model.get(), widest, FLAGS_seconds / 2);
  std::printf(
      "reference: decoder alone, decode steps only: %.1f tokens/s at batch 1, %.1f at batch %d "
      "(%.1fx)\n",
      ref1, refn, widest, refn / ref1);
  std::vector<float> row(config.vocab_size);
  for (float& x : row) x = 3.0f * u(rng) / 0.1f;
  std::printf("reference: one draw from %d logits: %.1f us default sampling, %.1f us greedy\n",
              config.vocab_size, SamplingMicros({}, row, config.vocab_size),
              SamplingMicros({.temperature = 0}, row, config.vocab_size));

  serve::ServeOptions options;
  options.service.scheduler.max_batch = FLAGS_max_batch;
  options.service.scheduler.max_queue = std::max(64, clients.back());
  options.service.scheduler.sampling_pool = compute->pool.get();
  auto server = serve::CompletionServer::Start(model.get(), tokenizer->get(), serve::ChatTemplate(),
                                               {}, options);
  if (!server.ok()) {
    std::fprintf(stderr, "serve_bench: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const int port = (*server)->port();
  const std::vector<Mode> modes = {{"default", json::object()}, {"greedy", {{"temperature", 0}}}};
  bool ok = true;
  for (const Mode& mode : modes) ok &= CheckBatchedEqualsAlone(port, mode, widest);
  for (const Mode& mode : modes) {
    std::vector<Case> cases;
    for (int n : clients) cases.push_back(RunClients(port, mode, n));
    PrintCases(mode, cases);
    if (cases.front().clients == 1 && cases.size() > 1) {
      const double ratio = cases.back().tokens_per_s / cases.front().tokens_per_s;
      const bool met = ratio >= 4.0;
      std::printf("target (%s): %d streams >= 4x one stream's tokens/s: %.1fx, %s\n", mode.name,
                  cases.back().clients, ratio, met ? "met" : "NOT met");
      ok &= met;
    }
  }
  (*server)->Stop();
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace fleet::bench

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "gpt_serve's streamed tokens/s on GPT-2's vocabulary, default sampling and greedy, at 1 "
      "and 8 clients");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  return fleet::bench::Main();
}
