// gpt_serve: an HTTP server for completions from a trained GPT checkpoint.
//
//   build/bin/gpt_serve -c configs/gpt/pretrain_gpt_tiny.yaml
//       --checkpoint output/gpt_tiny --port 8000   (one command line)
//
// Endpoints (cpp-httplib):
//   POST /v1/completions   OpenAI's completions shape (serve_request.h);
//                          "stream": true answers with server-sent events
//   GET  /health           200 {"status": "ok", ...} while serving
//   GET  /metrics          Prometheus text (serve_metrics.h)
// Status codes: 200; 400 for a request the server refuses (JSON error with
// the reason); 503 when --max_queue requests already wait; 504 when a
// request did not finish within --request_timeout_s; 500 for a failure of
// the model. A streamed request whose client went away is cancelled (its
// slot freed within a token or two) and counted as 499.
//
// Concurrency: a handler thread per connection parses, submits to the
// CompletionScheduler (continuous batching, serve_scheduler.h) and waits on
// the request's channel; the scheduler thread alone runs the model.
//
// The config (-c, -o) gives the model's shape, the tokenizer and the device
// as for gpt_generate (generate_app.h); the parameters come from
// <checkpoint>/gpt.ckpt. --device cpu|cuda:K as gpt_generate.
//
// Exit status: 0 after SIGINT/SIGTERM (requests in flight fail with 503);
// 1 the model or the port could not be set up; 2 bad command line or config.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "comm/status.h"
#include "examples/gpt/serve_metrics.h"
#include "examples/gpt/serve_scheduler.h"
#include "data/tokenizer.h"
#include "trainer/models/gpt.h"

namespace httplib {
class Server;
}

namespace fleet::examples::gpt {

struct ServeOptions {
  // Address to listen on (--host): 127.0.0.1 serves this machine only;
  // 0.0.0.0 every interface (the server has no authentication).
  std::string host = "127.0.0.1";
  // --port; 0 picks a free one (port() says which).
  int port = 0;
  SchedulerOptions scheduler;
  // Largest max_tokens a request may ask for (--max_tokens); 0: the model's
  // context.
  int64_t max_tokens = 0;
  // A request not finished by then is cancelled with 504
  // (--request_timeout_s).
  std::chrono::milliseconds request_timeout{std::chrono::minutes(10)};
  // The "model" of responses (--model_name).
  std::string model_name = "gpt";
};

class CompletionServer {
 public:
  // Binds host:port and starts serving `model` with `tokenizer` (neither
  // owned; both must outlive the server; nothing else may use the model).
  // The scheduler's eot_id and vocab_limit come from the tokenizer.
  // Unavailable when the address cannot be bound; InvalidArgument for
  // options out of range or a tokenizer whose vocabulary exceeds the model's.
  static Result<std::unique_ptr<CompletionServer>> Start(trainer::GptModel* model,
                                                         const data::Tokenizer* tokenizer,
                                                         const ServeOptions& options);
  // Stop().
  ~CompletionServer();

  int port() const { return port_; }
  CompletionScheduler& scheduler() { return *scheduler_; }
  ServeMetrics& metrics() { return metrics_; }

  // Fails the requests in flight with 503, stops listening and joins the
  // threads. Idempotent; call from one thread.
  void Stop();

 private:
  CompletionServer(trainer::GptModel* model, const data::Tokenizer* tokenizer,
                   const ServeOptions& options);
  void Routes();

  // Fixed after Start.
  trainer::GptModel* const model_;
  const data::Tokenizer* const tokenizer_;
  const ServeOptions options_;
  CompletionLimits limits_;
  int port_ = 0;

  // Own their synchronisation.
  ServeMetrics metrics_;
  std::unique_ptr<CompletionScheduler> scheduler_;
  std::unique_ptr<httplib::Server> http_;
  std::atomic<uint64_t> next_id_{1};
  std::thread listener_;
};

// The whole program over `args` (argv without argv[0]): parses the command
// line, loads the model, serves until SIGINT or SIGTERM. Prints
// "gpt_serve: listening on http://HOST:PORT" to `err` once serving. Returns
// the exit status above.
int GptServeMain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace fleet::examples::gpt
