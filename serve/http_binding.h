// HttpBinding: an OpenAiService served by FleetPS's HTTP server
// (comm/http_server.h: libmicrohttpd, one event thread, bounded by
// construction), the one file that knows it.
//
// The server asks the service's Admit on a request's headers (a request
// without a valid key, or with a body over the limit, is refused and its
// body never read; one with a valid key makes its connection trusted), then
// hands it to Handle, which answers later from the service's threads: no
// thread waits per request, and a client that trickles bytes costs a
// socket, not a thread. A streamed answer's chunks are queued as the
// service writes them.
//
// Thread-safe: Start, then port(); Stop from one thread.
#pragma once

#include <memory>
#include <string>

#include "comm/http_server.h"
#include "comm/status.h"
#include "serve/openai_service.h"

namespace fleet::serve {

struct HttpBindingOptions {
  // Address to listen on (--host): 127.0.0.1 serves this machine only.
  std::string host = "127.0.0.1";
  // --port; 0 picks a free one (port() says which).
  int port = 0;
};

class HttpBinding {
 public:
  // Binds host:port and serves `service` (not owned; outlives the binding).
  // Unavailable when the address cannot be bound, InvalidArgument for a
  // malformed one.
  static Result<std::unique_ptr<HttpBinding>> Start(OpenAiService* service,
                                                    const HttpBindingOptions& options);
  // Stop().
  ~HttpBinding();

  int port() const { return http_->port(); }
  // Stops listening and closes every connection (503 to a request still
  // unanswered). Call after the service stopped. Idempotent.
  void Stop();

 private:
  explicit HttpBinding(std::unique_ptr<HttpServer> http) : http_(std::move(http)) {}

  std::unique_ptr<HttpServer> http_;
};

}  // namespace fleet::serve
