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
//             the speedup over 1 client; --rounds rounds alternate every
//             case, so a change of the machine's load falls on all alike. Target: --clients'
//             largest >= 4x one client's tokens/s in both modes (one decode step serves every
//             running stream, and the rows are sampled in parallel at the
//             cost of what they keep).
//   reference the decoder alone (the same weights on a compute of its own,
//             in the same rounds): tokens/s of prefill and StepSlots at batch 1
//             and at the largest N (the ceiling batching approaches), and
//             the cost of drawing one token from a 50,257-logit row, default
//             and greedy.
//
// Before timing it checks that concurrent copies of a seeded request get
// the text it gets alone, in both modes. Exit status: 0; 1 when that check or
// the target fails; 2 bad flags or no GPT-2 vocabulary (scripts/setup.sh
// fetches it).
//
//   serve_bench [--clients=1,8] [--seconds=12] [--rounds=3] [--max_tokens=32]
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
DEFINE_double(seconds, 12.0, "Seconds of requests per case, over all rounds.");
DEFINE_int32(rounds, 3, "Rounds, each running every case for seconds / rounds in turn.");
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

// One mode and client count, summed over the rounds.
struct Case {
  int clients = 0;
  int64_t tokens = 0;
  double seconds = 0;
  std::vector<double> latencies = {};  // microseconds, one per request
  double tokens_per_s() const { return seconds > 0 ? static_cast<double>(tokens) / seconds : 0; }
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

// `c->clients` clients send requests back to back for `seconds`; their
// tokens, time and latencies are added to *c.
void RunClients(int port, const Mode& mode, double seconds, Case* c) {
  const int clients = c->clients;
  std::vector<std::vector<double>> latencies(clients);
  std::vector<int64_t> tokens(clients, 0);
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration<double>(seconds);
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      auto client = Connect(port);
      const json request = Request(mode, i);
      while (Clock::now() < end) {
        const auto t0 = Clock::now();
        tokens[i] += Complete(client.get(), request).second;
        latencies[i].push_back(
            std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  c->seconds += std::chrono::duration<double>(Clock::now() - start).count();
  for (int i = 0; i < clients; ++i) {
    c->latencies.insert(c->latencies.end(), latencies[i].begin(), latencies[i].end());
    c->tokens += tokens[i];
  }
}

// The decoder stepping `c->clients` slots directly (each slot prefilled
// with a prompt of its own) for about `seconds`; tokens and time added to *c.
void StepDecoder(trainer::GptModel* model, double seconds, Case* c) {
  const int batch = c->clients;
  auto decoder = std::move(trainer::GptDecoder::Create(model, {.batch = batch}).value());
  std::vector<int> slots(batch);
  std::vector<int32_t> tokens(batch, 464);
  const int steps = FLAGS_max_tokens;
  const auto start = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - start).count() < seconds) {
    for (int b = 0; b < batch; ++b) {
      slots[b] = b;
      CHECK(decoder->PrefillSlot(b, Prompt(b)).ok());
    }
    for (int s = 0; s < steps; ++s) CHECK(decoder->StepSlots(slots, tokens).ok());
    c->tokens += int64_t(batch) * steps;
  }
  c->seconds += std::chrono::duration<double>(Clock::now() - start).count();
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
  const double one = cases.front().clients == 1 ? cases.front().tokens_per_s() : 0;
  for (const Case& c : cases) {
    const Summary latency = Summarize(c.latencies);
    std::printf("%8d %10.1f %9zu %12.1f %12.1f %12.1f %12.1f %8.1fx\n", c.clients, c.tokens_per_s(),
                c.latencies.size(), latency.p50 / 1e3, latency.p99 / 1e3, latency.min / 1e3,
                latency.max / 1e3, one > 0 ? c.tokens_per_s() / one : 0.0);
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
  if (FLAGS_rounds < 1 || !(FLAGS_seconds > 0)) {
    std::fprintf(stderr, "serve_bench: --rounds must be >= 1 and --seconds > 0\n");
    return 2;
  }
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

  // The reference: the same weights on a compute of their own (the
  // server's scheduler owns its model), stepped directly between the
  // server's cases.
  auto reference_compute =
      trainer::CreateGptCompute(FLAGS_device, trainer::Precision::kFp32, FLAGS_threads);
  CHECK(reference_compute.ok()) << reference_compute.status().ToString();
  auto reference = std::move(trainer::GptModel::Create(config, reference_compute->backend.get(),
                                                       reference_compute->kernels.get())
                                 .value());
  CHECK(reference->arena().ParamsFromHost(params).ok());
  const int widest = std::min(clients.back(), FLAGS_max_batch);
  std::vector<Case> decoder_alone = {{.clients = 1}, {.clients = widest}};
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
  // Rounds alternate every mode and client count, so that a change of the
  // machine's load during the run falls on all of them alike.
  std::vector<std::vector<Case>> cases(modes.size());
  for (auto& per_mode : cases) {
    for (int n : clients) per_mode.push_back({.clients = n});
  }
  const double slice = FLAGS_seconds / FLAGS_rounds;
  for (int round = 0; round < FLAGS_rounds; ++round) {
    for (Case& c : decoder_alone) StepDecoder(reference.get(), slice, &c);
    for (size_t m = 0; m < modes.size(); ++m) {
      for (Case& c : cases[m]) RunClients(port, modes[m], slice, &c);
    }
  }
  std::printf(
      "\nreference: the decoder alone, prefill and decode steps, no sampling: %.1f tokens/s at "
      "batch 1, %.1f at batch %d (%.1fx)\n",
      decoder_alone[0].tokens_per_s(), decoder_alone[1].tokens_per_s(), widest,
      decoder_alone[1].tokens_per_s() / decoder_alone[0].tokens_per_s());
  for (size_t m = 0; m < modes.size(); ++m) {
    PrintCases(modes[m], cases[m]);
    const Case &first = cases[m].front(), &last = cases[m].back();
    if (first.clients == 1 && cases[m].size() > 1) {
      const double ratio = last.tokens_per_s() / first.tokens_per_s();
      const bool met = ratio >= 4.0;
      std::printf("target (%s): %d streams >= 4x one stream's tokens/s: %.1fx, %s\n", modes[m].name,
                  last.clients, ratio, met ? "met" : "NOT met");
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
