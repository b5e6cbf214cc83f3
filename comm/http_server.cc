#include "comm/http_server.h"

#include <arpa/inet.h>
#include <glog/logging.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdarg>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "comm/endpoint.h"
#include "comm/http_listen.h"

namespace fleet {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How often the event thread looks for untrusted connections past their
// deadline (or whose peer closed) when nothing else wakes it.
constexpr milliseconds kJanitorTick{100};
// How long Stop() lets the 503 answers to waiting requests go out before it
// closes every connection.
constexpr milliseconds kDrainBudget{500};
// Bytes a stream hands libmicrohttpd per call.
constexpr size_t kStreamBlock = 16 << 10;

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decoding; a '%' not followed by two hex digits stays as is.
std::string PercentDecode(std::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && HexValue(s[i + 1]) >= 0 && HexValue(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(HexValue(s[i + 1]) * 16 + HexValue(s[i + 2])));
      i += 2;
    } else if (plus_is_space && s[i] == '+') {
      out.push_back(' ');
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

std::string PeerAddress(const sockaddr* addr) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (addr == nullptr) return text;
  if (addr->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, text, sizeof(text));
  } else if (addr->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr, text,
              sizeof(text));
  }
  return text;
}

HttpResponse Plain(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

}  // namespace

std::optional<std::string_view> HttpRequest::Header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (key.size() == name.size() && ::strncasecmp(key.data(), name.data(), name.size()) == 0) {
      return std::string_view(value);
    }
  }
  return std::nullopt;
}

std::optional<std::string> HttpRequest::Query(std::string_view name) const {
  const size_t q = target.find('?');
  if (q == std::string::npos) return std::nullopt;
  std::string_view rest = std::string_view(target).substr(q + 1);
  while (!rest.empty()) {
    const size_t amp = rest.find('&');
    std::string_view pair = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    const size_t eq = pair.find('=');
    if (PercentDecode(pair.substr(0, eq), true) != name) continue;
    return eq == std::string_view::npos ? std::string() : PercentDecode(pair.substr(eq + 1), true);
  }
  return std::nullopt;
}

// One request's answer, shared by the event thread (through the request's
// state), its HttpReply and its HttpStream.
struct HttpExchange {
  // The server's event-thread wake-up (an eventfd): libmicrohttpd, polled
  // from our own loop, does not wake it when a connection is resumed.
  int wake_fd = -1;  // fixed at creation
  std::mutex mu;
  // Null once the request completed (answered, failed or the server
  // stopped): the connection may be gone.
  MHD_Connection* connection = nullptr;  // guarded by mu
  // The event thread suspended the connection to wait for the answer (or
  // for stream bytes); whoever clears it resumes the connection.
  bool suspended = false;  // guarded by mu
  bool answered = false;   // Send or Stream was called; guarded by mu
  // Stop() answered for the handler, whose own answer is then dropped.
  bool answered_by_server = false;       // guarded by mu
  bool gone = false;                     // the client is gone or the server stopping; guarded by mu
  std::optional<HttpResponse> response;  // the answer until queued; guarded by mu
  // Streams: the head until queued, then bytes not yet handed over.
  std::optional<HttpResponse> stream_head;  // guarded by mu
  bool streaming = false;                   // guarded by mu
  std::string pending;                      // guarded by mu
  size_t pending_offset = 0;                // guarded by mu
  bool stream_closed = false;               // guarded by mu

  // REQUIRES: mu held. Hands the connection back to the event thread if it
  // is waiting for this exchange. Under mu, so that Stop() (which takes mu
  // of every exchange before it stops the daemon) never finds a resume half
  // done; libmicrohttpd calls none of our callbacks under its own lock, so
  // the two locks are always taken in this order.
  void ResumeLocked() {
    if (!suspended) return;
    suspended = false;
    MHD_resume_connection(connection);
    const uint64_t one = 1;
    // Should the write fail (never, for an eventfd), the loop still runs
    // within its tick.
    [[maybe_unused]] const ssize_t n = ::write(wake_fd, &one, sizeof(one));
  }
};

HttpStream::HttpStream(std::shared_ptr<HttpExchange> exchange) : exchange_(std::move(exchange)) {}

bool HttpStream::Write(std::string_view chunk) {
  std::lock_guard<std::mutex> lock(exchange_->mu);
  if (exchange_->gone || exchange_->stream_closed) return false;
  exchange_->pending.append(chunk);
  exchange_->ResumeLocked();
  return true;
}

void HttpStream::Close() {
  std::lock_guard<std::mutex> lock(exchange_->mu);
  if (exchange_->stream_closed) return;
  exchange_->stream_closed = true;
  exchange_->ResumeLocked();
}

bool HttpStream::open() const {
  std::lock_guard<std::mutex> lock(exchange_->mu);
  return !exchange_->gone && !exchange_->stream_closed;
}

HttpReply::HttpReply(std::shared_ptr<HttpExchange> exchange) : exchange_(std::move(exchange)) {}
HttpReply::HttpReply(HttpReply&&) noexcept = default;
HttpReply& HttpReply::operator=(HttpReply&& other) noexcept {
  if (this != &other) {
    if (exchange_ != nullptr) Send(Plain(500, "the server dropped this request unanswered"));
    exchange_ = std::move(other.exchange_);
  }
  return *this;
}

HttpReply::~HttpReply() {
  if (exchange_ == nullptr) return;
  bool answered;
  {
    std::lock_guard<std::mutex> lock(exchange_->mu);
    answered = exchange_->answered && !exchange_->answered_by_server;
  }
  if (!answered) Send(Plain(500, "the server dropped this request unanswered"));
}

void HttpReply::Send(HttpResponse response) {
  CHECK(exchange_ != nullptr) << "HttpReply::Send on a moved-from reply";
  std::lock_guard<std::mutex> lock(exchange_->mu);
  if (exchange_->answered_by_server) return;
  CHECK(!exchange_->answered) << "HttpReply answered twice";
  exchange_->answered = true;
  if (exchange_->gone) return;
  exchange_->response = std::move(response);
  exchange_->ResumeLocked();
}

std::shared_ptr<HttpStream> HttpReply::Stream(HttpResponse head) {
  CHECK(exchange_ != nullptr) << "HttpReply::Stream on a moved-from reply";
  {
    std::lock_guard<std::mutex> lock(exchange_->mu);
    CHECK(exchange_->answered_by_server || !exchange_->answered) << "HttpReply answered twice";
    exchange_->answered = true;
    exchange_->streaming = true;
    if (!exchange_->gone && !exchange_->answered_by_server) {
      exchange_->stream_head = std::move(head);
      exchange_->ResumeLocked();
    }
  }
  return std::make_shared<HttpStream>(exchange_);
}

bool HttpReply::open() const {
  std::lock_guard<std::mutex> lock(exchange_->mu);
  return !exchange_->gone;
}

// ------------------------------------------------------------------ server

struct HttpServer::Impl {
  // One connection, known to the event thread only.
  struct Connection {
    MHD_Connection* mhd = nullptr;
    int fd = -1;
    std::string peer;
    bool trusted = false;
    // Its request is read and being answered (until then it must finish
    // within untrusted_request_timeout, when untrusted).
    bool handling = false;
    Clock::time_point idle_since;                    // connected, or its last answer sent
    bool cut = false;                                // shut down by us; libmicrohttpd will close it
    std::list<Connection*>::iterator untrusted_pos;  // valid while !trusted
  };

  // One request, owned by libmicrohttpd's request context.
  struct Request {
    std::shared_ptr<HttpExchange> exchange = std::make_shared<HttpExchange>();
    HttpRequest request;
    Connection* connection = nullptr;
    bool admitted = false;
    bool dispatched = false;
    bool queued = false;
    bool trusted = false;
    uint64_t body_budget = 0;
    uint64_t reserved = 0;  // of max_untrusted_body_bytes
  };

  explicit Impl(HttpServerOptions o) : options(std::move(o)) {}

  // libmicrohttpd's callbacks (event thread).
  static void* OnUri(void* cls, const char* uri, MHD_Connection* connection);
  static MHD_Result OnAccess(void* cls, MHD_Connection* connection, const char* url,
                             const char* method, const char* version, const char* upload_data,
                             size_t* upload_data_size, void** request_context);
  static void OnCompleted(void* cls, MHD_Connection* connection, void** request_context,
                          MHD_RequestTerminationCode code);
  static void OnConnection(void* cls, MHD_Connection* connection, void** socket_context,
                           MHD_ConnectionNotificationCode code);
  static ssize_t OnStreamRead(void* cls, uint64_t pos, char* buf, size_t max);
  static void OnStreamFree(void* cls);
  static void OnLog(void* cls, const char* format, va_list args);

  MHD_Result Admit(MHD_Connection* mhd, Request& rq);
  MHD_Result Deliver(MHD_Connection* mhd, Request& rq);
  void Queue(MHD_Connection* mhd, Request& rq, const HttpResponse& response);
  void Release(Request& rq);
  void Trust(Connection& c);
  // Closes the oldest idle untrusted connection (of `peer` when given) other
  // than `keep`; false when there is none.
  bool EvictOldestIdle(const std::string* peer, const Connection* keep);
  // Cuts untrusted connections past their deadline and connections whose
  // peer has closed its side.
  void CutDeadConnections();
  Clock::time_point last_scan;  // of the untrusted connections; event thread only
  void Loop();
  void Drain();

  const HttpServerOptions options;

  // Fixed once Start() returned OK.
  MHD_Daemon* daemon = nullptr;
  int epoll_fd = -1;
  int wake_fd = -1;
  std::string host;
  int port = -1;
  std::thread loop;

  std::atomic<bool> stopping{false};
  std::atomic<size_t> open_connections{0};
  std::atomic<size_t> open_untrusted{0};

  // Event thread only.
  std::list<Connection*> untrusted;  // oldest first
  absl::flat_hash_map<std::string, size_t> untrusted_per_peer;
  uint64_t untrusted_body_bytes = 0;
  std::unordered_set<Request*> live;  // requests not yet completed
  // Connections answered since the last janitor pass (see PeerEnded).
  std::unordered_set<Connection*> just_answered;
};

void* HttpServer::Impl::OnUri(void* cls, const char* uri, MHD_Connection* connection) {
  auto* self = static_cast<Impl*>(cls);
  auto* rq = new Request();
  rq->request.target = uri;
  const MHD_ConnectionInfo* info =
      MHD_get_connection_info(connection, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  rq->connection = info != nullptr ? static_cast<Connection*>(info->socket_context) : nullptr;
  {
    std::lock_guard<std::mutex> lock(rq->exchange->mu);
    rq->exchange->connection = connection;
    rq->exchange->wake_fd = self->wake_fd;
  }
  self->live.insert(rq);
  return rq;
}

MHD_Result HttpServer::Impl::OnAccess(void* cls, MHD_Connection* connection, const char* /*url*/,
                                      const char* method, const char* /*version*/,
                                      const char* upload_data, size_t* upload_data_size,
                                      void** request_context) {
  auto* self = static_cast<Impl*>(cls);
  auto* rq = static_cast<Request*>(*request_context);
  if (rq == nullptr) return MHD_NO;  // OnUri always sets it
  if (!rq->admitted) {
    rq->request.method = method;
    return self->Admit(connection, *rq);
  }
  if (*upload_data_size > 0) {
    const size_t n = *upload_data_size;
    *upload_data_size = 0;
    if (rq->queued) return MHD_YES;  // refused: libmicrohttpd discards the rest
    if (rq->request.body.size() + n > rq->body_budget) return MHD_NO;  // a chunked body past it
    if (!rq->trusted && rq->request.body.size() + n > rq->reserved) {
      const uint64_t more = rq->request.body.size() + n - rq->reserved;
      if (self->untrusted_body_bytes + more > self->options.max_untrusted_body_bytes) return MHD_NO;
      self->untrusted_body_bytes += more;
      rq->reserved += more;
    }
    rq->request.body.append(upload_data, n);
    return MHD_YES;
  }
  if (rq->queued) return MHD_YES;
  if (!rq->dispatched) {
    rq->dispatched = true;
    if (rq->connection != nullptr) rq->connection->handling = true;
    if (self->options.handle) {
      self->options.handle(std::move(rq->request), HttpReply(rq->exchange));
    } else {
      HttpReply(rq->exchange).Send(Plain(404, "no handler"));
    }
  }
  return self->Deliver(connection, *rq);
}

MHD_Result HttpServer::Impl::Admit(MHD_Connection* mhd, Request& rq) {
  rq.admitted = true;
  HttpRequest& req = rq.request;
  req.path = PercentDecode(std::string_view(req.target).substr(0, req.target.find('?')), false);
  if (rq.connection != nullptr) req.remote_address = rq.connection->peer;
  MHD_get_connection_values(
      mhd, MHD_HEADER_KIND,
      [](void* cls, MHD_ValueKind, const char* key, const char* value) -> MHD_Result {
        static_cast<HttpRequest*>(cls)->headers.emplace_back(key, value != nullptr ? value : "");
        return MHD_YES;
      },
      &req);
  if (std::optional<std::string_view> length = req.Header("Content-Length")) {
    uint64_t n = 0;
    const auto [end, ec] = std::from_chars(length->data(), length->data() + length->size(), n);
    if (ec == std::errc() && end == length->data() + length->size()) req.content_length = n;
  }
  HttpAdmission admission;
  if (options.admit) {
    admission = options.admit(req);
  } else {
    admission.max_body_bytes = options.max_untrusted_body_bytes;
  }
  if (admission.refusal) {
    Queue(mhd, rq, *admission.refusal);
    return MHD_YES;
  }
  rq.trusted = admission.trusted;
  rq.body_budget = admission.max_body_bytes;
  if (rq.trusted && rq.connection != nullptr) Trust(*rq.connection);
  const uint64_t declared = req.content_length.value_or(0);
  if (declared > rq.body_budget) {
    Queue(mhd, rq,
          Plain(413, absl::StrCat("request body of ", declared,
                                  " bytes; this server takes at most ", rq.body_budget, " here")));
    return MHD_YES;
  }
  if (!rq.trusted && declared > 0) {
    if (untrusted_body_bytes + declared > options.max_untrusted_body_bytes) {
      Queue(mhd, rq, Plain(503, "too many request bodies in flight; try again"));
      return MHD_YES;
    }
    untrusted_body_bytes += declared;
    rq.reserved = declared;
  }
  return MHD_YES;
}

MHD_Result HttpServer::Impl::Deliver(MHD_Connection* mhd, Request& rq) {
  HttpExchange& ex = *rq.exchange;
  std::unique_lock<std::mutex> lock(ex.mu);
  if (ex.response) {
    HttpResponse response = std::move(*ex.response);
    ex.response.reset();
    lock.unlock();
    Queue(mhd, rq, response);
    return MHD_YES;
  }
  if (ex.stream_head) {
    HttpResponse head = std::move(*ex.stream_head);
    ex.stream_head.reset();
    lock.unlock();
    // The response holds a reference to the exchange until it is freed.
    auto* hold = new std::shared_ptr<HttpExchange>(rq.exchange);
    MHD_Response* response = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, kStreamBlock, &Impl::OnStreamRead, hold, &Impl::OnStreamFree);
    if (response == nullptr) {
      delete hold;
      return MHD_NO;
    }
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, head.content_type.c_str());
    for (const auto& [key, value] : head.headers) {
      MHD_add_response_header(response, key.c_str(), value.c_str());
    }
    rq.queued = true;
    const MHD_Result queued = MHD_queue_response(mhd, head.status, response);
    MHD_destroy_response(response);
    return queued;
  }
  if (ex.gone) return MHD_NO;  // the server is stopping and nothing answered
  // No answer yet: wait for one without holding the event thread. Suspended
  // under the lock, so an answer arriving now finds `suspended` set.
  ex.suspended = true;
  MHD_suspend_connection(mhd);
  return MHD_YES;
}

void HttpServer::Impl::Queue(MHD_Connection* mhd, Request& rq, const HttpResponse& r) {
  MHD_Response* response = MHD_create_response_from_buffer(
      r.body.size(), const_cast<char*>(r.body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return;  // out of memory: libmicrohttpd closes the connection
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, r.content_type.c_str());
  for (const auto& [key, value] : r.headers) {
    MHD_add_response_header(response, key.c_str(), value.c_str());
  }
  rq.queued = true;
  MHD_queue_response(mhd, r.status, response);
  MHD_destroy_response(response);
}

ssize_t HttpServer::Impl::OnStreamRead(void* cls, uint64_t /*pos*/, char* buf, size_t max) {
  HttpExchange& ex = **static_cast<std::shared_ptr<HttpExchange>*>(cls);
  std::lock_guard<std::mutex> lock(ex.mu);
  const size_t available = ex.pending.size() - ex.pending_offset;
  if (available > 0) {
    const size_t n = std::min(available, max);
    std::memcpy(buf, ex.pending.data() + ex.pending_offset, n);
    ex.pending_offset += n;
    if (ex.pending_offset == ex.pending.size()) {
      ex.pending.clear();
      ex.pending_offset = 0;
    }
    return static_cast<ssize_t>(n);
  }
  if (ex.stream_closed || ex.gone) return MHD_CONTENT_READER_END_OF_STREAM;
  ex.suspended = true;
  MHD_suspend_connection(ex.connection);
  return 0;
}

void HttpServer::Impl::OnStreamFree(void* cls) {
  delete static_cast<std::shared_ptr<HttpExchange>*>(cls);
}

void HttpServer::Impl::Release(Request& rq) {
  untrusted_body_bytes -= rq.reserved;
  rq.reserved = 0;
}

void HttpServer::Impl::OnCompleted(void* cls, MHD_Connection* /*connection*/,
                                   void** request_context, MHD_RequestTerminationCode /*code*/) {
  auto* self = static_cast<Impl*>(cls);
  auto* rq = static_cast<Request*>(*request_context);
  if (rq == nullptr) return;
  *request_context = nullptr;
  {
    std::lock_guard<std::mutex> lock(rq->exchange->mu);
    rq->exchange->gone = true;
    rq->exchange->connection = nullptr;
  }
  self->Release(*rq);
  if (rq->connection != nullptr) {
    rq->connection->handling = false;
    rq->connection->idle_since = Clock::now();
    self->just_answered.insert(rq->connection);
    if (!rq->connection->trusted) {
      // Idle again: to the back of the eviction order.
      self->untrusted.splice(self->untrusted.end(), self->untrusted, rq->connection->untrusted_pos);
    }
  }
  self->live.erase(rq);
  delete rq;
}

void HttpServer::Impl::OnConnection(void* cls, MHD_Connection* connection, void** socket_context,
                                    MHD_ConnectionNotificationCode code) {
  auto* self = static_cast<Impl*>(cls);
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    auto* c = new Connection();
    c->mhd = connection;
    if (const MHD_ConnectionInfo* fd =
            MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD)) {
      c->fd = fd->connect_fd;
    }
    if (const MHD_ConnectionInfo* addr =
            MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS)) {
      c->peer = PeerAddress(addr->client_addr);
    }
    c->idle_since = Clock::now();
    c->untrusted_pos = self->untrusted.insert(self->untrusted.end(), c);
    const size_t from_peer = ++self->untrusted_per_peer[c->peer];
    *socket_context = c;
    self->open_connections.fetch_add(1);
    self->open_untrusted.fetch_add(1);
    // Over a cap: make room by the oldest idle stranger, else turn this one
    // away (every untrusted connection is busy with a request).
    bool over_peer = from_peer > self->options.max_untrusted_connections_per_peer;
    bool over_all = self->untrusted.size() > self->options.max_untrusted_connections;
    if (over_peer && !self->EvictOldestIdle(&c->peer, c)) over_all = true;
    if (over_all && !self->EvictOldestIdle(nullptr, c)) {
      c->cut = true;
      ::shutdown(c->fd, SHUT_RDWR);
    }
    return;
  }
  auto* c = static_cast<Connection*>(*socket_context);
  if (c == nullptr) return;
  *socket_context = nullptr;
  self->just_answered.erase(c);
  if (!c->trusted) {
    self->untrusted.erase(c->untrusted_pos);
    auto it = self->untrusted_per_peer.find(c->peer);
    if (it != self->untrusted_per_peer.end() && --it->second == 0) {
      self->untrusted_per_peer.erase(it);
    }
    self->open_untrusted.fetch_sub(1);
  }
  self->open_connections.fetch_sub(1);
  delete c;
}

void HttpServer::Impl::Trust(Connection& c) {
  if (c.trusted) return;
  c.trusted = true;
  untrusted.erase(c.untrusted_pos);
  auto it = untrusted_per_peer.find(c.peer);
  if (it != untrusted_per_peer.end() && --it->second == 0) untrusted_per_peer.erase(it);
  open_untrusted.fetch_sub(1);
}

bool HttpServer::Impl::EvictOldestIdle(const std::string* peer, const Connection* keep) {
  for (Connection* c : untrusted) {
    if (c == keep || c->cut || c->handling) continue;
    if (peer != nullptr && c->peer != *peer) continue;
    // As in CutDeadConnections.
    c->cut = true;
    ::shutdown(c->fd, SHUT_RDWR);
    LOG_EVERY_N(WARNING, 100) << options.name << ": closed an idle untrusted connection from "
                              << c->peer << " to make room (" << google::COUNTER << " so far)";
    return true;
  }
  return false;
}

namespace {

// Whether the peer closed its side. A peer that half-closes right behind
// its request (its FIN in the same segment as the data) gives
// libmicrohttpd's edge-triggered epoll no event of its own, so the
// connection would sit until a timeout; a peek shows it.
bool PeerEnded(int fd) {
  char byte;
  return ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

}  // namespace

void HttpServer::Impl::CutDeadConnections() {
  auto cut = [](Connection* c) {
    // libmicrohttpd sees the end on its next event and closes the
    // connection; the descriptor stays its own (only it closes it, on this
    // thread).
    c->cut = true;
    ::shutdown(c->fd, SHUT_RDWR);
  };
  for (Connection* c : just_answered) {
    if (!c->cut && !c->handling && PeerEnded(c->fd)) cut(c);
  }
  just_answered.clear();
  // The strangers, once a tick: a peek each.
  const auto now = Clock::now();
  if (now - last_scan < kJanitorTick) return;
  last_scan = now;
  const auto deadline = now - options.untrusted_request_timeout;
  for (Connection* c : untrusted) {
    // Busy ones (a request being answered) are the handler's to bound.
    if (c->cut || c->handling) continue;
    if (c->idle_since <= deadline || PeerEnded(c->fd)) cut(c);
  }
}

void HttpServer::Impl::OnLog(void* cls, const char* format, va_list args) {
  char text[512];
  std::vsnprintf(text, sizeof(text), format, args);
  std::string_view line(text);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  // A stranger can make libmicrohttpd complain at will: rate-limited.
  LOG_EVERY_N(WARNING, 100) << static_cast<Impl*>(cls)->options.name << ": " << line << " ("
                            << google::COUNTER << " so far)";
}

void HttpServer::Impl::Loop() {
  while (!stopping.load()) {
    int timeout_ms = static_cast<int>(kJanitorTick.count());
    MHD_UNSIGNED_LONG_LONG mhd_timeout = 0;
    if (MHD_get_timeout(daemon, &mhd_timeout) == MHD_YES) {
      timeout_ms = static_cast<int>(std::min<MHD_UNSIGNED_LONG_LONG>(mhd_timeout, timeout_ms));
    }
    pollfd fds[2] = {{epoll_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    ::poll(fds, 2, timeout_ms);
    if (fds[1].revents != 0) {
      uint64_t wakes = 0;
      [[maybe_unused]] const ssize_t n = ::read(wake_fd, &wakes, sizeof(wakes));
    }
    MHD_run(daemon);
    CutDeadConnections();
  }
  Drain();
}

void HttpServer::Impl::Drain() {
  // No new connections; every request waiting for its answer gets 503 and
  // every stream ends, then what was queued gets a short while to go out.
  const MHD_socket listen_fd = MHD_quiesce_daemon(daemon);
  for (Request* rq : live) {
    std::lock_guard<std::mutex> lock(rq->exchange->mu);
    if (!rq->exchange->answered) {
      rq->exchange->answered = true;
      rq->exchange->answered_by_server = true;
      rq->exchange->response = Plain(503, absl::StrCat(options.name, " stopping"));
    }
    rq->exchange->stream_closed = true;
    rq->exchange->ResumeLocked();
  }
  const auto deadline = Clock::now() + kDrainBudget;
  while (!live.empty() && Clock::now() < deadline) {
    pollfd fds[1] = {{epoll_fd, POLLIN, 0}};
    ::poll(fds, 1, 10);
    MHD_run(daemon);
  }
  // Whatever is still suspended must be resumed before the daemon stops.
  for (Request* rq : live) {
    std::lock_guard<std::mutex> lock(rq->exchange->mu);
    rq->exchange->gone = true;
    rq->exchange->ResumeLocked();
  }
  MHD_stop_daemon(daemon);
  daemon = nullptr;
  if (listen_fd != MHD_INVALID_SOCKET) ::close(listen_fd);
}

HttpServer::HttpServer(HttpServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

HttpServer::~HttpServer() { Stop(); }

Status HttpServer::Start() {
  Impl& s = *impl_;
  if (s.daemon != nullptr) return Status::FailedPrecondition("already started", s.options.name);
  FLEET_ASSIGN_OR_RETURN(Endpoint ep,
                         ParseEndpoint(s.options.listen, s.options.name + " listen address",
                                       EndpointParseOptions{.allow_port_zero = true}));
  FLEET_ASSIGN_OR_RETURN(ListeningSocket listener, ListenTcp(ep.host, ep.port));
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  const size_t fd_room =
      files.rlim_cur == RLIM_INFINITY ? s.options.max_connections : files.rlim_cur * 3 / 4;
  const unsigned connection_limit =
      static_cast<unsigned>(std::max<size_t>(16, std::min(s.options.max_connections, fd_room)));
  s.wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s.wake_fd < 0) {
    ::close(listener.fd);
    return Status::IOError(absl::StrCat("eventfd: ", std::strerror(errno)), s.options.name);
  }
  // libmicrohttpd reads on its own only what fits the connection's buffer
  // (max_header_bytes); the body comes to OnAccess in pieces.
  s.daemon = MHD_start_daemon(
      MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG, 0, nullptr, nullptr,
      &Impl::OnAccess, &s, MHD_OPTION_EXTERNAL_LOGGER, &Impl::OnLog, &s, MHD_OPTION_LISTEN_SOCKET,
      listener.fd, MHD_OPTION_URI_LOG_CALLBACK, &Impl::OnUri, &s, MHD_OPTION_NOTIFY_COMPLETED,
      &Impl::OnCompleted, &s, MHD_OPTION_NOTIFY_CONNECTION, &Impl::OnConnection, &s,
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, s.options.max_header_bytes, MHD_OPTION_CONNECTION_LIMIT,
      connection_limit, MHD_OPTION_CONNECTION_TIMEOUT,
      static_cast<unsigned>(s.options.idle_timeout.count()), MHD_OPTION_END);
  if (s.daemon == nullptr) {
    ::close(listener.fd);
    ::close(s.wake_fd);
    s.wake_fd = -1;
    return Status::Unavailable("cannot start the HTTP server (libmicrohttpd refused its options)",
                               s.options.listen);
  }
  const MHD_DaemonInfo* epoll = MHD_get_daemon_info(s.daemon, MHD_DAEMON_INFO_EPOLL_FD);
  s.epoll_fd = epoll != nullptr ? epoll->epoll_fd : -1;
  CHECK_GE(s.epoll_fd, 0) << "libmicrohttpd started with MHD_USE_EPOLL has no epoll descriptor";
  s.host = ep.host;
  s.port = listener.port;
  s.loop = std::thread([&s] { s.Loop(); });
  VLOG(1) << s.options.name << " serving on " << endpoint() << " (at most " << connection_limit
          << " connections)";
  return Status::OK();
}

void HttpServer::Stop() {
  Impl& s = *impl_;
  if (!s.loop.joinable()) return;
  s.stopping.store(true);
  const uint64_t one = 1;
  // Should the write fail, the loop still wakes within kJanitorTick.
  [[maybe_unused]] const ssize_t written = ::write(s.wake_fd, &one, sizeof(one));
  s.loop.join();
  ::close(s.wake_fd);
  s.wake_fd = -1;
}

int HttpServer::port() const {
  CHECK_GT(impl_->port, 0) << "HttpServer::port() before a successful Start()";
  return impl_->port;
}

std::string HttpServer::endpoint() const { return absl::StrCat(impl_->host, ":", impl_->port); }

size_t HttpServer::connections() const { return impl_->open_connections.load(); }
size_t HttpServer::untrusted_connections() const { return impl_->open_untrusted.load(); }

uint64_t RaiseOpenFileLimit() {
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) != 0) return 0;
  if (files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
    ::getrlimit(RLIMIT_NOFILE, &files);
  }
  return files.rlim_cur;
}

}  // namespace fleet
