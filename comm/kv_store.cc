#include "comm/kv_store.h"

#include <httplib.h>

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "comm/endpoint.h"
#include "comm/http_listen.h"

namespace fleet {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Handler threads of the server, started as connections need them. httplib
// holds one per connection until its request is read and answered, and a
// long poll holds one for its whole wait. The bound is high so that a
// stranger's connections that trickle bytes (slowloris) do not take every
// thread from the job's own clients; requests beyond it queue until a
// thread frees up (see kLongPollSlice for why that is safe).
constexpr size_t kMaxServerThreads = 1024;
// The longest the server waits for each read of a request: a client sends
// its whole request at once, so only a stranger (or a dead peer) is cut.
constexpr std::chrono::seconds kReadTimeout{2};
// The largest request body (a PUT's value): values are endpoints and ids,
// far smaller. A larger Content-Length is refused before its body is read.
constexpr size_t kMaxBodyBytes = size_t{16} << 20;
// How long the server waits for its listener thread to come up in Start().
constexpr milliseconds kStartBudget{5000};
// A client never asks the server to hold one long poll longer than this; it
// re-polls instead. Were every handler thread parked in a long poll, the
// Set that would release them sits in the server's queue; slicing the polls
// guarantees a thread frees up (and the queued Set runs) within one slice.
constexpr milliseconds kLongPollSlice{2000};

bool ParseInt64(std::string_view text, int64_t* out) {
  if (text.empty()) return false;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && ptr == end;
}

// Percent-encodes everything but RFC 3986 unreserved characters; '/' is kept
// as is when keep_slash (keys may contain '/', and the server's route takes
// the whole rest of the path as the key).
std::string UrlEncode(std::string_view s, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/');
    if (plain) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

// A job id is one path segment; a key is any non-empty text without a
// newline (List answers one key per line).
Status CheckJob(const std::string& job) {
  if (job.empty() || job.find('/') != std::string::npos || job.find('\n') != std::string::npos) {
    return Status::InvalidArgument("kv store job id must be non-empty without '/' or newline",
                                   absl::StrCat("'", job, "'"));
  }
  return Status::OK();
}

Status CheckKey(const std::string& key) {
  if (key.empty() || key.find('\n') != std::string::npos) {
    return Status::InvalidArgument("kv store key must be non-empty without newline",
                                   absl::StrCat("'", key, "'"));
  }
  return Status::OK();
}

// httplib's task queue for the server: runs each connection on an idle
// thread, starts a new one while fewer than max_threads run, else queues.
// Threads live until shutdown(). Thread-safe.
class GrowingTaskQueue : public httplib::TaskQueue {
 public:
  explicit GrowingTaskQueue(size_t max_threads) : max_threads_(max_threads) {}
  ~GrowingTaskQueue() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(fn));
    if (idle_ < tasks_.size() && threads_.size() < max_threads_) {
      threads_.emplace_back([this] { Work(); });
    } else {
      cv_.notify_one();
    }
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    // Only the listener thread calls shutdown(), after its last enqueue().
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      ++idle_;
      cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      --idle_;
      if (tasks_.empty()) return;  // stopping, nothing left to run
      std::function<void()> fn = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
  }

  const size_t max_threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;  // guarded by mu_
  std::vector<std::thread> threads_;         // guarded by mu_
  size_t idle_ = 0;                          // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
};

}  // namespace

// ---------------------------------------------------------------- server

struct KvStoreServer::Impl {
  explicit Impl(KvStoreServerOptions o)
      : options(std::move(o)),
        signer(options.auth ? std::optional<KvRequestSigner>(KvRequestSigner(options.auth))
                            : std::nullopt) {}

  void Install();
  void HandleGet(const httplib::Request& req, httplib::Response& res);
  void HandlePut(const httplib::Request& req, httplib::Response& res);
  void HandleDelete(const httplib::Request& req, httplib::Response& res);
  void HandleList(const httplib::Request& req, httplib::Response& res);
  void HandleAdd(const httplib::Request& req, httplib::Response& res);
  // With options.auth: false (the reply set: 401 or 403) unless the request
  // carries a valid credential whose nonce was not seen before.
  bool Authorized(const httplib::Request& req, httplib::Response& res);
  // True (the reply set: 401, 403, 411 or 413) when the headers alone show
  // the request must be refused: with options.auth, no credential or one
  // malformed or stale; a body of unknown (chunked) or too large a length.
  bool RefusedOnHeaders(const httplib::Request& req, httplib::Response& res);
  // Answers 403 for a refused credential and tells options.on_refused.
  void RefuseCredential(const httplib::Request& req, httplib::Response& res, const Status& why);
  // GET /metrics, when options.metrics is set.
  void InstallMetrics();

  // Fixed after construction.
  const KvStoreServerOptions options;
  const std::optional<KvRequestSigner> signer;

  // Nonces of accepted requests, each kept for twice the auth window after
  // it was accepted (the longest its timestamp stays acceptable), in
  // acceptance order.
  std::mutex nonce_mu;
  absl::flat_hash_set<std::string> nonces;              // guarded by nonce_mu
  std::deque<std::pair<int64_t, std::string>> nonce_age;  // guarded by nonce_mu

  // Owns its own synchronisation.
  httplib::Server http;

  // Written by Start() before the listener runs, read-only afterwards.
  std::string host;
  int port = -1;
  std::thread listener;
  bool started = false;

  // Guarded by mu. cv is signalled on every write and on Stop().
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::map<std::string, std::map<std::string, std::string>> jobs;  // job -> key -> value
};

namespace {

constexpr char kKeyRoute[] = R"(/kv/([^/]+)/(.+))";
constexpr char kListRoute[] = R"(/list/([^/]+))";
constexpr char kAddRoute[] = R"(/add/([^/]+)/(.+))";

void Reply(httplib::Response& res, int code, std::string body) {
  res.status = code;
  res.set_content(std::move(body), "application/octet-stream");
}

}  // namespace

void KvStoreServer::Impl::Install() {
  http.new_task_queue = [] { return new GrowingTaskQueue(kMaxServerThreads); };
  // Our client closes after each request: one request per connection, so
  // no connection (and no thread) is held between requests, and Stop()
  // never waits on an idle connection of some other client.
  http.set_keep_alive_max_count(1);
  http.set_keep_alive_timeout(1);
  http.set_read_timeout(kReadTimeout);
  http.set_payload_max_length(kMaxBodyBytes);
  http.set_tcp_nodelay(true);
  // On the headers, before any body is read: a request without a
  // well-formed, fresh credential, or whose body is too large or of unknown
  // length, is answered at once and its body never read.
  http.set_pre_routing_handler([this](const httplib::Request& q, httplib::Response& r) {
    return RefusedOnHeaders(q, r) ? httplib::Server::HandlerResponse::Handled
                                  : httplib::Server::HandlerResponse::Unhandled;
  });
  // Every route checks the whole credential first (the signature covers the
  // body, so this runs once the body is read).
  using Handler = void (Impl::*)(const httplib::Request&, httplib::Response&);
  auto guarded = [this](Handler h) {
    return [this, h](const httplib::Request& q, httplib::Response& r) {
      if (Authorized(q, r)) (this->*h)(q, r);
    };
  };
  http.Get("/health", [this](const httplib::Request& q, httplib::Response& res) {
    if (Authorized(q, res)) Reply(res, 200, "ok");
  });
  http.Get(kKeyRoute, guarded(&Impl::HandleGet));
  http.Put(kKeyRoute, guarded(&Impl::HandlePut));
  http.Delete(kKeyRoute, guarded(&Impl::HandleDelete));
  http.Get(kListRoute, guarded(&Impl::HandleList));
  http.Post(kAddRoute, guarded(&Impl::HandleAdd));
  InstallMetrics();
}

void KvStoreServer::Impl::InstallMetrics() {
  if (!options.metrics) return;
  http.Get("/metrics", [this](const httplib::Request& q, httplib::Response& res) {
    if (!Authorized(q, res)) return;
    res.status = 200;
    res.set_content(options.metrics(), "text/plain; version=0.0.4");
  });
}

bool KvStoreServer::Impl::RefusedOnHeaders(const httplib::Request& req, httplib::Response& res) {
  if (signer) {
    if (!req.has_header(KvRequestSigner::kHeader)) {
      LOG_EVERY_N(WARNING, 100) << "kv store: refused " << req.method << " from " << req.remote_addr
                                << " without credential (" << google::COUNTER << " so far)";
      Reply(res, 401, "this KV store needs the job's credential (X-Fleet-Auth)");
      if (options.on_refused) options.on_refused(req.remote_addr, "no credential (401)");
      return true;
    }
    const int64_t now = std::chrono::duration_cast<milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
    Status st = KvRequestSigner::CheckHeader(req.get_header_value(KvRequestSigner::kHeader), now,
                                             options.auth_window);
    if (!st.ok()) {
      RefuseCredential(req, res, st);
      return true;
    }
  }
  const bool has_body = req.method == "PUT" || req.method == "POST";
  if (req.has_header("Transfer-Encoding") || (has_body && !req.has_header("Content-Length"))) {
    Reply(res, 411, "the kv store needs a Content-Length");
    return true;
  }
  if (req.get_header_value<uint64_t>("Content-Length") > kMaxBodyBytes) {
    Reply(res, 413, absl::StrCat("a kv store value holds at most ", kMaxBodyBytes, " bytes"));
    return true;
  }
  return false;
}

bool KvStoreServer::Impl::Authorized(const httplib::Request& req, httplib::Response& res) {
  // RefusedOnHeaders already answered requests without a credential.
  if (!signer) return true;
  const int64_t now = std::chrono::duration_cast<milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  std::string nonce;
  Status st = signer->Verify(req.get_header_value(KvRequestSigner::kHeader), req.method,
                             req.target, req.body, now, options.auth_window, &nonce);
  if (st.ok()) {
    std::lock_guard<std::mutex> lock(nonce_mu);
    const int64_t keep = 2 * options.auth_window.count();
    while (!nonce_age.empty() && nonce_age.front().first < now - keep) {
      nonces.erase(nonce_age.front().second);
      nonce_age.pop_front();
    }
    if (nonces.insert(nonce).second) {
      nonce_age.emplace_back(now, std::move(nonce));
      return true;
    }
    st = Status::InvalidArgument("replayed credential (nonce seen before)");
  }
  LOG_EVERY_N(WARNING, 100) << "kv store: refused " << req.method << " from " << req.remote_addr
                            << ": " << st.message() << " (" << google::COUNTER << " so far)";
  RefuseCredential(req, res, st);
  return false;
}

void KvStoreServer::Impl::RefuseCredential(const httplib::Request& req, httplib::Response& res,
                                           const Status& why) {
  Reply(res, 403, absl::StrCat("credential refused: ", why.message()));
  if (options.on_refused) {
    options.on_refused(req.remote_addr, absl::StrCat("credential refused (403): ", why.message()));
  }
}

void KvStoreServer::Impl::HandleGet(const httplib::Request& req, httplib::Response& res) {
  const std::string job = req.matches[1];
  const std::string key = req.matches[2];
  milliseconds wait{0};
  if (req.has_param("wait_ms")) {
    int64_t ms = 0;
    if (!ParseInt64(req.get_param_value("wait_ms"), &ms) || ms < 0) {
      return Reply(res, 400, "wait_ms must be a non-negative integer");
    }
    wait = std::min(milliseconds(ms), options.max_wait);
  }
  const auto deadline = Clock::now() + wait;
  std::unique_lock<std::mutex> lock(mu);
  const std::string* found = nullptr;
  auto lookup = [&] {
    found = nullptr;
    auto j = jobs.find(job);
    if (j == jobs.end()) return false;
    auto k = j->second.find(key);
    if (k == j->second.end()) return false;
    found = &k->second;
    return true;
  };
  cv.wait_until(lock, deadline, [&] { return stopping || lookup(); });
  if (stopping) return Reply(res, 503, "kv store stopping");
  if (found == nullptr) return Reply(res, 404, absl::StrCat("no key ", job, "/", key));
  Reply(res, 200, *found);
}

void KvStoreServer::Impl::HandlePut(const httplib::Request& req, httplib::Response& res) {
  const std::string job = req.matches[1];
  const std::string key = req.matches[2];
  if (key.find('\n') != std::string::npos) return Reply(res, 400, "key contains a newline");
  {
    std::lock_guard<std::mutex> lock(mu);
    if (stopping) return Reply(res, 503, "kv store stopping");
    jobs[job][key] = req.body;
  }
  cv.notify_all();
  Reply(res, 200, "");
}

void KvStoreServer::Impl::HandleDelete(const httplib::Request& req, httplib::Response& res) {
  const std::string job = req.matches[1];
  const std::string key = req.matches[2];
  std::lock_guard<std::mutex> lock(mu);
  if (stopping) return Reply(res, 503, "kv store stopping");
  auto j = jobs.find(job);
  if (j == jobs.end() || j->second.erase(key) == 0) {
    return Reply(res, 404, absl::StrCat("no key ", job, "/", key));
  }
  if (j->second.empty()) jobs.erase(j);
  Reply(res, 200, "");
}

void KvStoreServer::Impl::HandleList(const httplib::Request& req, httplib::Response& res) {
  const std::string job = req.matches[1];
  const std::string prefix = req.get_param_value("prefix");
  std::string body;
  std::lock_guard<std::mutex> lock(mu);
  if (stopping) return Reply(res, 503, "kv store stopping");
  auto j = jobs.find(job);
  if (j != jobs.end()) {
    for (auto it = j->second.lower_bound(prefix);
         it != j->second.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
      body.append(it->first);
      body.push_back('\n');
    }
  }
  Reply(res, 200, std::move(body));
}

void KvStoreServer::Impl::HandleAdd(const httplib::Request& req, httplib::Response& res) {
  const std::string job = req.matches[1];
  const std::string key = req.matches[2];
  if (key.find('\n') != std::string::npos) return Reply(res, 400, "key contains a newline");
  int64_t delta = 0;
  if (!ParseInt64(req.body, &delta)) return Reply(res, 400, "add: body must be a decimal integer");
  int64_t value = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (stopping) return Reply(res, 503, "kv store stopping");
    std::string& stored = jobs[job][key];
    if (!stored.empty() && !ParseInt64(stored, &value)) {
      return Reply(res, 409, absl::StrCat("add: value of ", job, "/", key, " is not an integer"));
    }
    if ((delta > 0 && value > std::numeric_limits<int64_t>::max() - delta) ||
        (delta < 0 && value < std::numeric_limits<int64_t>::min() - delta)) {
      return Reply(res, 409, absl::StrCat("add: ", job, "/", key, " would overflow"));
    }
    value += delta;
    stored = std::to_string(value);
  }
  cv.notify_all();
  Reply(res, 200, std::to_string(value));
}

KvStoreServer::KvStoreServer(KvStoreServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

KvStoreServer::~KvStoreServer() { Stop(); }

Status KvStoreServer::Start() {
  if (impl_->started) return Status::FailedPrecondition("kv store server already started", impl_->options.listen);
  FLEET_ASSIGN_OR_RETURN(Endpoint ep, ParseEndpoint(impl_->options.listen, "kv store listen address",
                                                    EndpointParseOptions{.allow_port_zero = true}));
  impl_->Install();
  const int port = BindHttpServer(impl_->http, ep.host, ep.port);
  if (port <= 0) {
    return Status::Unavailable("kv store cannot listen (port in use or address not local)",
                               impl_->options.listen);
  }
  impl_->host = ep.host;
  impl_->port = port;
  impl_->started = true;
  impl_->listener = std::thread([impl = impl_.get()] { impl->http.listen_after_bind(); });
  // httplib's stop() is a no-op until the listen loop runs, so Stop() right
  // after Start() would leave the listener running forever; wait for it.
  const auto deadline = Clock::now() + kStartBudget;
  while (!impl_->http.is_running()) {
    if (Clock::now() > deadline) {
      Stop();
      return Status::Unavailable(
          absl::StrCat("kv store listener did not start within ", kStartBudget.count(), " ms"),
          endpoint());
    }
    std::this_thread::sleep_for(milliseconds(1));
  }
  LOG(INFO) << "kv store serving on " << endpoint();
  return Status::OK();
}

void KvStoreServer::Stop() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  // Long polls wake, see `stopping` and answer 503; then the listener and
  // its handler threads can be joined.
  impl_->cv.notify_all();
  impl_->http.stop();
  if (impl_->listener.joinable()) impl_->listener.join();
}

int KvStoreServer::port() const {
  CHECK(impl_->started) << "KvStoreServer::port() before a successful Start()";
  return impl_->port;
}

std::string KvStoreServer::endpoint() const { return absl::StrCat(impl_->host, ":", impl_->port); }

// ---------------------------------------------------------------- client

struct KvStoreClient::Impl {
  struct Reply {
    int code = 0;
    std::string body;
  };
  enum class Method { kGet, kPut, kDelete, kPost };

  // One request on its own connection. `read_timeout` bounds the wait for
  // the answer (a long poll passes its wait plus the request budget).
  Result<Reply> Do(Method method, const std::string& path, const std::string& body,
                   milliseconds read_timeout, const char* what) const;
  // Status for an answer other than 200: 404 -> NotFound, 503 ->
  // Unavailable, the rest -> InvalidArgument / Internal with the body.
  Status FromReply(const Reply& reply, const char* what, const std::string& which) const;

  std::string KeyPath(const std::string& key) const {
    return absl::StrCat("/kv/", UrlEncode(job, false), "/", UrlEncode(key, true));
  }
  // Waits for one key until `deadline`: OK, NotFound (deadline passed) or
  // the error that ended the wait.
  Status WaitOne(const std::string& key, Clock::time_point deadline) const;

  // Fixed after construction.
  std::string endpoint;
  std::string job;
  KvStoreClientOptions options;
  std::optional<KvRequestSigner> signer;  // with options.auth
  Result<Endpoint> parsed = Status::InvalidArgument("unset");
};

Result<KvStoreClient::Impl::Reply> KvStoreClient::Impl::Do(Method method, const std::string& path,
                                                           const std::string& body,
                                                           milliseconds read_timeout,
                                                           const char* what) const {
  if (!parsed.ok()) return parsed.status();
  FLEET_RETURN_IF_ERROR(CheckJob(job));
  httplib::Client cli(parsed->host, parsed->port);
  cli.set_keep_alive(false);
  cli.set_tcp_nodelay(true);
  if (!options.source_address.empty()) cli.set_interface(options.source_address);
  cli.set_connection_timeout(options.request_timeout);
  cli.set_read_timeout(read_timeout);
  cli.set_write_timeout(options.request_timeout);
  static constexpr const char* kMethodNames[] = {"GET", "PUT", "DELETE", "POST"};
  httplib::Headers headers;
  if (signer) {
    headers.emplace(KvRequestSigner::kHeader,
                    signer->Sign(kMethodNames[static_cast<int>(method)], path, body));
  }
  httplib::Result res{nullptr, httplib::Error::Unknown};
  switch (method) {
    case Method::kGet: res = cli.Get(path, headers); break;
    case Method::kPut: res = cli.Put(path, headers, body, "application/octet-stream"); break;
    case Method::kDelete: res = cli.Delete(path, headers); break;
    case Method::kPost: res = cli.Post(path, headers, body, "text/plain"); break;
  }
  if (!res) {
    return Status::Unavailable(absl::StrCat("kv store ", what, " failed: ", httplib::to_string(res.error())),
                               absl::StrCat(endpoint, " (job ", job, ")"));
  }
  return Reply{res->status, res->body};
}

Status KvStoreClient::Impl::FromReply(const Reply& reply, const char* what,
                                      const std::string& which) const {
  std::string where = absl::StrCat(which, " at ", endpoint);
  switch (reply.code) {
    case 200: return Status::OK();
    case 404: return Status::NotFound(absl::StrCat("kv store ", what, ": no such key"), where);
    case 503: return Status::Unavailable(absl::StrCat("kv store ", what, ": server stopping"), where);
    case 400: return Status::InvalidArgument(absl::StrCat("kv store ", what, ": ", reply.body), where);
    case 409: return Status::FailedPrecondition(absl::StrCat("kv store ", what, ": ", reply.body), where);
    case 401:
      return Status::FailedPrecondition(
          absl::StrCat("kv store ", what,
                       ": refused, the store needs the job's credential and this process has "
                       "no job secret (set FLEET_JOB_SECRET or --job_secret_file; fleetrun "
                       "passes it to the processes it starts)"),
          where);
    case 403:
      return Status::FailedPrecondition(
          absl::StrCat("kv store ", what, ": ", reply.body, " (is this the job's secret?)"),
          where);
    default:
      return Status::Internal(absl::StrCat("kv store ", what, ": HTTP ", reply.code, " ", reply.body), where);
  }
}

Status KvStoreClient::Impl::WaitOne(const std::string& key, Clock::time_point deadline) const {
  const std::string which = absl::StrCat(job, "/", key);
  while (true) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    milliseconds slice = std::clamp(left, milliseconds(0), kLongPollSlice);
    std::string path = absl::StrCat(KeyPath(key), "?wait_ms=", slice.count());
    FLEET_ASSIGN_OR_RETURN(Reply reply,
                           Do(Method::kGet, path, "", slice + options.request_timeout, "wait"));
    Status st = FromReply(reply, "wait", which);
    if (!st.IsNotFound()) return st;
    if (Clock::now() >= deadline) return st;
  }
}

KvStoreClient::KvStoreClient(std::string endpoint, std::string job_id, KvStoreClientOptions options)
    : endpoint_(std::move(endpoint)), job_id_(std::move(job_id)), impl_(std::make_unique<Impl>()) {
  impl_->endpoint = endpoint_;
  impl_->job = job_id_;
  impl_->options = options;
  if (options.auth) impl_->signer.emplace(options.auth);
  impl_->parsed = ParseEndpoint(endpoint_, "kv store endpoint");
}

KvStoreClient::~KvStoreClient() = default;

Status KvStoreClient::Set(const std::string& key, const std::string& value) {
  FLEET_RETURN_IF_ERROR(CheckKey(key));
  FLEET_ASSIGN_OR_RETURN(Impl::Reply reply, impl_->Do(Impl::Method::kPut, impl_->KeyPath(key), value,
                                                      impl_->options.request_timeout, "set"));
  return impl_->FromReply(reply, "set", absl::StrCat(job_id_, "/", key));
}

Result<std::string> KvStoreClient::Get(const std::string& key) {
  FLEET_RETURN_IF_ERROR(CheckKey(key));
  FLEET_ASSIGN_OR_RETURN(Impl::Reply reply, impl_->Do(Impl::Method::kGet, impl_->KeyPath(key), "",
                                                      impl_->options.request_timeout, "get"));
  FLEET_RETURN_IF_ERROR(impl_->FromReply(reply, "get", absl::StrCat(job_id_, "/", key)));
  return std::move(reply.body);
}

Result<std::string> KvStoreClient::Metrics() {
  FLEET_ASSIGN_OR_RETURN(Impl::Reply reply, impl_->Do(Impl::Method::kGet, "/metrics", "",
                                                      impl_->options.request_timeout, "metrics"));
  FLEET_RETURN_IF_ERROR(impl_->FromReply(reply, "metrics", "/metrics"));
  return std::move(reply.body);
}

Status KvStoreClient::Wait(const std::vector<std::string>& keys, milliseconds timeout) {
  for (const std::string& key : keys) FLEET_RETURN_IF_ERROR(CheckKey(key));
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  for (size_t i = 0; i < keys.size(); ++i) {
    Status st = impl_->WaitOne(keys[i], deadline);
    if (st.ok()) continue;
    if (!st.IsNotFound()) return st;
    // Deadline passed on keys[i]. The later keys were never polled; probe
    // them once so the message lists exactly the keys that are missing.
    std::vector<std::string> missing = {keys[i]};
    for (size_t j = i + 1; j < keys.size(); ++j) {
      Result<std::string> probe = Get(keys[j]);
      if (!probe.ok()) missing.push_back(keys[j]);
    }
    auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    return Status::Timeout(
        absl::StrCat("kv store wait: keys still missing after ", waited.count(), " ms (timeout ",
                     timeout.count(), " ms)"),
        absl::StrCat("job ", job_id_, ": [", absl::StrJoin(missing, ", "), "] at ", endpoint_));
  }
  return Status::OK();
}

Result<std::string> KvStoreClient::WaitGet(const std::string& key, milliseconds timeout) {
  FLEET_RETURN_IF_ERROR(Wait({key}, timeout));
  return Get(key);
}

Status KvStoreClient::Delete(const std::string& key) {
  FLEET_RETURN_IF_ERROR(CheckKey(key));
  FLEET_ASSIGN_OR_RETURN(Impl::Reply reply, impl_->Do(Impl::Method::kDelete, impl_->KeyPath(key), "",
                                                      impl_->options.request_timeout, "delete"));
  return impl_->FromReply(reply, "delete", absl::StrCat(job_id_, "/", key));
}

Result<std::vector<std::string>> KvStoreClient::List(const std::string& prefix) {
  std::string path =
      absl::StrCat("/list/", UrlEncode(job_id_, false), "?prefix=", UrlEncode(prefix, false));
  FLEET_ASSIGN_OR_RETURN(Impl::Reply reply, impl_->Do(Impl::Method::kGet, path, "",
                                                      impl_->options.request_timeout, "list"));
  FLEET_RETURN_IF_ERROR(impl_->FromReply(reply, "list", absl::StrCat(job_id_, "/", prefix, "*")));
  std::vector<std::string> keys = absl::StrSplit(reply.body, '\n', absl::SkipEmpty());
  std::sort(keys.begin(), keys.end());
  return keys;
}

Result<int64_t> KvStoreClient::Add(const std::string& key, int64_t delta) {
  FLEET_RETURN_IF_ERROR(CheckKey(key));
  std::string path = absl::StrCat("/add/", UrlEncode(job_id_, false), "/", UrlEncode(key, true));
  FLEET_ASSIGN_OR_RETURN(Impl::Reply reply, impl_->Do(Impl::Method::kPost, path, std::to_string(delta),
                                                      impl_->options.request_timeout, "add"));
  FLEET_RETURN_IF_ERROR(impl_->FromReply(reply, "add", absl::StrCat(job_id_, "/", key)));
  int64_t value = 0;
  if (!ParseInt64(reply.body, &value)) {
    return Status::Corruption("kv store add: server answered a non-integer",
                              absl::StrCat(job_id_, "/", key, " = '", reply.body, "'"));
  }
  return value;
}

}  // namespace fleet
