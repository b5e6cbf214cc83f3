// OpenAiService: gpt_serve's HTTP API over a CompletionScheduler, in terms
// of plain requests and responders (serve/responder.h), so any HTTP server
// can carry it (serve/http_binding.h binds comm/http_server.h).
//
// Routes:
//   POST /v1/completions        OpenAI's completions (serve/openai_api.h)
//   POST /v1/chat/completions   OpenAI's chat completions (messages turned
//                               into a prompt by the chat template)
//   GET  /v1/models             the served model ids: the base's
//                               (--model_name), then each LoRA adapter's
//   GET  /v1/models/{id}        one of them
//   GET  /health                200 {"status": "ok", ...}; never needs a key
//   GET  /metrics               Prometheus text (serve/metrics.h)
// A request's "model" picks the base or one adapter; any other is a 404
// (code "model_not_found"), absent means the base. Other paths are 404.
//
// API keys: with ServiceOptions::api_keys set, every route but /health
// needs "Authorization: Bearer <key>" (401, code "invalid_api_key",
// otherwise), /metrics included: the job's rule for its KV store's
// /metrics (signed like every request; open only with auth off). Checked
// on the headers (Admit) before any body byte is read, in constant time.
//
// Status codes: 200; 400 a request the server refuses (the reason names the
// key); 401; 404; 413 a body over max_body_bytes; 503 when the queue is
// full or the server stops; 504 when a request did not finish within
// request_timeout; 500 a failure of the model. Errors have OpenAI's shape
// {"error": {message, type, param, code}}. A streamed request whose client
// went away is cancelled (its slots freed within a token or two) and
// counted as 499: a stream silent for 250 ms gets a keep-alive comment
// (": keep-alive", which clients skip), because a server learns that a
// client left only when a write fails. A non-streamed request whose client
// left runs to its end. Every answer but the probes' 200s is counted in
// fleet_serve_requests_total.
//
// Threads: Admit and Handle never block (an HTTP server's event thread may
// call them). Parsing, tokenizing, and turning generated tokens into text
// and JSON run on the service's `worker_threads`, woken by the scheduler
// when a request has news; the scheduler thread alone runs the model; a
// ticker thread sends the keep-alives. No thread waits per request.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/status.h"
#include "comm/thread_pool.h"
#include "data/tokenizer.h"
#include "serve/chat_template.h"
#include "serve/metrics.h"
#include "serve/openai_api.h"
#include "serve/responder.h"
#include "serve/scheduler.h"
#include "trainer/models/gpt.h"
#include "trainer/models/gpt_lora.h"

namespace fleet::serve {

struct ServiceOptions {
  SchedulerOptions scheduler;
  // Largest max_tokens a request may ask for (--max_tokens); 0: the model's
  // context.
  int64_t max_tokens = 0;
  // A request not finished by then gets 504 (--request_timeout_s).
  std::chrono::milliseconds request_timeout{std::chrono::minutes(10)};
  // The base model's id (--model_name): what /v1/models lists first and
  // responses name when a request asked for the base.
  std::string model_name = "gpt";
  // Keys a request may present as "Authorization: Bearer <key>"
  // (--api_key_file); empty: no key needed (a local server only).
  std::vector<std::string> api_keys;
  // Largest request body; a larger Content-Length gets 413 unread.
  uint64_t max_body_bytes = 1 << 20;
  // Threads that parse requests and build responses. 2 keep up with
  // hundreds of streamed tokens/s; more only for many small requests.
  int worker_threads = 2;
};

// A LoRA adapter served under a model id (not owned; outlives the service).
struct ServedAdapter {
  std::string name;
  trainer::GptLoraAdapters* adapters = nullptr;
};

class OpenAiService {
 public:
  // Serves `model` with `tokenizer` (neither owned; both outlive the
  // service; nothing else may use the model) and `adapters`. The
  // scheduler's eot_id and vocab_limit come from the tokenizer, its
  // max_lora_rank from the adapters. InvalidArgument for options out of
  // range, adapter names that repeat or equal model_name, or a tokenizer
  // whose vocabulary exceeds the model's.
  static Result<std::unique_ptr<OpenAiService>> Create(trainer::GptModel* model,
                                                       const data::Tokenizer* tokenizer,
                                                       ChatTemplate chat,
                                                       std::vector<ServedAdapter> adapters,
                                                       const ServiceOptions& options);
  // Stop().
  ~OpenAiService();

  // Decides on a request's headers (its body not read yet): a refusal (401
  // without a valid key, 413 for a body over max_body_bytes, both counted),
  // or the body budget. Never blocks.
  HttpAdmission Admit(const HttpRequest& head);
  // Answers `request` through `responder`, now or later from the service's
  // threads. Never blocks. REQUIRES: Admit did not refuse it.
  void Handle(HttpRequest request, std::shared_ptr<Responder> responder);
  // Counts an answer the transport gave itself (e.g. its own 413 or 400).
  void CountResponse(int http_status) { metrics_.RequestDone(http_status); }

  // Fails the requests in flight with 503 and stops the scheduler; waits
  // (up to 30 s) until every request in flight answered; later requests get
  // 503. Idempotent; call from one thread.
  void Stop();

  CompletionScheduler& scheduler() { return *scheduler_; }
  ServeMetrics& metrics() { return metrics_; }
  // The model ids served, the base's first.
  std::vector<std::string> model_ids() const;

 private:
  class Generation;

  OpenAiService(trainer::GptModel* model, const data::Tokenizer* tokenizer, ChatTemplate chat,
                std::vector<ServedAdapter> adapters, const ServiceOptions& options);
  void Route(HttpRequest request, const std::shared_ptr<Responder>& responder);
  // Parses, resolves the model and submits a generation (a worker thread).
  void Generate(Endpoint endpoint, const HttpRequest& request,
                const std::shared_ptr<Responder>& responder,
                std::chrono::steady_clock::time_point arrival);
  void Reply(const std::shared_ptr<Responder>& responder, int status, std::string body,
             std::string content_type = "application/json");
  void ReplyError(const std::shared_ptr<Responder>& responder, const Status& status,
                  std::string_view param = {}, std::string_view code = {});
  void Finished(uint64_t id);
  // The ticker thread: keep-alive comments into quiet streams.
  void KeepStreamsAlive();

  // Fixed after Create.
  trainer::GptModel* const model_;
  const data::Tokenizer* const tokenizer_;
  const ChatTemplate chat_;
  const std::vector<ServedAdapter> adapters_;
  const ServiceOptions options_;
  ApiLimits limits_;
  const int64_t created_;  // unix seconds: /v1/models' "created"

  // Own their synchronisation.
  ServeMetrics metrics_;
  std::unique_ptr<CompletionScheduler> scheduler_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<bool> stopped_{false};

  // Requests in flight (each owned here until it answered).
  std::mutex mu_;
  std::condition_variable idle_cv_;                            // in_flight_ became empty
  std::condition_variable ticker_cv_;                          // Stop wakes the ticker
  std::map<uint64_t, std::shared_ptr<Generation>> in_flight_;  // guarded by mu_

  // How often the ticker looks for streams that wrote nothing since.
  static constexpr std::chrono::milliseconds kKeepAliveEvery{250};
  // Destroyed before everything above (declared after it): a task still
  // queued when the service goes away may touch any of it.
  std::unique_ptr<ThreadPool> workers_;
  std::thread ticker_;  // last: starts after every member above exists
};

}  // namespace fleet::serve
