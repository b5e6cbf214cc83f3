// gpt_serve: an OpenAI-compatible HTTP server for a trained GPT checkpoint,
// and several LoRA fine-tunes of it at once.
//
//   build/bin/gpt_serve -c configs/gpt/pretrain_gpt_tiny.yaml
//       --checkpoint output/gpt_tiny --port 8000 [--lora NAME=DIR ...]
//       [--api_key_file FILE]   (one command line)
//
// CompletionServer is the engine (OpenAiService: routes, status codes and
// threads in serve/openai_service.h) on an HTTP server (serve/http_binding.h).
//
// The config (-c, -o) gives the model's shape, the tokenizer, the device as
// for gpt_generate and the chat template (Serving.chat_template,
// serve/chat_template.h); the parameters come from <checkpoint>/gpt.ckpt
// (or a Hugging Face GPT-2 directory). Each --lora NAME=DIR serves the LoRA
// output directory DIR (gpt_lora.ckpt, gpt_lora.json) over that base as the
// model id NAME: it must have been trained over exactly these weights
// (the manifest's SHA-256). Model.lora of the config is then ignored (each
// adapter's manifest gives its rank, alpha and targets).
// --api_key_file FILE (mode 600, one key a line) makes every route but
// /health need "Authorization: Bearer <key>".
//
// Exit status: 0 after SIGINT/SIGTERM (requests in flight fail with 503);
// 1 the model, an adapter, the key file or the port could not be set up; 2
// bad command line or config.
#pragma once

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "comm/status.h"
#include "data/tokenizer.h"
#include "serve/chat_template.h"
#include "serve/http_binding.h"
#include "serve/openai_service.h"
#include "trainer/models/gpt.h"

namespace fleet::serve {

struct ServeOptions {
  // Address to listen on (--host): 127.0.0.1 serves this machine only;
  // 0.0.0.0 every interface (give --api_key_file then).
  std::string host = "127.0.0.1";
  // --port; 0 picks a free one (port() says which).
  int port = 0;
  ServiceOptions service;
};

class CompletionServer {
 public:
  // Binds host:port and serves `model` with `tokenizer` and `adapters`
  // (none owned; all outlive the server; nothing else may use the model).
  // Errors: those of OpenAiService::Create and HttpBinding::Start.
  static Result<std::unique_ptr<CompletionServer>> Start(trainer::GptModel* model,
                                                         const data::Tokenizer* tokenizer,
                                                         ChatTemplate chat,
                                                         std::vector<ServedAdapter> adapters,
                                                         const ServeOptions& options);
  // Stop().
  ~CompletionServer();

  int port() const { return http_->port(); }
  OpenAiService& service() { return *service_; }
  CompletionScheduler& scheduler() { return service_->scheduler(); }
  ServeMetrics& metrics() { return service_->metrics(); }

  // Fails the requests in flight with 503, stops listening and joins the
  // threads. Idempotent; call from one thread.
  void Stop();

 private:
  std::unique_ptr<OpenAiService> service_;
  std::unique_ptr<HttpBinding> http_;
};

// The whole program over `args` (argv without argv[0]): parses the command
// line, loads the model and adapters, serves until SIGINT or SIGTERM.
// Prints "gpt_serve: listening on http://HOST:PORT" to `err` once serving.
// Returns the exit status above.
int GptServeMain(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace fleet::serve
