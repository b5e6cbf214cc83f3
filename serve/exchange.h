// What the serving engine and an HTTP server hand each other, in plain
// values: a request in (method, path, headers, body), an answer out (a
// whole response, or a head and then chunks), given once from any thread.
// The engine (serve/openai_service.h) never sees the HTTP server; binding
// it to one is a small adapter (serve/http_binding.h, comm/http_server.h's).
//
// Thread safety: ApiRequest and ApiResponse are plain values; a Responder
// and its ResponseStream are called from any thread (implementations
// synchronise).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fleet::serve {

struct ApiRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // without the query ("/v1/completions")
  // Header fields as received, names as sent.
  std::vector<std::pair<std::string, std::string>> headers;
  // The declared body length; nullopt for a chunked body or none.
  std::optional<uint64_t> content_length;
  std::string body;  // empty while the request is being admitted

  // The value of the first header `name` (ASCII case-insensitive).
  std::optional<std::string_view> Header(std::string_view name) const;
};

struct ApiResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

// What the engine decides on a request's headers, before its body is read.
struct ApiAdmission {
  // Set: answer this at once and never read the body.
  std::optional<ApiResponse> refusal;
  // The most body bytes the request may send (more: 413 before reading).
  uint64_t max_body_bytes = 0;
  // The request proved it holds an API key (a server may favour its
  // connection over strangers').
  bool trusted = false;
};

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
  virtual void Send(ApiResponse response) = 0;
  // Starts a chunked answer with `head`'s status, type and headers (its
  // body ignored) and returns the stream to write it through.
  virtual std::shared_ptr<ResponseStream> Stream(ApiResponse head) = 0;
  // False once the client is gone or the server stops.
  virtual bool open() const = 0;
};

}  // namespace fleet::serve
