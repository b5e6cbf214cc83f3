// HttpBinding: an OpenAiService served over cpp-httplib, the one file that
// knows the HTTP library (moving to another server means rewriting this
// file alone).
//
// cpp-httplib 0.11 serves each connection on a thread of its pool and
// hands a handler a whole request, so this binding
//   * calls the service's Admit from httplib's pre-routing hook, on the
//     headers before the body is read (a request without a valid key, or
//     with a body over the limit, is refused unread);
//   * waits on the connection's thread for the service's answer (at most
//     request_timeout + 30 s; the service answers every request within its
//     request_timeout), then writes it, or copies a streamed answer's
//     chunks as they come;
//   * writes the stream's heartbeat after 250 ms without a chunk: httplib
//     tells a handler that its client left only when a write fails.
// A non-streamed request whose client left runs to its end (httplib 0.11
// does not tell the handler).
//
// Thread-safe: Start, then port(); Stop from one thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "comm/status.h"
#include "serve/openai_service.h"

namespace httplib {
class Server;
}

namespace fleet::serve {

struct HttpBindingOptions {
  // Address to listen on (--host): 127.0.0.1 serves this machine only.
  std::string host = "127.0.0.1";
  // --port; 0 picks a free one (port() says which).
  int port = 0;
  // Connection threads: every request being answered holds one (running,
  // queued, and the probes beside them).
  int threads = 96;
  // The longest a request may legitimately wait for its answer (the
  // service's request timeout); a thread waits this plus 30 s at most.
  std::chrono::milliseconds answer_timeout{std::chrono::minutes(10)};
  // Largest request body (httplib refuses larger ones with 413 itself,
  // chunked bodies included).
  uint64_t max_body_bytes = 1 << 20;
};

class HttpBinding {
 public:
  // Binds host:port and serves `service` (not owned; outlives the binding).
  // Unavailable when the address cannot be bound.
  static Result<std::unique_ptr<HttpBinding>> Start(OpenAiService* service,
                                                    const HttpBindingOptions& options);
  // Stop().
  ~HttpBinding();

  int port() const { return port_; }
  // Stops listening and joins the connection threads. Call after the
  // service stopped (its answers release the threads). Idempotent.
  void Stop();

 private:
  HttpBinding(OpenAiService* service, const HttpBindingOptions& options);
  void Routes();

  OpenAiService* const service_;
  const HttpBindingOptions options_;
  std::unique_ptr<httplib::Server> http_;
  int port_ = 0;
  std::thread listener_;
};

}  // namespace fleet::serve
