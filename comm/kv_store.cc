#include "comm/kv_store.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "comm/endpoint.h"
#include "comm/http_server.h"

namespace fleet {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The largest request body (a PUT's value): values are endpoints and ids,
// far smaller. A larger Content-Length is refused before its body is read.
constexpr uint64_t kMaxBodyBytes = uint64_t{16} << 20;
// A client never asks the server to hold one long poll longer than this; it
// re-polls instead, so a lost connection is noticed within a slice.
constexpr milliseconds kLongPollSlice{2000};
// How long the server remembers the answer to a delete or add by its
// request id (a client retries within its request budget, 10 s by
// default), and how many answers at most.
constexpr milliseconds kRememberAnswers{std::chrono::minutes(2)};
constexpr size_t kMaxRememberedAnswers = 100000;
// Idle keep-alive connections a client keeps for its next calls.
constexpr size_t kMaxIdleConnections = 8;
// A failed request is tried again after this pause, doubled each time up
// to the maximum, until the request's budget is spent.
constexpr milliseconds kFirstBackoff{25};
constexpr milliseconds kMaxBackoff{1000};

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

// 16 random bytes as hex: a request's id, unique across clients.
std::string RequestId() {
  unsigned char raw[16];
  // Fails only when the OS cannot seed the generator.
  CHECK_EQ(RAND_bytes(raw, sizeof(raw)), 1);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id;
  for (unsigned char c : raw) {
    id.push_back(kHex[c >> 4]);
    id.push_back(kHex[c & 15]);
  }
  return id;
}

// Whether a connection to `ep` is refused outright (a reset: the host is up
// and nothing listens on the port), as opposed to timing out. httplib says
// only "Connection" for both; one blocking connect tells them apart.
bool ConnectRefused(const Endpoint& ep) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(ep.port));
  if (inet_pton(AF_INET, ep.host.c_str(), &addr.sin_addr) != 1) return false;  // a hostname
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  // A refusal comes back within a round trip; a silent host is not waited for.
  timeval limit{0, 200000};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  const bool refused = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 &&
                       errno == ECONNREFUSED;
  ::close(fd);
  return refused;
}

// The parts of a request's path: /kv/<job>/<key>, /add/<job>/<key>,
// /list/<job>, /health, /metrics.
struct Route {
  enum Kind { kKey, kAdd, kList, kHealth, kMetrics, kPage, kPageState, kNone };
  explicit Route(Kind k = kNone, std::string j = {}, std::string k2 = {})
      : kind(k), job(std::move(j)), key(std::move(k2)) {}
  Kind kind;
  std::string job;
  std::string key;
};

Route ParseRoute(const std::string& path) {
  auto job_and_key = [&path](std::string_view prefix, Route::Kind kind) -> std::optional<Route> {
    if (!path.starts_with(prefix)) return std::nullopt;
    std::string_view rest = std::string_view(path).substr(prefix.size());
    const size_t slash = rest.find('/');
    if (slash == 0 || slash == std::string_view::npos || slash + 1 == rest.size()) {
      return Route();
    }
    return Route(kind, std::string(rest.substr(0, slash)), std::string(rest.substr(slash + 1)));
  };
  if (path == "/health") return Route(Route::kHealth);
  if (path == "/metrics") return Route(Route::kMetrics);
  if (path == "/job") return Route(Route::kPage);
  if (path == "/job/state") return Route(Route::kPageState);
  if (auto r = job_and_key("/kv/", Route::kKey)) return *r;
  if (auto r = job_and_key("/add/", Route::kAdd)) return *r;
  if (path.starts_with("/list/")) {
    std::string job = path.substr(6);
    if (job.empty() || job.find('/') != std::string::npos) return Route();
    return Route(Route::kList, std::move(job));
  }
  return Route();
}

HttpResponse Reply(int code, std::string body) {
  HttpResponse r;
  r.status = code;
  r.content_type = "application/octet-stream";
  r.body = std::move(body);
  return r;
}

int64_t UnixMs() {
  return std::chrono::duration_cast<milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// ---------------------------------------------------------------- server

struct KvStoreServer::Impl {
  // A long poll: answered by the write of its key, else at its deadline.
  struct Waiter {
    std::string job;
    std::string key;
    Clock::time_point deadline;
    HttpReply reply;
  };
  // The answer to a delete or add, kept by its request id so that a client
  // retrying after a lost answer gets it again instead of a second change.
  struct Done {
    int64_t at_ms = 0;
    HttpResponse response;
  };

  explicit Impl(KvStoreServerOptions o)
      : options(std::move(o)),
        signer(options.auth ? std::optional<KvRequestSigner>(KvRequestSigner(options.auth))
                            : std::nullopt),
        http(HttpOptions()) {}

  HttpServerOptions HttpOptions();
  // On the headers, before any body byte is read.
  HttpAdmission Admit(const HttpRequest& req);
  // Once the body is read; on the HTTP event thread, never blocking.
  void Handle(HttpRequest req, HttpReply reply);
  // The answer to a request that does not wait.
  HttpResponse Dispatch(const Route& route, HttpRequest& req);
  HttpResponse Get(const Route& route);
  HttpResponse Put(const Route& route, std::string value);
  HttpResponse Delete(const Route& route);
  HttpResponse List(const Route& route, const std::string& prefix);
  HttpResponse Add(const Route& route, const std::string& body);
  // Whether `req` may GET a read-only route without the job's credential
  // (options.read_open, options.read_token).
  bool ReadAllowed(const HttpRequest& req) const;
  static bool ReadOnly(Route::Kind kind) {
    return kind == Route::kMetrics || kind == Route::kPage || kind == Route::kPageState;
  }
  // The refusal of a request without a credential (401) or with a wrong
  // one (403, `why`), told to options.on_refused.
  HttpAdmission Refuse(const HttpRequest& req, int code, const std::string& why = {});
  // Wakes the long polls of job/key (mu held; they are answered by the caller
  // after unlocking, from `woken`).
  void TakeWaiters(const std::string& job, const std::string& key, std::vector<Waiter>* woken);
  // The thread answering long polls whose deadline passed.
  void ExpireLoop();

  // Fixed after construction.
  const KvStoreServerOptions options;
  const std::optional<KvRequestSigner> signer;

  // Nonces of accepted requests, each kept for twice the auth window after
  // it was accepted (the longest its timestamp stays acceptable), in
  // acceptance order. Event thread only.
  absl::flat_hash_set<std::string> nonces;
  std::deque<std::pair<int64_t, std::string>> nonce_age;

  // Owns its own synchronisation.
  HttpServer http;

  // Guarded by mu. expire_cv is signalled when a waiter is added and on Stop().
  std::mutex mu;
  std::condition_variable expire_cv;
  bool stopping = false;
  bool started = false;
  std::map<std::string, std::map<std::string, std::string>> jobs;      // job -> key -> value
  std::multimap<std::pair<std::string, std::string>, Waiter> waiters;  // by (job, key)
  absl::flat_hash_map<std::string, Done> done;                         // by request id
  std::deque<std::pair<int64_t, std::string>> done_age;
  std::thread expirer;
};

HttpServerOptions KvStoreServer::Impl::HttpOptions() {
  HttpServerOptions o;
  o.listen = options.listen;
  o.name = "kv store";
  o.admit = [this](const HttpRequest& req) { return Admit(req); };
  o.handle = [this](HttpRequest req, HttpReply reply) { Handle(std::move(req), std::move(reply)); };
  // Nothing is read from a stranger but headers: the job's own requests
  // are trusted on their credential (or all, with auth off).
  o.max_untrusted_body_bytes = 0;
  return o;
}

HttpAdmission KvStoreServer::Impl::Refuse(const HttpRequest& req, int code,
                                          const std::string& why) {
  const std::string told =
      code == 401 ? "no credential (401)" : absl::StrCat("credential refused (403): ", why);
  LOG_EVERY_N(WARNING, 100) << "kv store: refused " << req.method << " from " << req.remote_address
                            << ": " << told << " (" << google::COUNTER << " so far)";
  if (options.on_refused) options.on_refused(req.remote_address, told);
  HttpAdmission refused;
  refused.refusal =
      Reply(code, code == 401 ? "this KV store needs the job's credential (X-Fleet-Auth)"
                              : absl::StrCat("credential refused: ", why));
  return refused;
}

HttpAdmission KvStoreServer::Impl::Admit(const HttpRequest& req) {
  HttpAdmission admission;
  if (req.method == "GET" && ReadOnly(ParseRoute(req.path).kind) && ReadAllowed(req)) {
    // Read by a person or a scraper: answered, never trusted.
    return admission;
  }
  if (signer) {
    std::optional<std::string_view> header = req.Header(KvRequestSigner::kHeader);
    if (!header) return Refuse(req, 401);
    const int64_t now = UnixMs();
    Result<std::string> nonce =
        signer->VerifyHead(*header, req.method, req.target, now, options.auth_window);
    if (!nonce.ok()) {
      return Refuse(req, 403, nonce.status().message());
    }
    const int64_t keep = 2 * options.auth_window.count();
    while (!nonce_age.empty() && nonce_age.front().first < now - keep) {
      nonces.erase(nonce_age.front().second);
      nonce_age.pop_front();
    }
    if (!nonces.insert(*nonce).second) {
      return Refuse(req, 403, "replayed credential (nonce seen before)");
    }
    nonce_age.emplace_back(now, *std::move(nonce));
  }
  // Authenticated (or auth off: a trusted network by the user's choice).
  admission.trusted = true;
  const bool has_body = req.method == "PUT" || req.method == "POST";
  if (has_body && !req.content_length) {
    admission.refusal = Reply(411, "the kv store needs a Content-Length");
    return admission;
  }
  admission.max_body_bytes = has_body ? kMaxBodyBytes : 0;
  return admission;
}

bool KvStoreServer::Impl::ReadAllowed(const HttpRequest& req) const {
  if (options.read_open) return true;
  if (options.read_token.empty()) return false;
  const std::optional<std::string_view> header = req.Header("Authorization");
  const std::string expected = absl::StrCat("Bearer ", options.read_token);
  return header && header->size() == expected.size() &&
         CRYPTO_memcmp(header->data(), expected.data(), expected.size()) == 0;
}

void KvStoreServer::Impl::Handle(HttpRequest req, HttpReply reply) {
  if (req.method == "GET" && ReadOnly(ParseRoute(req.path).kind) && ReadAllowed(req)) {
    return reply.Send(Dispatch(ParseRoute(req.path), req));
  }
  if (signer && !KvRequestSigner::BodyMatches(*req.Header(KvRequestSigner::kHeader), req.body)) {
    HttpAdmission refused = Refuse(req, 403, "body differs from the one signed");
    return reply.Send(*std::move(refused.refusal));
  }
  const Route route = ParseRoute(req.path);
  // Deletes and adds carry a request id: a retry gets the first answer.
  std::optional<std::string> id;
  if (route.kind == Route::kAdd || (route.kind == Route::kKey && req.method == "DELETE")) {
    id = req.Query("id");
  }
  if (id) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = done.find(*id);
    if (it != done.end()) return reply.Send(it->second.response);
  }
  if (route.kind == Route::kKey && req.method == "GET") {
    if (std::optional<std::string> wait = req.Query("wait_ms")) {
      int64_t ms = 0;
      if (!ParseInt64(*wait, &ms) || ms < 0) {
        return reply.Send(Reply(400, "wait_ms must be a non-negative integer"));
      }
      std::lock_guard<std::mutex> lock(mu);
      auto j = jobs.find(route.job);
      if (!stopping && ms > 0 && (j == jobs.end() || !j->second.contains(route.key))) {
        const auto deadline = Clock::now() + std::min(milliseconds(ms), options.max_wait);
        waiters.emplace(std::make_pair(route.job, route.key),
                        Waiter{route.job, route.key, deadline, std::move(reply)});
        expire_cv.notify_one();
        return;
      }
    }
  }
  HttpResponse response = Dispatch(route, req);
  if (id) {
    std::lock_guard<std::mutex> lock(mu);
    const int64_t now = UnixMs();
    while (!done_age.empty() && (done_age.front().first < now - kRememberAnswers.count() ||
                                 done_age.size() > kMaxRememberedAnswers)) {
      done.erase(done_age.front().second);
      done_age.pop_front();
    }
    if (done.emplace(*id, Done{now, response}).second) done_age.emplace_back(now, *id);
  }
  reply.Send(std::move(response));
}

HttpResponse KvStoreServer::Impl::Dispatch(const Route& route, HttpRequest& req) {
  const std::string& m = req.method;
  switch (route.kind) {
    case Route::kHealth:
      if (m == "GET") return Reply(200, "ok");
      break;
    case Route::kMetrics:
      if (!options.metrics) return Reply(404, "this kv store serves no metrics");
      if (m == "GET") {
        HttpResponse response = Reply(200, options.metrics());
        response.content_type = "text/plain; version=0.0.4";
        return response;
      }
      break;
    case Route::kPage:
    case Route::kPageState: {
      const bool state = route.kind == Route::kPageState;
      if (state ? !options.page_state : options.page.empty()) {
        return Reply(404, "this kv store serves no job page");
      }
      if (m != "GET") break;
      HttpResponse response = Reply(200, state ? options.page_state() : options.page);
      response.content_type = state ? "application/json" : "text/html; charset=utf-8";
      response.headers.emplace_back("Cache-Control", "no-store");
      return response;
    }
    case Route::kList:
      if (m == "GET") return List(route, req.Query("prefix").value_or(""));
      break;
    case Route::kAdd:
      if (m == "POST") return Add(route, req.body);
      break;
    case Route::kKey:
      if (m == "GET") return Get(route);
      if (m == "PUT") return Put(route, std::move(req.body));
      if (m == "DELETE") return Delete(route);
      break;
    case Route::kNone:
      return Reply(404, absl::StrCat("no endpoint ", m, " ", req.path));
  }
  return Reply(405, absl::StrCat("method ", m, " not allowed on ", req.path));
}

HttpResponse KvStoreServer::Impl::Get(const Route& route) {
  std::lock_guard<std::mutex> lock(mu);
  if (stopping) return Reply(503, "kv store stopping");
  auto j = jobs.find(route.job);
  if (j != jobs.end()) {
    auto k = j->second.find(route.key);
    if (k != j->second.end()) return Reply(200, k->second);
  }
  return Reply(404, absl::StrCat("no key ", route.job, "/", route.key));
}

void KvStoreServer::Impl::TakeWaiters(const std::string& job, const std::string& key,
                                      std::vector<Waiter>* woken) {
  auto [first, last] = waiters.equal_range(std::make_pair(job, key));
  for (auto it = first; it != last; ++it) woken->push_back(std::move(it->second));
  waiters.erase(first, last);
}

HttpResponse KvStoreServer::Impl::Put(const Route& route, std::string value) {
  if (route.key.find('\n') != std::string::npos) return Reply(400, "key contains a newline");
  std::vector<Waiter> woken;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (stopping) return Reply(503, "kv store stopping");
    jobs[route.job][route.key] = value;
    TakeWaiters(route.job, route.key, &woken);
  }
  for (Waiter& w : woken) w.reply.Send(Reply(200, value));
  return Reply(200, "");
}

HttpResponse KvStoreServer::Impl::Delete(const Route& route) {
  std::lock_guard<std::mutex> lock(mu);
  if (stopping) return Reply(503, "kv store stopping");
  auto j = jobs.find(route.job);
  if (j == jobs.end() || j->second.erase(route.key) == 0) {
    return Reply(404, absl::StrCat("no key ", route.job, "/", route.key));
  }
  if (j->second.empty()) jobs.erase(j);
  return Reply(200, "");
}

HttpResponse KvStoreServer::Impl::List(const Route& route, const std::string& prefix) {
  std::string body;
  std::lock_guard<std::mutex> lock(mu);
  if (stopping) return Reply(503, "kv store stopping");
  auto j = jobs.find(route.job);
  if (j != jobs.end()) {
    for (auto it = j->second.lower_bound(prefix);
         it != j->second.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
      body.append(it->first);
      body.push_back('\n');
    }
  }
  return Reply(200, std::move(body));
}

HttpResponse KvStoreServer::Impl::Add(const Route& route, const std::string& body) {
  if (route.key.find('\n') != std::string::npos) return Reply(400, "key contains a newline");
  int64_t delta = 0;
  if (!ParseInt64(body, &delta)) return Reply(400, "add: body must be a decimal integer");
  const std::string which = absl::StrCat(route.job, "/", route.key);
  std::vector<Waiter> woken;
  std::string stored_value;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (stopping) return Reply(503, "kv store stopping");
    std::string& stored = jobs[route.job][route.key];
    int64_t value = 0;
    if (!stored.empty() && !ParseInt64(stored, &value)) {
      return Reply(409, absl::StrCat("add: value of ", which, " is not an integer"));
    }
    if ((delta > 0 && value > std::numeric_limits<int64_t>::max() - delta) ||
        (delta < 0 && value < std::numeric_limits<int64_t>::min() - delta)) {
      return Reply(409, absl::StrCat("add: ", which, " would overflow"));
    }
    stored = std::to_string(value + delta);
    stored_value = stored;
    TakeWaiters(route.job, route.key, &woken);
  }
  for (Waiter& w : woken) w.reply.Send(Reply(200, stored_value));
  return Reply(200, stored_value);
}

void KvStoreServer::Impl::ExpireLoop() {
  std::unique_lock<std::mutex> lock(mu);
  while (true) {
    std::vector<Waiter> expired;
    const auto now = Clock::now();
    auto next = Clock::time_point::max();
    for (auto it = waiters.begin(); it != waiters.end();) {
      if (stopping || it->second.deadline <= now) {
        expired.push_back(std::move(it->second));
        it = waiters.erase(it);
      } else {
        next = std::min(next, it->second.deadline);
        ++it;
      }
    }
    const bool stop = stopping;
    if (!expired.empty()) {
      lock.unlock();
      for (Waiter& w : expired) {
        w.reply.Send(stop ? Reply(503, "kv store stopping")
                          : Reply(404, absl::StrCat("no key ", w.job, "/", w.key)));
      }
      lock.lock();
      continue;
    }
    if (stop) return;
    if (next == Clock::time_point::max()) {
      expire_cv.wait(lock);
    } else {
      expire_cv.wait_until(lock, next);
    }
  }
}

KvStoreServer::KvStoreServer(KvStoreServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

KvStoreServer::~KvStoreServer() { Stop(); }

Status KvStoreServer::Start() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->started) {
      return Status::FailedPrecondition("kv store server already started", impl_->options.listen);
    }
  }
  Status started = impl_->http.Start();
  if (!started.ok()) return started.WithContext("kv store");
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->started = true;
  }
  impl_->expirer = std::thread([impl = impl_.get()] { impl->ExpireLoop(); });
  LOG(INFO) << "kv store serving on " << endpoint();
  return Status::OK();
}

void KvStoreServer::Stop() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  // Long polls are answered 503 by the expirer; then the server goes.
  impl_->expire_cv.notify_all();
  if (impl_->expirer.joinable()) impl_->expirer.join();
  impl_->http.Stop();
}

int KvStoreServer::port() const { return impl_->http.port(); }

std::string KvStoreServer::endpoint() const { return impl_->http.endpoint(); }

// ---------------------------------------------------------------- client

struct KvStoreClient::Impl {
  struct Reply {
    int code = 0;
    std::string body;
  };
  enum class Method { kGet, kPut, kDelete, kPost };

  // One request, on a pooled keep-alive connection, retried with backoff on
  // a transport failure until `hold` (how long the server may hold a long
  // poll) plus request_timeout has passed: every request is idempotent
  // (deletes and adds carry an id the server answers retries of from
  // memory). A connection refused outright (nothing listens there) is not
  // retried: the store is gone, and waiting would only delay the news.
  // `budget`: what the call may take besides `hold` (0: request_timeout).
  Result<Reply> Do(Method method, const std::string& path, const std::string& body,
                   milliseconds hold, const char* what, milliseconds budget = milliseconds(0));
  // Status for an answer other than 200: 404 -> NotFound, 503 ->
  // Unavailable, the rest -> InvalidArgument / Internal with the body.
  Status FromReply(const Reply& reply, const char* what, const std::string& which) const;

  std::string KeyPath(const std::string& key) const {
    return absl::StrCat("/kv/", UrlEncode(job, false), "/", UrlEncode(key, true));
  }
  // Waits for one key until `deadline`: OK, NotFound (deadline passed) or
  // the error that ended the wait.
  Status WaitOne(const std::string& key, Clock::time_point deadline);

  std::unique_ptr<httplib::Client> TakeConnection();
  void ReturnConnection(std::unique_ptr<httplib::Client> connection);

  // Fixed after construction.
  std::string endpoint;
  std::string job;
  KvStoreClientOptions options;
  std::optional<KvRequestSigner> signer;  // with options.auth
  Result<Endpoint> parsed = Status::InvalidArgument("unset");

  // Idle keep-alive connections; a call takes one (or makes one) and puts
  // it back after a complete answer.
  std::mutex pool_mu;
  std::vector<std::unique_ptr<httplib::Client>> idle;  // guarded by pool_mu
};

std::unique_ptr<httplib::Client> KvStoreClient::Impl::TakeConnection() {
  {
    std::lock_guard<std::mutex> lock(pool_mu);
    if (!idle.empty()) {
      std::unique_ptr<httplib::Client> connection = std::move(idle.back());
      idle.pop_back();
      return connection;
    }
  }
  auto connection = std::make_unique<httplib::Client>(parsed->host, parsed->port);
  connection->set_keep_alive(true);
  connection->set_tcp_nodelay(true);
  if (!options.source_address.empty()) connection->set_interface(options.source_address);
  return connection;
}

void KvStoreClient::Impl::ReturnConnection(std::unique_ptr<httplib::Client> connection) {
  std::lock_guard<std::mutex> lock(pool_mu);
  if (idle.size() < kMaxIdleConnections) idle.push_back(std::move(connection));
}

Result<KvStoreClient::Impl::Reply> KvStoreClient::Impl::Do(Method method, const std::string& path,
                                                           const std::string& body,
                                                           milliseconds hold, const char* what,
                                                           milliseconds budget) {
  if (!parsed.ok()) return parsed.status();
  FLEET_RETURN_IF_ERROR(CheckJob(job));
  static constexpr const char* kMethodNames[] = {"GET", "PUT", "DELETE", "POST"};
  const char* method_name = kMethodNames[static_cast<int>(method)];
  const auto start = Clock::now();
  const auto deadline =
      start + hold + (budget.count() > 0 ? budget : options.request_timeout);
  milliseconds backoff = kFirstBackoff;
  for (int attempt = 1;; ++attempt) {
    // Each attempt gets what is left of the budget, so the call as a whole
    // ends by its deadline.
    const auto left = std::max(std::chrono::duration_cast<milliseconds>(deadline - Clock::now()),
                               milliseconds(1));
    std::unique_ptr<httplib::Client> connection = TakeConnection();
    connection->set_connection_timeout(left);
    connection->set_read_timeout(left);
    connection->set_write_timeout(left);
    httplib::Headers headers;
    if (signer) headers.emplace(KvRequestSigner::kHeader, signer->Sign(method_name, path, body));
    httplib::Result res{nullptr, httplib::Error::Unknown};
    switch (method) {
      case Method::kGet:
        res = connection->Get(path, headers);
        break;
      case Method::kPut:
        res = connection->Put(path, headers, body, "application/octet-stream");
        break;
      case Method::kDelete:
        res = connection->Delete(path, headers);
        break;
      case Method::kPost:
        res = connection->Post(path, headers, body, "text/plain");
        break;
    }
    if (res) {
      ReturnConnection(std::move(connection));
      return Reply{res->status, res->body};
    }
    const httplib::Error error = res.error();
    const auto now = Clock::now();
    const bool refused = error == httplib::Error::Connection && ConnectRefused(*parsed);
    if (refused || now >= deadline) {
      const auto spent = std::chrono::duration_cast<milliseconds>(now - start);
      return Status::Unavailable(
          absl::StrCat("kv store ", what, " failed: ",
                       refused ? "connection refused (nothing listens there: is the job's "
                                 "fleetrun, which hosts the store, still running?)"
                               : httplib::to_string(error),
                       " after ", attempt, attempt == 1 ? " attempt" : " attempts", " over ",
                       spent.count(), " ms"),
          absl::StrCat(endpoint, " (job ", job, ")"));
    }
    // Transient (a reset, a timeout, a loaded peer): try again on a new
    // connection after a pause that doubles, the last one at the deadline.
    std::this_thread::sleep_for(
        std::min(backoff, std::chrono::duration_cast<milliseconds>(deadline - now)));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

Status KvStoreClient::Impl::FromReply(const Reply& reply, const char* what,
                                      const std::string& which) const {
  std::string where = absl::StrCat(which, " at ", endpoint);
  switch (reply.code) {
    case 200:
      return Status::OK();
    case 404:
      return Status::NotFound(absl::StrCat("kv store ", what, ": no such key"), where);
    case 503:
      return Status::Unavailable(absl::StrCat("kv store ", what, ": ", reply.body), where);
    case 400:
      return Status::InvalidArgument(absl::StrCat("kv store ", what, ": ", reply.body), where);
    case 409:
      return Status::FailedPrecondition(absl::StrCat("kv store ", what, ": ", reply.body), where);
    case 401:
      return Status::FailedPrecondition(
          absl::StrCat("kv store ", what,
                       ": refused, the store needs the job's credential and this process has "
                       "no job secret (set FLEET_JOB_SECRET or --job_secret_file; fleetrun "
                       "passes it to the processes it starts)"),
          where);
    case 403:
      return Status::FailedPrecondition(
          absl::StrCat("kv store ", what, ": ", reply.body, " (is this the job's secret?)"), where);
    default:
      return Status::Internal(
          absl::StrCat("kv store ", what, ": HTTP ", reply.code, " ", reply.body), where);
  }
}

Status KvStoreClient::Impl::WaitOne(const std::string& key, Clock::time_point deadline) {
  const std::string which = absl::StrCat(job, "/", key);
  while (true) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    milliseconds slice = std::clamp(left, milliseconds(0), kLongPollSlice);
    std::string path = absl::StrCat(KeyPath(key), "?wait_ms=", slice.count());
    FLEET_ASSIGN_OR_RETURN(Reply reply, Do(Method::kGet, path, "", slice, "wait"));
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
  return Set(key, value, milliseconds(0));
}

Status KvStoreClient::Set(const std::string& key, const std::string& value, milliseconds budget) {
  FLEET_RETURN_IF_ERROR(CheckKey(key));
  FLEET_ASSIGN_OR_RETURN(Impl::Reply reply, impl_->Do(Impl::Method::kPut, impl_->KeyPath(key), value,
                                                      milliseconds(0), "set", budget));
  return impl_->FromReply(reply, "set", absl::StrCat(job_id_, "/", key));
}

Result<std::string> KvStoreClient::Get(const std::string& key) { return Get(key, milliseconds(0)); }

Result<std::string> KvStoreClient::Get(const std::string& key, milliseconds budget) {
  FLEET_RETURN_IF_ERROR(CheckKey(key));
  FLEET_ASSIGN_OR_RETURN(Impl::Reply reply, impl_->Do(Impl::Method::kGet, impl_->KeyPath(key), "",
                                                      milliseconds(0), "get", budget));
  FLEET_RETURN_IF_ERROR(impl_->FromReply(reply, "get", absl::StrCat(job_id_, "/", key)));
  return std::move(reply.body);
}

Result<std::string> KvStoreClient::Metrics() {
  FLEET_ASSIGN_OR_RETURN(Impl::Reply reply,
                         impl_->Do(Impl::Method::kGet, "/metrics", "", milliseconds(0), "metrics"));
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
  // The id makes a retry after a lost answer get that answer, not NotFound.
  const std::string path = absl::StrCat(impl_->KeyPath(key), "?id=", RequestId());
  FLEET_ASSIGN_OR_RETURN(Impl::Reply reply,
                         impl_->Do(Impl::Method::kDelete, path, "", milliseconds(0), "delete"));
  return impl_->FromReply(reply, "delete", absl::StrCat(job_id_, "/", key));
}

Result<std::vector<std::string>> KvStoreClient::List(const std::string& prefix) {
  return List(prefix, milliseconds(0));
}

Result<std::vector<std::string>> KvStoreClient::List(const std::string& prefix,
                                                     milliseconds budget) {
  std::string path =
      absl::StrCat("/list/", UrlEncode(job_id_, false), "?prefix=", UrlEncode(prefix, false));
  FLEET_ASSIGN_OR_RETURN(Impl::Reply reply,
                         impl_->Do(Impl::Method::kGet, path, "", milliseconds(0), "list", budget));
  FLEET_RETURN_IF_ERROR(impl_->FromReply(reply, "list", absl::StrCat(job_id_, "/", prefix, "*")));
  std::vector<std::string> keys = absl::StrSplit(reply.body, '\n', absl::SkipEmpty());
  std::sort(keys.begin(), keys.end());
  return keys;
}

Result<int64_t> KvStoreClient::Add(const std::string& key, int64_t delta) {
  FLEET_RETURN_IF_ERROR(CheckKey(key));
  // The id makes a retry after a lost answer get that answer, not a second add.
  const std::string path = absl::StrCat("/add/", UrlEncode(job_id_, false), "/",
                                        UrlEncode(key, true), "?id=", RequestId());
  FLEET_ASSIGN_OR_RETURN(
      Impl::Reply reply,
      impl_->Do(Impl::Method::kPost, path, std::to_string(delta), milliseconds(0), "add"));
  FLEET_RETURN_IF_ERROR(impl_->FromReply(reply, "add", absl::StrCat(job_id_, "/", key)));
  int64_t value = 0;
  if (!ParseInt64(reply.body, &value)) {
    return Status::Corruption("kv store add: server answered a non-integer",
                              absl::StrCat(job_id_, "/", key, " = '", reply.body, "'"));
  }
  return value;
}

}  // namespace fleet
