// The one HTTP server of FleetPS (the KV store in fleetrun, gpt_serve's API),
// over libmicrohttpd, with every resource a stranger can make it hold bounded
// by construction:
//
//  * one event thread serves every connection (epoll), so a connection that
//    trickles bytes costs a socket and its buffer, never a thread;
//  * a request's line and headers must fit `max_header_bytes` (the
//    connection's whole buffer: an endless header line gets 431, unread);
//  * a request is admitted on its headers (`admit`) before any body byte is
//    read: a refusal is answered at once and the body never read; an
//    admitted body is read up to the budget the admission gave it, and the
//    bodies of untrusted requests being read at once share one budget
//    (`max_untrusted_body_bytes`: 503 beyond it);
//  * connections are untrusted until one of their requests is admitted as
//    trusted (e.g. it carries the job's credential). An untrusted connection
//    must deliver each whole request within `untrusted_request_timeout` of
//    connecting or of its previous answer, and at most
//    `max_untrusted_connections` (in total) and
//    `max_untrusted_connections_per_peer` (from one address) are held: past
//    either, the oldest idle untrusted connection is closed to make room, so
//    strangers can never take the places a job's own clients need;
//  * trusted connections are closed after `idle_timeout` without traffic.
//
// Handlers never block the event thread: `handle` answers through its
// HttpReply at once, or keeps the reply and answers later from any thread
// (a long poll, a queued generation), or streams chunks through an
// HttpStream. A reply dropped unanswered answers 500, so a client is never
// left waiting by a handler's mistake; Stop() answers 503 to every request
// still waiting.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/status.h"

namespace fleet {

// One request. Until `admit` returns, `body` is empty.
struct HttpRequest {
  std::string method;          // "GET", "PUT", ...
  std::string target;          // the request target exactly as sent ("/a%20b?x=1")
  std::string path;            // target's path, percent-decoded ("/a b")
  std::string remote_address;  // the peer's IP address ("127.0.0.1")
  // Header fields in the order received, names as sent.
  std::vector<std::pair<std::string, std::string>> headers;
  // The declared body length; nullopt for a chunked body (or none).
  std::optional<uint64_t> content_length;
  std::string body;

  // The value of the first header `name` (case-insensitive), if present.
  std::optional<std::string_view> Header(std::string_view name) const;
  // The percent-decoded value of query parameter `name` ('+' is a space),
  // if the target has it.
  std::optional<std::string> Query(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

// What `admit` decides on a request's headers.
struct HttpAdmission {
  // Set: answer this now; the body is never read.
  std::optional<HttpResponse> refusal;
  // The most body bytes this request may send (a larger Content-Length is
  // refused with 413 before any is read; a chunked body past it closes the
  // connection).
  uint64_t max_body_bytes = 0;
  // The request proved it belongs (e.g. the job's credential): its
  // connection is trusted from now on (see the top of this file).
  bool trusted = false;
};

class HttpServer;
struct HttpExchange;

// A chunked response being written. Thread-safe; shared by the writer and
// the server.
class HttpStream {
 public:
  explicit HttpStream(std::shared_ptr<HttpExchange> exchange);
  // Queues `chunk` for the client. False (and nothing queued) once the
  // client is gone, the stream closed or the server stopping: the writer
  // should stop producing. Never blocks.
  bool Write(std::string_view chunk);
  // Ends the response after what was written. Idempotent.
  void Close();
  // False once the client is gone or the server stopping.
  bool open() const;

 private:
  std::shared_ptr<HttpExchange> exchange_;
};

// The answer to one request, given once from any thread. Move-only; a
// reply destroyed unanswered answers 500.
class HttpReply {
 public:
  explicit HttpReply(std::shared_ptr<HttpExchange> exchange);
  HttpReply(HttpReply&&) noexcept;
  HttpReply& operator=(HttpReply&&) noexcept;
  HttpReply(const HttpReply&) = delete;
  HttpReply& operator=(const HttpReply&) = delete;
  ~HttpReply();

  // Answers. REQUIRES: neither Send nor Stream was called before.
  void Send(HttpResponse response);
  // Starts a chunked answer with `head`'s status, type and headers (its body
  // is ignored) and returns the stream to write it through.
  // REQUIRES: neither Send nor Stream was called before.
  std::shared_ptr<HttpStream> Stream(HttpResponse head);
  // False once the client is gone or the server stopping (the answer would
  // be dropped).
  bool open() const;

 private:
  std::shared_ptr<HttpExchange> exchange_;
};

struct HttpServerOptions {
  // "host:port"; port 0 picks a free port (HttpServer::port() tells it).
  std::string listen = "127.0.0.1:0";
  // Called on the event thread with the request's headers (body empty).
  // Must not block. Null: every request is admitted untrusted with a body
  // budget of max_untrusted_body_bytes.
  std::function<HttpAdmission(const HttpRequest&)> admit = nullptr;
  // Called on the event thread once the admitted body is read. Must not
  // block: answer through the reply now, or later from another thread.
  std::function<void(HttpRequest, HttpReply)> handle = nullptr;

  // A connection's buffer, which the request line and headers must fit:
  // larger ones get 431. Generous for real clients (a browser sends < 8 KiB).
  size_t max_header_bytes = 32 << 10;
  // Untrusted bodies being read at one time share this many bytes; a
  // request whose Content-Length would pass it gets 503 (try again).
  uint64_t max_untrusted_body_bytes = 16 << 20;
  // Connections of any kind (also bounded by the process's open-file limit,
  // of which a quarter is left for everything else).
  size_t max_connections = 16384;
  // Untrusted connections held at once, and from one peer address; past
  // either the oldest idle one is closed for the newcomer.
  size_t max_untrusted_connections = 1024;
  size_t max_untrusted_connections_per_peer = 256;
  // How long an untrusted connection may take to deliver a whole request
  // (from connecting, or from its previous answer).
  std::chrono::milliseconds untrusted_request_timeout{std::chrono::seconds(10)};
  // A trusted connection without traffic for this long is closed.
  std::chrono::seconds idle_timeout{120};
  // Log name ("kv store", "gpt_serve").
  std::string name = "http";
};

// Serves from Start() until Stop() or destruction. Thread-safe.
class HttpServer {
 public:
  explicit HttpServer(HttpServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and starts the event thread. InvalidArgument for a malformed
  // listen address, Unavailable naming it when it cannot be bound (in use,
  // or not this host's address).
  Status Start();
  // Answers 503 to every request still waiting for its answer, closes every
  // stream and connection, joins the event thread. Idempotent.
  void Stop();
  // The bound port. REQUIRES: Start() returned OK.
  int port() const;
  // "host:port" as bound.
  std::string endpoint() const;
  // Connections open now (all, and untrusted), for tests and metrics.
  size_t connections() const;
  size_t untrusted_connections() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Raises this process's soft limit on open files to its hard limit (a server
// holding thousands of connections needs one descriptor each). Programs call
// it once at start; returns the limit now in force.
uint64_t RaiseOpenFileLimit();

}  // namespace fleet
