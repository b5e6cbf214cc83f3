// serve_bench: gpt_serve's throughput and latency with N concurrent clients,
// against the same decoder stepped directly (no HTTP, no scheduler) in the
// same run.
//
//   server    CompletionServer (examples/gpt/serve_app.h) in this process on
//             a free port: a GPT of --layers x --hidden (byte vocabulary,
//             context --context) with random weights, --max_batch slots, on
//             --threads CPU threads (or --device cuda:K).
//   clients   N threads, each with its own keep-alive connection, sending
//             greedy completions (a --prompt_tokens prompt of its own,
//             max_tokens --max_tokens) back to back for --seconds.
//   figures   per N in --clients: completion tokens/s over the wall time,
//             requests, and p50/p99 (min, max) of a request's latency;
//             then the speedup of each N over 1 client. Target: 16 clients
//             >= 4x one client's tokens/s (continuous batching: one decode
//             step serves every running request).
//   reference the decoder alone: tokens/s of StepSlots at batch 1 and at
//             the largest N (the ceiling the server approaches).
//
// Before timing it checks that 16 concurrent copies of one request each get
// the text the request gets alone. Exit status: 0, or 1 when that check or
// the 4x target fails.
//
//   serve_bench [--clients=1,4,16] [--seconds=6] [--max_tokens=32]
//               [--prompt_tokens=32] [--hidden=512] [--layers=4] [--threads=1]
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
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
#include "examples/gpt/serve_app.h"
#include "trainer/kernels/gpt_kernels_factory.h"
#include "trainer/models/gpt_decoder.h"

DEFINE_string(clients, "1,4,16", "Concurrent clients per case, comma-separated.");
DEFINE_double(seconds, 6.0, "Seconds of requests per case.");
DEFINE_int32(max_tokens, 32, "max_tokens of every request.");
DEFINE_int32(prompt_tokens, 32, "Prompt length in tokens (bytes).");
DEFINE_int32(hidden, 512, "Model width (heads of 64).");
DEFINE_int32(layers, 4, "Transformer blocks.");
DEFINE_int32(context, 256, "Model context (max_position_embeddings).");
DEFINE_int32(max_batch, 16, "gpt_serve --max_batch.");
DEFINE_int32(threads, 1, "CPU threads of the model.");
DEFINE_string(device, "cpu", "cpu or cuda:K.");

namespace fleet::bench {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Case {
  int clients = 0;
  double tokens_per_s = 0;
  size_t requests = 0;
  Summary latency;  // microseconds
};

std::string Prompt(int client) {
  std::string p;
  for (int i = 0; i < FLAGS_prompt_tokens; ++i) p += static_cast<char>('a' + (client * 7 + i) % 26);
  return p;
}

json Request(int client) {
  return {{"prompt", Prompt(client)}, {"max_tokens", FLAGS_max_tokens}, {"temperature", 0}};
}

std::unique_ptr<httplib::Client> Connect(int port) {
  auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
  c->set_keep_alive(true);
  c->set_read_timeout(600, 0);
  return c;
}

// The completion's text and token count; CHECK-fails on a failed request
// (the bench's own server: a failure is a bug to see, not to average).
std::pair<std::string, int64_t> Complete(httplib::Client* client, const json& request) {
  auto r = client->Post("/v1/completions", request.dump(), "application/json");
  CHECK(r) << "request failed: " << httplib::to_string(r.error());
  CHECK_EQ(r->status, 200) << r->body;
  const json body = json::parse(r->body);
  return {body["choices"][0]["text"], body["usage"]["completion_tokens"]};
}

bool CheckBatchedEqualsAlone(int port) {
  auto client = Connect(port);
  const std::string alone = Complete(client.get(), Request(0)).first;
  std::vector<std::future<std::string>> together;
  for (int i = 0; i < 16; ++i) {
    together.push_back(std::async(std::launch::async, [port] {
      auto c = Connect(port);
      return Complete(c.get(), Request(0)).first;
    }));
  }
  bool ok = true;
  for (auto& f : together) ok &= f.get() == alone;
  std::printf("check: 16 concurrent copies of a request get its text alone: %s\n\n",
              ok ? "yes" : "NO");
  return ok;
}

Case RunClients(int port, int clients) {
  std::vector<std::vector<double>> latencies(clients);
  std::vector<int64_t> tokens(clients, 0);
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration<double>(FLAGS_seconds);
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      auto client = Connect(port);
      const json request = Request(c);
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
  std::vector<int32_t> tokens(batch, 'x');
  const int steps = FLAGS_max_tokens;
  int64_t done = 0;
  const auto start = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - start).count() < seconds) {
    for (int b = 0; b < batch; ++b) {
      slots[b] = b;
      const std::string p = Prompt(b);
      CHECK(decoder->PrefillSlot(b, std::vector<int32_t>(p.begin(), p.end())).ok());
    }
    for (int s = 0; s < steps; ++s) CHECK(decoder->StepSlots(slots, tokens).ok());
    done += int64_t(batch) * steps;
  }
  return static_cast<double>(done) / std::chrono::duration<double>(Clock::now() - start).count();
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
  if (FLAGS_prompt_tokens + FLAGS_max_tokens > FLAGS_context) {
    std::fprintf(stderr, "serve_bench: --prompt_tokens + --max_tokens exceed --context\n");
    return 2;
  }
  auto compute = trainer::CreateGptCompute(FLAGS_device, trainer::Precision::kFp32, FLAGS_threads);
  if (!compute.ok()) {
    std::fprintf(stderr, "serve_bench: %s\n", compute.status().ToString().c_str());
    return 2;
  }
  trainer::GptConfig config;
  config.vocab_size = 257;
  config.max_position_embeddings = FLAGS_context;
  config.hidden_size = FLAGS_hidden;
  config.num_attention_heads = std::max(1, FLAGS_hidden / 64);
  config.num_layers = FLAGS_layers;
  auto model = std::move(
      trainer::GptModel::Create(config, compute->backend.get(), compute->kernels.get()).value());
  // Weights large enough that greedy choices are far from ties (the check
  // above compares texts exactly).
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-0.1f, 0.1f);
  std::vector<float> params(model->arena().size());
  for (float& p : params) p = u(rng);
  CHECK(model->arena().ParamsFromHost(params).ok());
  std::printf(
      "model: L %d, C %d, NH %d, context %d, vocab 257 (%.1fM parameters), device %s, "
      "%d thread(s); requests: %d prompt + %d generated tokens, greedy\n",
      config.num_layers, config.hidden_size, config.num_attention_heads,
      config.max_position_embeddings, params.size() / 1e6, FLAGS_device.c_str(), FLAGS_threads,
      FLAGS_prompt_tokens, FLAGS_max_tokens);

  // The reference first: the decoder alone (before the server's scheduler
  // owns the model).
  const int widest = *std::max_element(clients.begin(), clients.end());
  const int ref_batch = std::min(widest, FLAGS_max_batch);
  const double ref1 = DecoderTokensPerSecond(model.get(), 1, FLAGS_seconds / 2);
  const double refn = DecoderTokensPerSecond(model.get(), ref_batch, FLAGS_seconds / 2);
  std::printf(
      "reference: decoder alone, decode steps only: %.0f tokens/s at batch 1, %.0f at "
      "batch %d (%.1fx)\n",
      ref1, refn, ref_batch, refn / ref1);

  data::ByteTokenizer tokenizer;
  examples::gpt::ServeOptions options;
  options.scheduler.max_batch = FLAGS_max_batch;
  options.scheduler.max_queue = std::max(64, widest);
  auto server = examples::gpt::CompletionServer::Start(model.get(), &tokenizer, options);
  if (!server.ok()) {
    std::fprintf(stderr, "serve_bench: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const int port = (*server)->port();
  const bool checked = CheckBatchedEqualsAlone(port);

  std::printf("%8s %10s %9s %12s %12s %12s %12s %9s\n", "clients", "tokens/s", "requests", "p50 ms",
              "p99 ms", "min ms", "max ms", "vs 1");
  std::vector<Case> cases;
  double one = 0;
  for (int n : clients) {
    const Case c = RunClients(port, n);
    if (n == 1) one = c.tokens_per_s;
    cases.push_back(c);
    std::printf("%8d %10.0f %9zu %12.1f %12.1f %12.1f %12.1f %8.1fx\n", n, c.tokens_per_s,
                c.requests, c.latency.p50 / 1e3, c.latency.p99 / 1e3, c.latency.min / 1e3,
                c.latency.max / 1e3, one > 0 ? c.tokens_per_s / one : 0.0);
  }
  bool target_met = true;
  for (const Case& c : cases) {
    if (c.clients == 16 && one > 0) {
      target_met = c.tokens_per_s >= 4 * one;
      std::printf("\ntarget: 16 clients >= 4x one client's tokens/s: %.1fx, %s\n",
                  c.tokens_per_s / one, target_met ? "met" : "NOT met");
    }
  }
  (*server)->Stop();
  return checked && target_met ? 0 : 1;
}

}  // namespace
}  // namespace fleet::bench

int main(int argc, char** argv) {
  gflags::SetUsageMessage("gpt_serve throughput and latency at 1, 4 and 16 clients");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  return fleet::bench::Main();
}
