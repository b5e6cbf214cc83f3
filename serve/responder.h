// How the serving engine answers a request, from any thread and whenever it
// is ready: Send a whole response, or Stream a head and then chunks. The
// engine (serve/openai_service.h) takes comm/http_server.h's plain
// HttpRequest and answers through a Responder; serve/http_binding.cc makes
// one of the server's HttpReply.
//
// Thread safety: a Responder and its ResponseStream are called from any
// thread (implementations synchronise).
#pragma once

#include <memory>
#include <string_view>

#include "comm/http_server.h"

namespace fleet::serve {

// A chunked answer being written.
class ResponseStream {
 public:
  virtual ~ResponseStream() = default;
  // Queues `chunk` for the client; false (nothing queued) once the client
  // is gone or the server stops. Never blocks.
  virtual bool Write(std::string_view chunk) = 0;
  // Ends the answer after what was written. Idempotent.
  virtual void Close() = 0;
  // False once the client is gone or the server stops.
  virtual bool open() const = 0;
};

// The answer to one request: Send or Stream, exactly once, from any thread.
class Responder {
 public:
  virtual ~Responder() = default;
  virtual void Send(HttpResponse response) = 0;
  // Starts a chunked answer with `head`'s status, type and headers (its
  // body ignored) and returns the stream to write it through.
  virtual std::shared_ptr<ResponseStream> Stream(HttpResponse head) = 0;
  // False once the client is gone or the server stops.
  virtual bool open() const = 0;
};

}  // namespace fleet::serve
