// The HTTP key-value store used for rendezvous: fleetrun hosts a
// KvStoreServer on --http_port; every process reaches it with a
// KvStoreClient at FLEET_KV_ENDPOINT. Keys live in a job scope
// ("/<job_id>/<key>") so two jobs can share one server.
//
// HTTP API (all bodies are raw bytes):
//   PUT    /kv/<job>/<key>                      set
//   GET    /kv/<job>/<key>                      get; 404 when absent
//   GET    /kv/<job>/<key>?wait_ms=N            long poll: waits up to N ms for the key
//   DELETE /kv/<job>/<key>[?id=I]               delete; 404 when absent
//   GET    /list/<job>?prefix=P                 keys with prefix P, one per line
//   POST   /add/<job>/<key>[?id=I] body: delta  atomic add, returns the new value
//   GET    /health                              "ok"
//   GET    /metrics                             options.metrics' text
//   GET    /job, /job/state                     options.page, options.page_state
// A delete or add with an id is done once: the server answers a request
// repeating a recent id (a client's retry after a lost answer) with the
// first answer.
//
// The server is comm/http_server.h's: one event thread for every
// connection (a long poll holds no thread), headers capped, strangers'
// connections bounded and cut when they dawdle.
//
// Authentication: a server given the job's credentials (options.auth)
// answers every request (/health included) that lacks a valid X-Fleet-Auth
// header (comm/job_auth.h, KvRequestSigner) with 401 when it has none and
// 403 when it is wrong, stale (outside auth_window of the server's clock)
// or replayed, on the headers alone: a stranger's body is never read. A
// client given them signs every request. Bodies travel in the clear:
// nothing secret is ever stored. The read-only routes (/metrics, /job,
// /job/state) also answer a GET with "Authorization: Bearer <read_token>"
// (Prometheus's bearer token), and anyone when `read_open`.
#pragma once

#include <chrono>
#include <memory>
#include <functional>
#include <string>
#include <vector>

#include "comm/job_auth.h"
#include "comm/status.h"

namespace fleet {

struct KvStoreServerOptions {
  // "host:port". Port 0 picks a free port; port() reports it.
  std::string listen = "127.0.0.1:0";
  // The longest long poll a client may ask for; longer requests are capped.
  std::chrono::milliseconds max_wait{std::chrono::minutes(10)};
  // The job's credentials: when set, only signed requests are served (see
  // the top of this file). Null (default): anyone reaching the port may read
  // and write every key (auth off, trusted networks only).
  std::shared_ptr<const JobAuth> auth = nullptr;
  // How far a request's timestamp may be from the server's clock. Wider
  // tolerates worse clock skew between machines; a captured request can be
  // replayed by nobody (nonces are remembered for this long).
  std::chrono::milliseconds auth_window{std::chrono::seconds(60)};
  // When set, GET /metrics answers its text (Prometheus exposition format);
  // called on a server thread, so it must be thread-safe and never block.
  std::function<std::string()> metrics = nullptr;
  // When set, told of every request refused for its credential (401/403):
  // the peer's address and why. Called on a server thread, so it must be
  // thread-safe. fleetrun fails a job at once when one of its hosts is
  // refused (launch/peer_watch.h).
  std::function<void(const std::string& remote_address, const std::string& why)> on_refused =
      nullptr;
  // When set, GET /job answers `page` (text/html) and GET /job/state
  // `page_state()` (application/json); the same rules as `metrics`.
  std::string page = {};
  std::function<std::string()> page_state = nullptr;
  // The read-only routes (/metrics, /job, /job/state) also answer a GET
  // carrying "Authorization: Bearer <read_token>" when it is not empty
  // (compared in constant time), and every GET when `read_open` (fleetrun
  // sets it when the store listens on loopback only: this machine's users
  // may read the page and the metrics, which hold no secret). The job's
  // signed requests are always answered.
  std::string read_token = {};
  bool read_open = false;
};

// Thread-safe. Serves on its own threads from Start() until Stop() or
// destruction.
class KvStoreServer {
 public:
  explicit KvStoreServer(KvStoreServerOptions options);
  ~KvStoreServer();
  KvStoreServer(const KvStoreServer&) = delete;
  KvStoreServer& operator=(const KvStoreServer&) = delete;

  // Binds and starts serving. Returns Unavailable naming the address when
  // the port is taken, InvalidArgument for a malformed listen address.
  Status Start();
  // Wakes every long poll (they answer 503) and stops. Idempotent.
  void Stop();
  // The bound port. REQUIRES: Start() returned OK.
  int port() const;
  // "host:port" as bound.
  std::string endpoint() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct KvStoreClientOptions {
  // Per-request budget for set/get/delete/list/add (connect + transfer, all
  // retries included).
  std::chrono::milliseconds request_timeout{std::chrono::seconds(10)};
  // The job's credentials: every request is signed with them. Null: requests
  // go unsigned, which a server with auth answers with 401 (reported as
  // FailedPrecondition naming the missing secret).
  std::shared_ptr<const JobAuth> auth = nullptr;
  // The local IPv4 address requests come from; "" lets the kernel choose.
  // A host with several addresses names the one the job knows it by, so
  // the server sees (and reports refusals under) that address.
  std::string source_address = {};
};

// Talks to a KvStoreServer. Thread-safe: calls share a pool of keep-alive
// connections, each call using one at a time. A call that fails in transit
// (a reset, a timeout: a loaded or briefly unreachable server) is tried
// again with backoff until its budget (request_timeout) is spent; a refused
// connection (nothing listens: the store is gone) fails at once. Every call
// blocks at most its budget and returns Unavailable (naming the endpoint,
// the attempts and the time) or Timeout (naming the keys) instead of
// hanging; FailedPrecondition when the server refuses the credential (401:
// none given, 403: not this job's).
class KvStoreClient {
 public:
  // endpoint: "host:port" of the server; job_id scopes every key.
  KvStoreClient(std::string endpoint, std::string job_id, KvStoreClientOptions options = {});
  ~KvStoreClient();

  Status Set(const std::string& key, const std::string& value);
  // The same within `budget` instead of request_timeout (a best-effort
  // write that must not hold its caller long).
  Status Set(const std::string& key, const std::string& value, std::chrono::milliseconds budget);
  // NotFound when the key is absent.
  Result<std::string> Get(const std::string& key);
  Result<std::string> Get(const std::string& key, std::chrono::milliseconds budget);
  // Blocks until every key exists or `timeout` passes (Timeout naming the
  // missing keys and the milliseconds waited).
  Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // Get after Wait, for one key.
  Result<std::string> WaitGet(const std::string& key, std::chrono::milliseconds timeout);
  // NotFound when the key is absent.
  Status Delete(const std::string& key);
  // Keys (without the job scope) that start with prefix, sorted.
  Result<std::vector<std::string>> List(const std::string& prefix);
  Result<std::vector<std::string>> List(const std::string& prefix, std::chrono::milliseconds budget);
  // The text of the server's GET /metrics (KvStoreServerOptions::metrics):
  // NotFound when the server serves none.
  Result<std::string> Metrics();
  // Atomically adds delta to the integer stored at key (absent = 0) and
  // returns the new value; used to hand out ranks.
  Result<int64_t> Add(const std::string& key, int64_t delta);

  const std::string& endpoint() const { return endpoint_; }
  const std::string& job_id() const { return job_id_; }

 private:
  struct Impl;
  std::string endpoint_;
  std::string job_id_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fleet
