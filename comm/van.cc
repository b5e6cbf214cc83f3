#include "comm/van.h"

#include <openssl/crypto.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "comm/endpoint.h"
#include "comm/van_auth.h"

namespace fleet {
namespace {

// Frames smaller than this are copied into the zmq message: a zero-copy
// frame costs an allocation for its release hook, which is more than
// copying a few hundred bytes.
constexpr size_t kZeroCopyMinBytes = 256;

void ReleaseSharedOwner(void* /*data*/, void* hint) {
  delete static_cast<std::shared_ptr<void>*>(hint);
}

zmq::message_t ToZmq(const Bytes& frame) {
  if (frame.size() < kZeroCopyMinBytes) return zmq::message_t(frame.data(), frame.size());
  return zmq::message_t(frame.data(), frame.size(), &ReleaseSharedOwner,
                        new std::shared_ptr<void>(frame.owner()));
}

// A received part becomes a Bytes view that owns the zmq message.
Bytes FromZmq(zmq::message_t&& part) {
  auto owner = std::make_shared<zmq::message_t>(std::move(part));
  return Bytes(static_cast<char*>(owner->data()), owner->size(), owner);
}

// The ZAP handler (ZeroMQ RFC 27) of one context: ZeroMQ asks it, over
// inproc "zeromq.zap.01", whether a client that completed its CURVE
// handshake may in. It admits exactly the job's client public key. It runs
// on its own thread: a handshake waits for its answer, and the Van's I/O
// thread must not.
class ZapHandler {
 public:
  // Binds the handler's socket on `context` (one per context) and starts
  // its thread. Must run before the CURVE server socket accepts.
  static Result<std::unique_ptr<ZapHandler>> Start(zmq::context_t& context,
                                                   const std::string& client_public_z85) {
    std::unique_ptr<ZapHandler> h(new ZapHandler(context));
    h->admitted_.resize(32);
    if (zmq_z85_decode(reinterpret_cast<uint8_t*>(h->admitted_.data()),
                       client_public_z85.c_str()) == nullptr) {
      return Status::Internal("bad Z85 client key");
    }
    h->stop_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (h->stop_fd_ < 0) return Status::IOError("eventfd failed", std::strerror(errno));
    h->socket_.set(zmq::sockopt::linger, 0);
    try {
      h->socket_.bind("inproc://zeromq.zap.01");
    } catch (const zmq::error_t& e) {
      return Status::Internal(absl::StrCat("cannot bind the ZAP handler: ", e.what()));
    }
    ZapHandler* raw = h.get();
    h->thread_ = std::thread([raw] { raw->Loop(); });
    return h;
  }

  ~ZapHandler() {
    if (thread_.joinable()) {
      const uint64_t one = 1;
      [[maybe_unused]] ssize_t n = ::write(stop_fd_, &one, sizeof(one));
      thread_.join();
    }
    socket_.close();
    if (stop_fd_ >= 0) ::close(stop_fd_);
  }

  uint64_t refused() const { return refused_.load(); }

 private:
  explicit ZapHandler(zmq::context_t& context) : socket_(context, zmq::socket_type::rep) {}

  void Loop() {
    zmq_pollitem_t items[] = {{socket_.handle(), -1, ZMQ_POLLIN, 0},
                              {nullptr, stop_fd_, ZMQ_POLLIN, 0}};
    while (true) {
      try {
        zmq::poll(items, 2, std::chrono::milliseconds(-1));
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        LOG(ERROR) << "van: ZAP handler poll failed: " << e.what();
        return;
      }
      if (items[1].revents & ZMQ_POLLIN) return;
      if (items[0].revents & ZMQ_POLLIN) Answer();
    }
  }

  // Request frames: version, request id, domain, address, routing id,
  // mechanism, credentials...; reply: version, request id, status code,
  // status text, user id, metadata.
  void Answer() {
    std::vector<zmq::message_t> request;
    bool more = true;
    while (more) {
      zmq::message_t part;
      if (!socket_.recv(part, zmq::recv_flags::dontwait)) break;
      more = part.more();
      request.push_back(std::move(part));
    }
    if (request.size() < 6) return;  // not from libzmq; REP needs no reply to drop it
    const bool admit = request.size() >= 7 && request[5].to_string_view() == "CURVE" &&
                       request[6].to_string_view() == admitted_;
    if (!admit) {
      refused_.fetch_add(1);
      LOG_EVERY_N(WARNING, 100) << "van: refused a client at " << request[3].to_string_view()
                                << " that does not hold this job's key (" << google::COUNTER
                                << " so far)";
    }
    const std::string_view reply[] = {"1.0", request[1].to_string_view(), admit ? "200" : "400",
                                      admit ? "OK" : "not this job's key", "", ""};
    for (size_t i = 0; i < 6; ++i) {
      socket_.send(zmq::buffer(reply[i]), i + 1 < 6 ? zmq::send_flags::sndmore
                                                    : zmq::send_flags::none);
    }
  }

  zmq::socket_t socket_;  // this handler's thread only, after Start
  std::string admitted_;  // 32-byte client public key; fixed after Start
  int stop_fd_ = -1;
  std::atomic<uint64_t> refused_{0};
  std::thread thread_;
};

// CURVE options of an outgoing connection: present the job's client key,
// accept only the job's server key.
void SetCurveClient(zmq::socket_t& s, const JobAuth& auth) {
  s.set(zmq::sockopt::curve_serverkey, auth.curve_server().public_key);
  s.set(zmq::sockopt::curve_publickey, auth.curve_client().public_key);
  s.set(zmq::sockopt::curve_secretkey, auth.curve_client().secret_key);
}

// Messages queued per peer on the bound socket before ZeroMQ stops reading
// from that peer (see Bind).
constexpr int kRouterReceiveHighWater = 65536;
// Messages the I/O thread takes from one socket before it looks at the
// others (and at Stop) again.
constexpr int kMaxMessagesPerPass = 1024;

void SetCommonOptions(zmq::socket_t& s, const VanOptions& o) {
  s.set(zmq::sockopt::linger, 0);
  // Flow control is the application's (request windows); a ZeroMQ high-water
  // mark would silently drop (ROUTER) or block (DEALER) instead.
  s.set(zmq::sockopt::sndhwm, 0);
  s.set(zmq::sockopt::rcvhwm, 0);
  s.set(zmq::sockopt::heartbeat_ivl, static_cast<int>(o.heartbeat_interval.count()));
  s.set(zmq::sockopt::heartbeat_timeout, static_cast<int>(o.heartbeat_timeout.count()));
  s.set(zmq::sockopt::heartbeat_ttl, static_cast<int>(o.heartbeat_timeout.count()));
  s.set(zmq::sockopt::maxmsgsize, o.max_message_bytes);
}

// A received message's ZeroMQ parts (routing id, header, frames, trailer):
// inline, so receiving one costs no allocation for the list.
using ReceivedParts = absl::InlinedVector<zmq::message_t, 6>;

// What a message's tag covers (van_auth::Trailer): its serialized header,
// then its frames. Inline: a message rarely has more than a few frames,
// and a tag should not cost allocations.
using SignedParts = absl::InlinedVector<van_auth::Part, 8>;
SignedParts PartsToSign(const std::string& header, const std::vector<Bytes>& frames) {
  SignedParts parts{{header.data(), header.size()}};
  for (const Bytes& f : frames) parts.push_back({f.data(), f.size()});
  return parts;
}

}  // namespace

Result<std::string> ToZmqEndpoint(const std::string& endpoint, bool allow_port0) {
  const std::string_view text =
      endpoint.starts_with("tcp://") ? std::string_view(endpoint).substr(6) : endpoint;
  FLEET_ASSIGN_OR_RETURN(Endpoint parsed,
                         ParseEndpoint(text, {}, EndpointParseOptions{.allow_port_zero = allow_port0}));
  return "tcp://" + parsed.ToString();
}

// A ZeroMQ socket that several threads use in turn. ZeroMQ sockets may move
// between threads across a full memory barrier; the mutex is that barrier
// and makes each use exclusive. The I/O thread never blocks inside ZeroMQ
// while holding it: it polls the socket's ZMQ_FD (a plain file descriptor)
// and takes the lock only to receive what is ready.
struct LockedSocket {
  std::mutex mu;
  zmq::socket_t socket;  // guarded by mu
  bool closed = false;   // guarded by mu
  int fd = -1;           // fixed after construction
  // Messages taken off the socket whose delivery has not finished (the lock
  // is released before Deliver, which may send on this socket). A lost
  // connection is reported only after the replies that came before it.
  std::atomic<int> delivering{0};

  LockedSocket(zmq::context_t& context, zmq::socket_type type) : socket(context, type) {}

  // True when a message is waiting. Reading ZMQ_EVENTS also processes
  // ZeroMQ's pending commands, which re-arms `fd`.
  bool Readable() { return !closed && (socket.get(zmq::sockopt::events) & ZMQ_POLLIN); }
};

struct Van::Impl {
  // The connecting side's state of message authentication (comm/van_auth.h),
  // guarded by the connection's dealer.mu.
  struct ClientSession {
    std::string id;  // of the greeting in progress or done; empty before the first
    // Empty until welcomed.
    van_auth::SessionKeys send_keys, reply_keys;
    bool ready = false;  // welcomed: messages go out; otherwise they wait in `pending`
    uint64_t next_send = 0;
    van_auth::ReplayWindow window;
    // The session before the last greeting: replies to requests sent under
    // it may still come.
    std::string previous_id;
    van_auth::SessionKeys previous_reply_keys;
    van_auth::ReplayWindow previous_window;
    std::deque<Message> pending;
    std::chrono::steady_clock::time_point greeted_at;
    bool unanswered_reported = false;
  };

  // The bound side's state of one session (comm/van_auth.h).
  struct ServerSession {
    std::mutex mu;
    van_auth::SessionKeys request_keys, reply_keys;  // guarded by mu
    uint64_t next_send = 0;                          // guarded by mu
    van_auth::ReplayWindow window;                   // guarded by mu
    bool authenticated = false;  // a message under it checked out; I/O thread only
  };

  struct Connection {
    std::string endpoint;
    LockedSocket dealer;
    zmq::socket_t monitor;  // I/O thread only (after Connect hands it over)
    ClientSession session;  // guarded by dealer.mu
    // I/O thread only: the reason of the last failed handshake, until one
    // succeeds. ZeroMQ reports every such failure's disconnection right
    // after it; a call made between the two events must fail with the
    // reason, not with "connection lost".
    std::optional<Status> handshake_failure;

    Connection(zmq::context_t& context, std::string e)
        : endpoint(std::move(e)), dealer(context, zmq::socket_type::dealer) {}
  };

  Impl(VanOptions o, VanReceiver* r) : options(o), receiver(r), context(o.zmq_io_threads) {}

  // Fixed after construction.
  const VanOptions options;
  VanReceiver* const receiver;
  zmq::context_t context;
  int wake_fd = -1;
  std::thread io_thread;

  // Guarded by mu. The sockets they point to are never destroyed before
  // the Van, so a pointer taken under mu stays valid after releasing it.
  mutable std::mutex mu;
  std::unique_ptr<LockedSocket> router;
  std::vector<std::unique_ptr<Connection>> connections;
  bool sockets_changed = false;  // the I/O thread must rebuild its poll set
  bool stopped = false;

  // Owned by the I/O thread alone.
  // True while this thread receives from the router until it finds it
  // empty: a reply its inline handlers send there meanwhile needs no check
  // for a message left waiting (that receive loop is the check). Replies
  // go out at once, not at the end of the pass: held back, a window of
  // requests came back as one burst, and client and server took turns
  // idling (small8 1x1: 20-26k ops/s held back, 28-35k at once).
  bool draining_router = false;
  // wake_fd, then the sockets' ZMQ_FDs, then the monitors' ZMQ_FDs.
  std::vector<pollfd> poll_fds;
  std::vector<LockedSocket*> polled_sockets;  // router (if any) then dealers
  bool polled_router = false;
  std::vector<std::pair<int, zmq::socket_t*>> polled_monitors;

  std::atomic<bool> running{true};
  // A caller is inside ReceiveWhile, receiving on the outgoing connections,
  // and which thread it is.
  std::atomic<bool> caller_receiving{false};
  std::atomic<std::thread::id> receiving_thread{};
  // Polled by the receiving caller beside the outgoing connections, whose
  // ZMQ_FDs it sleeps on: whoever takes a socket's signal, or the message
  // the caller waits for, while it receives writes this eventfd
  // (WakeReceivingCaller). The I/O thread: it checks caller_receiving
  // before a socket, not before each message, so it may be delivering the
  // awaited reply when the caller starts receiving (the caller finds the
  // socket empty and would sleep until its tick). Another thread: its send
  // may take the signal of a reply (see SendOn). Fixed after Create.
  int caller_wake_fd = -1;
  // Set with every write of caller_wake_fd. A caller that leaves
  // ReceiveWhile with it set wakes the I/O thread: the signal may have come
  // after its last look at the sockets, and the I/O thread skipped them
  // while the caller received.
  std::atomic<bool> caller_signalled{false};
  // The outgoing connections' ZMQ_FDs are registered (level-triggered) in
  // dealer_epfd, which sits in gate_fd, which the I/O thread polls. A
  // caller that receives (ReceiveWhile) closes the gate with one
  // epoll_ctl, so the I/O thread is not woken by the replies the caller
  // takes, and opens it again once it has drained the sockets: a reply
  // arriving later (or in between) makes gate_fd readable at once, so the
  // I/O thread needs no explicit wake-up. Fixed after Create.
  int dealer_epfd = -1;
  int gate_fd = -1;
  size_t registered_dealers = 0;                // I/O thread only (RebuildPollItems)
  std::atomic<std::thread::id> io_thread_id{};  // set by Loop()
  // Opens or closes the gate (see gate_fd). False when epoll_ctl fails.
  bool SetDealerGate(bool open) {
    epoll_event e{};
    e.events = open ? static_cast<uint32_t>(EPOLLIN) : 0u;
    e.data.fd = dealer_epfd;
    return ::epoll_ctl(gate_fd, EPOLL_CTL_MOD, dealer_epfd, &e) == 0;
  }

  // With options.auth and encrypt: started by Bind, before the router
  // accepts; stopped after every socket is closed. Guarded by mu until then.
  std::unique_ptr<ZapHandler> zap;

  // Message authentication, bound side: sessions by id. Greetings from
  // strangers make sessions that never authenticate; past
  // kMaxUnauthenticatedSessions those are dropped.
  static constexpr size_t kMaxUnauthenticatedSessions = 4096;
  // Greetings a connection gets answered: a job's node greets once per
  // (re)connection, so more is a flood, dropped before any key is derived.
  static constexpr int kMaxGreetingsPerConnection = 4;
  absl::flat_hash_map<std::string, int> greetings_by_peer;  // I/O thread only
  std::mutex sessions_mu;
  absl::flat_hash_map<std::string, std::shared_ptr<ServerSession>> sessions;  // guarded
  size_t unauthenticated_sessions = 0;  // guarded by sessions_mu
  std::atomic<uint64_t> refused_messages{0};

  // A greeting unanswered this long reports the connection down.
  static constexpr std::chrono::milliseconds kGreetingTimeout{1500};

  bool mac() const { return options.auth != nullptr && !options.encrypt; }

  // poll(2) over plain descriptors (every ZMQ_FD is one): how many are
  // ready; 0 on EINTR, -1 on any other error. Not zmq::poll: before it
  // sleeps, that makes a zero-timeout pass of its own and reads ZMQ_EVENTS
  // of every socket item on each pass, two system calls each (a fork check
  // and a poll of the socket's mailbox), which on these VMs cost more than
  // a small message's own work.
  static int PollFds(std::span<pollfd> fds, std::chrono::milliseconds timeout) {
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(timeout.count()));
    if (ready >= 0) return ready;
    if (errno == EINTR) {
      for (pollfd& p : fds) p.revents = 0;
      return 0;
    }
    return -1;
  }

  // A spinning thread lets any other runnable thread on its CPU go first:
  // on a machine with few cores that is often ZeroMQ's I/O thread, the one
  // bringing the awaited message.
  static void YieldWhileSpinning() { sched_yield(); }

  // eventfd writes of 8 bytes cannot be partial; EAGAIN means the counter
  // is saturated, i.e. a wake-up is already pending.
  static void Signal(int eventfd) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(eventfd, &one, sizeof(one));
  }
  static void ClearSignal(int eventfd) {
    uint64_t count;
    [[maybe_unused]] ssize_t n = ::read(eventfd, &count, sizeof(count));
  }
  void Wake() { Signal(wake_fd); }
  void WakeReceivingCaller() {
    caller_signalled.store(true);
    Signal(caller_wake_fd);
  }

  LockedSocket* SocketFor(const Route& to);
  Status SendOn(LockedSocket& target, const Route& to, const Message& message);
  // Hands the parts to ZeroMQ. REQUIRES: target.mu held.
  void SendLocked(LockedSocket& target, const Route& to, const std::string& header,
                  const Message& message, const std::string* trailer);
  // Message authentication (comm/van_auth.h).
  void Greet(Connection& conn);
  void CheckGreetings(std::chrono::steady_clock::time_point now);
  // False when the message is the Van's own (a greeting) or is refused;
  // otherwise strips the trailer and sets from->session.
  bool Authenticate(Route* from, ReceivedParts& parts, size_t header_index);
  void OnHello(const std::string& routing_id, std::string_view id);
  void OnWelcome(int connection, std::string_view nonce, std::string_view proof);
  void Refuse(const char* why);
  void Loop();
  void RebuildPollItems();
  // Delivers every message ready on `socket`, or stops after a delivery
  // once `keep_going` (when given) says so; returns how many.
  int ReceiveReady(LockedSocket& socket, int connection,
                   const std::function<bool()>* keep_going = nullptr);
  void HandleMonitor(int connection, zmq::socket_t& monitor);
  void DeliverBeforeDown(Connection& conn, int connection);
  // Reads the monitors whose descriptor signalled in the last poll, or all.
  void HandleMonitors(bool all);
  void Deliver(const Route& from, ReceivedParts& parts, size_t header_index);
  void CloseAll();
};

Result<std::unique_ptr<Van>> Van::Create(VanOptions options, VanReceiver* receiver) {
  CHECK(receiver != nullptr);
  if (options.auth && options.encrypt && !zmq_has("curve")) {
    return Status::FailedPrecondition(
        "this libzmq has no CURVE (built without libsodium): run with auth off "
        "(Distributed.auth: off / --auth=off) or install a libzmq with CURVE");
  }
  auto impl = std::make_unique<Impl>(options, receiver);
  impl->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  impl->caller_wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl->wake_fd < 0 || impl->caller_wake_fd < 0) {
    const Status failed = Status::IOError("eventfd failed", std::strerror(errno));
    for (int fd : {impl->wake_fd, impl->caller_wake_fd})
      if (fd >= 0) ::close(fd);
    return failed;
  }
  impl->dealer_epfd = ::epoll_create1(EPOLL_CLOEXEC);
  impl->gate_fd = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event gate{};
  gate.events = EPOLLIN;
  gate.data.fd = impl->dealer_epfd;
  if (impl->dealer_epfd < 0 || impl->gate_fd < 0 ||
      ::epoll_ctl(impl->gate_fd, EPOLL_CTL_ADD, impl->dealer_epfd, &gate) != 0) {
    const Status failed = Status::IOError("epoll set-up failed", std::strerror(errno));
    for (int fd : {impl->wake_fd, impl->caller_wake_fd, impl->dealer_epfd, impl->gate_fd})
      if (fd >= 0) ::close(fd);
    return failed;
  }
  Impl* raw = impl.get();
  impl->io_thread = std::thread([raw] { raw->Loop(); });
  return std::unique_ptr<Van>(new Van(std::move(impl)));
}

Van::Van(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Van::~Van() {
  Stop();
  ::close(impl_->wake_fd);
  ::close(impl_->caller_wake_fd);
  ::close(impl_->gate_fd);
  ::close(impl_->dealer_epfd);
}

void Van::Stop() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopped) return;
    impl_->stopped = true;
  }
  impl_->running.store(false);
  impl_->Wake();
  CHECK(impl_->io_thread.get_id() != std::this_thread::get_id()) << "Van::Stop on its I/O thread";
  impl_->io_thread.join();
  impl_->CloseAll();
}

Result<std::string> Van::Bind(const std::string& endpoint) {
  FLEET_ASSIGN_OR_RETURN(std::string zmq_endpoint, ToZmqEndpoint(endpoint, /*allow_port0=*/true));
  // zmq wants "*" for an ephemeral port.
  if (zmq_endpoint.ends_with(":0")) zmq_endpoint.replace(zmq_endpoint.size() - 1, 1, "*");
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->stopped) return Status::FailedPrecondition("van stopped", endpoint);
  if (impl_->router) return Status::FailedPrecondition("van already bound", endpoint);
  auto router = std::make_unique<LockedSocket>(impl_->context, zmq::socket_type::router);
  SetCommonOptions(router->socket, impl_->options);
  // Per peer: a sender past this many queued messages waits (TCP
  // backpressure; a router drops nothing it receives), so a flood is not
  // buffered without end. Far above any job's window of requests.
  router->socket.set(zmq::sockopt::rcvhwm, kRouterReceiveHighWater);
  router->socket.set(zmq::sockopt::router_mandatory, 1);
  if (const JobAuth* auth = impl_->options.encrypt ? impl_->options.auth.get() : nullptr) {
    if (!impl_->zap) {
      FLEET_ASSIGN_OR_RETURN(impl_->zap,
                             ZapHandler::Start(impl_->context, auth->curve_client().public_key));
    }
    router->socket.set(zmq::sockopt::curve_server, 1);
    router->socket.set(zmq::sockopt::curve_secretkey, auth->curve_server().secret_key);
  }
  try {
    router->socket.bind(zmq_endpoint);
  } catch (const zmq::error_t& e) {
    return Status::Unavailable(absl::StrCat("cannot bind: ", e.what()), endpoint);
  }
  router->fd = router->socket.get(zmq::sockopt::fd);
  std::string bound = router->socket.get(zmq::sockopt::last_endpoint);
  impl_->router = std::move(router);
  impl_->sockets_changed = true;
  impl_->Wake();
  return bound.starts_with("tcp://") ? bound.substr(6) : bound;
}

Result<int> Van::Connect(const std::string& endpoint) {
  FLEET_ASSIGN_OR_RETURN(std::string zmq_endpoint, ToZmqEndpoint(endpoint, /*allow_port0=*/false));
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->stopped) return Status::FailedPrecondition("van stopped", endpoint);
  const int id = static_cast<int>(impl_->connections.size());
  auto conn = std::make_unique<Impl::Connection>(impl_->context, zmq_endpoint);
  SetCommonOptions(conn->dealer.socket, impl_->options);
  if (impl_->options.auth && impl_->options.encrypt) {
    SetCurveClient(conn->dealer.socket, *impl_->options.auth);
  }
  const std::string monitor_addr =
      absl::StrCat("inproc://van-monitor-", reinterpret_cast<uintptr_t>(impl_.get()), "-", id);
  zmq_socket_monitor(conn->dealer.socket.handle(), monitor_addr.c_str(),
                     ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED |
                         ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                         ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
  conn->monitor = zmq::socket_t(impl_->context, zmq::socket_type::pair);
  conn->monitor.set(zmq::sockopt::linger, 0);
  conn->monitor.connect(monitor_addr);
  conn->dealer.socket.connect(zmq_endpoint);
  conn->dealer.fd = conn->dealer.socket.get(zmq::sockopt::fd);
  impl_->connections.push_back(std::move(conn));
  impl_->sockets_changed = true;
  impl_->Wake();
  return id;
}

LockedSocket* Van::Impl::SocketFor(const Route& to) {
  std::lock_guard<std::mutex> lock(mu);
  if (stopped) return nullptr;
  if (to.outgoing()) {
    if (to.connection >= static_cast<int>(connections.size())) return nullptr;
    return &connections[to.connection]->dealer;
  }
  return router.get();
}

Status Van::Send(const Route& to, const Message& message) {
  for (const Bytes& frame : message.frames) {
    if (static_cast<int64_t>(frame.size()) > impl_->options.max_message_bytes) {
      return Status::InvalidArgument(
          absl::StrCat("a frame of ", frame.size(), " bytes is over the job's message limit of ",
                       impl_->options.max_message_bytes,
                       " bytes (raise Distributed.max_message_bytes, or send less at once)"),
          absl::StrCat("command ", message.header.command()));
    }
  }
  LockedSocket* target = impl_->SocketFor(to);
  if (target == nullptr) {
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      if (impl_->stopped) return Status::FailedPrecondition("van stopped");
    }
    return Status::InvalidArgument(
        to.outgoing() ? absl::StrCat("unknown connection ", to.connection)
                      : std::string("reply on a van that is not bound"));
  }
  return impl_->SendOn(*target, to, message);
}

std::string Van::endpoint(int connection) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  CHECK(connection >= 0 && connection < static_cast<int>(impl_->connections.size()));
  return impl_->connections[connection]->endpoint;
}

// The calling thread sends itself: no queue and no thread hand-off, which
// is most of a small message's round trip.
Status Van::Impl::SendOn(LockedSocket& target, const Route& to, const Message& message) {
  std::string header = message.header.SerializeAsString();
  const auto& frames = message.frames;
  // The bound side signs outside the socket's lock: a reply's tag over
  // megabytes must not hold up the other handler threads' replies.
  std::string trailer;
  if (mac() && !to.outgoing()) {
    std::shared_ptr<ServerSession> session;
    {
      std::lock_guard<std::mutex> lock(sessions_mu);
      auto it = sessions.find(to.session);
      if (it != sessions.end()) session = it->second;
    }
    if (session == nullptr) {
      return Status::Unavailable("no authenticated session for this caller (it reconnected?)");
    }
    van_auth::MessageKeys keys;
    {
      std::lock_guard<std::mutex> lock(session->mu);
      keys = session->reply_keys.For(session->next_send++);
    }
    trailer = van_auth::Trailer(keys, to.session, PartsToSign(header, frames));
  }
  bool waiting = false;
  {
    std::lock_guard<std::mutex> lock(target.mu);
    if (target.closed) return Status::FailedPrecondition("van stopped");
    if (mac() && to.outgoing()) {
      // The connecting side signs under the lock: the session may change
      // with a greeting, and until it is welcomed messages wait.
      ClientSession& session = connections[to.connection]->session;
      if (!session.ready) {
        session.pending.push_back(message);
        return Status::OK();
      }
      trailer = van_auth::Trailer(session.send_keys.For(session.next_send++), session.id,
                                  PartsToSign(header, frames));
    }
    try {
      SendLocked(target, to, header, message, trailer.empty() ? nullptr : &trailer);
    } catch (const zmq::error_t& e) {
      // EHOSTUNREACH on the ROUTER: the caller that sent the request is gone.
      LOG(WARNING) << "van: send of command " << message.header.command() << " failed: "
                   << e.what();
      return Status::Unavailable(absl::StrCat("send failed: ", e.what()));
    }
    // Sending may have consumed the signal on the socket's ZMQ_FD that
    // tells the thread watching it a message is waiting (ZeroMQ processes a
    // socket's commands now and then on send). The receiving caller on its
    // connections, and the I/O thread on the router it is draining, receive
    // from the socket again before they sleep; any other send that leaves
    // a message waiting wakes the watchers. (draining_router belongs to the
    // I/O thread: read only there.)
    const std::thread::id self = std::this_thread::get_id();
    const bool sender_rechecks = to.outgoing() ? receiving_thread.load() == self
                                               : self == io_thread_id.load() && draining_router;
    waiting = !sender_rechecks && target.Readable();
  }
  if (waiting) {
    // The I/O thread leaves the outgoing connections to a receiving caller;
    // it is woken too, for a caller that was just leaving.
    if (to.outgoing() && caller_receiving.load()) WakeReceivingCaller();
    Wake();
  }
  return Status::OK();
}

void Van::Impl::SendLocked(LockedSocket& target, const Route& to, const std::string& header,
                           const Message& message, const std::string* trailer) {
  const auto& frames = message.frames;
  const auto more = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
  if (!to.outgoing()) target.socket.send(zmq::buffer(to.routing_id), zmq::send_flags::sndmore);
  const bool last_is_header = frames.empty() && trailer == nullptr;
  target.socket.send(zmq::buffer(header), last_is_header ? zmq::send_flags::dontwait : more);
  for (size_t i = 0; i < frames.size(); ++i) {
    zmq::message_t part = ToZmq(frames[i]);
    const bool last = i + 1 == frames.size() && trailer == nullptr;
    target.socket.send(part, last ? zmq::send_flags::dontwait : more);
  }
  if (trailer != nullptr) target.socket.send(zmq::buffer(*trailer), zmq::send_flags::dontwait);
}

// ---- message authentication (comm/van_auth.h) ----

void Van::Impl::Refuse(const char* why) {
  refused_messages.fetch_add(1);
  LOG_EVERY_N(WARNING, 100) << "van: refused a message: " << why << " (" << google::COUNTER
                            << " so far)";
}

// A fresh session for every TCP connection (again after a reconnect): the
// peer may be a new process that knows none of ours.
void Van::Impl::Greet(Connection& conn) {
  std::lock_guard<std::mutex> lock(conn.dealer.mu);
  if (conn.dealer.closed) return;
  ClientSession& s = conn.session;
  if (s.ready) {
    s.previous_id = std::move(s.id);
    s.previous_reply_keys = std::move(s.reply_keys);
    s.previous_window = s.window;
  }
  s.id = van_auth::RandomBytes(van_auth::kIdBytes);
  s.send_keys = van_auth::SessionKeys();
  s.reply_keys = van_auth::SessionKeys();
  s.ready = false;
  s.next_send = 0;
  s.window = van_auth::ReplayWindow();
  s.greeted_at = std::chrono::steady_clock::now();
  s.unanswered_reported = false;
  // Never blocks: this is the I/O thread, and a DEALER whose connection
  // failed its ZeroMQ handshake (e.g. a CURVE server) has no pipe to queue
  // into until it reconnects, so a blocking send would hang the Van (and
  // its Stop) for good. A greeting not sent is reported by CheckGreetings
  // like one not answered; the next connect greets again. Once the first
  // part is queued, ZeroMQ takes the rest of the message.
  try {
    const auto more = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
    if (!conn.dealer.socket.send(zmq::buffer(van_auth::kHello), more) ||
        !conn.dealer.socket.send(zmq::buffer(s.id), zmq::send_flags::dontwait)) {
      LOG(WARNING) << "van: greeting " << conn.endpoint
                   << " not sent: the connection takes no message yet";
    }
  } catch (const zmq::error_t& e) {
    LOG(WARNING) << "van: greeting " << conn.endpoint << " failed: " << e.what();
  }
}

void Van::Impl::CheckGreetings(std::chrono::steady_clock::time_point now) {
  std::vector<std::pair<int, std::string>> unanswered;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t c = 0; c < connections.size(); ++c) {
      Connection& conn = *connections[c];
      std::lock_guard<std::mutex> socket_lock(conn.dealer.mu);
      ClientSession& s = conn.session;
      if (s.id.empty() || s.ready || s.unanswered_reported || now - s.greeted_at < kGreetingTimeout) {
        continue;
      }
      s.unanswered_reported = true;
      unanswered.emplace_back(static_cast<int>(c), conn.endpoint);
    }
  }
  for (auto& [connection, endpoint] : unanswered) {
    receiver->OnConnectionDown(
        connection, endpoint,
        Status::Unavailable(absl::StrCat("no answer to this job's authentication handshake "
                                         "within ",
                                         kGreetingTimeout.count(),
                                         " ms: the peer runs with auth off or encrypted "
                                         "(CURVE), or is not a FleetPS node"),
                            endpoint));
  }
}

void Van::Impl::OnHello(const std::string& routing_id, std::string_view id) {
  std::string nonce;
  {
    std::lock_guard<std::mutex> lock(sessions_mu);
    // A greeting played again must not reset a session's counters.
    if (sessions.contains(std::string(id))) return Refuse("greeting for a session that exists");
    if (unauthenticated_sessions >= kMaxUnauthenticatedSessions) {
      absl::erase_if(sessions, [](const auto& kv) { return !kv.second->authenticated; });
      unauthenticated_sessions = 0;
    }
    nonce = van_auth::RandomBytes(van_auth::kNonceBytes);
    auto session = std::make_shared<ServerSession>();
    const std::string key = van_auth::SessionKey(options.auth->van_key(), id, nonce);
    session->request_keys = van_auth::SessionKeys(key, van_auth::Direction::kToServer);
    session->reply_keys = van_auth::SessionKeys(key, van_auth::Direction::kToClient);
    sessions.emplace(std::string(id), std::move(session));
    ++unauthenticated_sessions;
  }
  const std::string proof = van_auth::WelcomeProof(options.auth->van_key(), id, nonce);
  std::lock_guard<std::mutex> lock(router->mu);
  if (router->closed) return;
  try {
    router->socket.send(zmq::buffer(routing_id), zmq::send_flags::sndmore);
    router->socket.send(zmq::buffer(van_auth::kWelcome), zmq::send_flags::sndmore);
    router->socket.send(zmq::buffer(nonce), zmq::send_flags::sndmore);
    router->socket.send(zmq::buffer(proof), zmq::send_flags::dontwait);
  } catch (const zmq::error_t& e) {
    LOG_EVERY_N(WARNING, 100) << "van: welcome failed: " << e.what();
  }
}

void Van::Impl::OnWelcome(int connection, std::string_view nonce, std::string_view proof) {
  Connection* conn;
  {
    std::lock_guard<std::mutex> lock(mu);
    conn = connections[connection].get();
  }
  bool was_reported;
  {
    std::lock_guard<std::mutex> lock(conn->dealer.mu);
    ClientSession& s = conn->session;
    if (s.id.empty() || s.ready || nonce.size() != van_auth::kNonceBytes) {
      return Refuse("welcome without a greeting");
    }
    const std::string want = van_auth::WelcomeProof(options.auth->van_key(), s.id, nonce);
    if (proof.size() != want.size() || CRYPTO_memcmp(proof.data(), want.data(), want.size()) != 0) {
      // Not this job's server: it gets nothing of ours.
      return Refuse("welcome from a peer without this job's secret");
    }
    const std::string key = van_auth::SessionKey(options.auth->van_key(), s.id, nonce);
    s.send_keys = van_auth::SessionKeys(key, van_auth::Direction::kToServer);
    s.reply_keys = van_auth::SessionKeys(key, van_auth::Direction::kToClient);
    s.ready = true;
    was_reported = s.unanswered_reported;
    const Route to{connection, {}, {}};
    for (const Message& m : s.pending) {
      const std::string header = m.header.SerializeAsString();
      const std::string trailer =
          van_auth::Trailer(s.send_keys.For(s.next_send++), s.id, PartsToSign(header, m.frames));
      try {
        SendLocked(conn->dealer, to, header, m, &trailer);
      } catch (const zmq::error_t& e) {
        LOG(WARNING) << "van: send of a waiting message failed: " << e.what();
      }
    }
    s.pending.clear();
  }
  // Replies to what was waiting are due; whoever receives must look.
  Wake();
  if (was_reported) receiver->OnConnectionUp(connection);
}

bool Van::Impl::Authenticate(Route* from, ReceivedParts& parts, size_t header_index) {
  const std::string_view first = parts[header_index].to_string_view();
  if (!from->outgoing() && first == van_auth::kHello) {
    // Only the I/O thread receives on the router (see the eviction below).
    if (greetings_by_peer.size() > kMaxUnauthenticatedSessions) greetings_by_peer.clear();
    if (++greetings_by_peer[from->routing_id] > kMaxGreetingsPerConnection) {
      Refuse("greeting flood");
    } else if (parts.size() != header_index + 2 || parts.back().size() != van_auth::kIdBytes) {
      Refuse("malformed greeting");
    } else {
      OnHello(from->routing_id, parts.back().to_string_view());
    }
    return false;
  }
  if (from->outgoing() && first == van_auth::kWelcome) {
    if (parts.size() != 3) {
      Refuse("malformed welcome");
    } else {
      OnWelcome(from->connection, parts[1].to_string_view(), parts[2].to_string_view());
    }
    return false;
  }
  van_auth::TrailerFields fields;
  if (parts.size() < header_index + 2 ||
      !van_auth::ParseTrailer(parts.back().to_string_view(), &fields)) {
    Refuse("no authentication trailer (a peer without auth?)");
    return false;
  }
  SignedParts signed_parts;
  for (size_t i = header_index; i + 1 < parts.size(); ++i) {
    signed_parts.push_back({parts[i].data(), parts[i].size()});
  }
  const std::string_view trailer = parts.back().to_string_view();
  if (!from->outgoing()) {
    std::shared_ptr<ServerSession> session;
    {
      std::lock_guard<std::mutex> lock(sessions_mu);
      auto it = sessions.find(absl::string_view(fields.id.data(), fields.id.size()));
      if (it != sessions.end()) session = it->second;
    }
    if (session == nullptr) {
      Refuse("unknown session");
      return false;
    }
    van_auth::MessageKeys keys;
    {
      std::lock_guard<std::mutex> lock(session->mu);
      // A session's batch of keys is kept once a message under it checked
      // out: strangers' sessions cost no keys kept.
      keys = session->authenticated ? session->request_keys.For(fields.sequence)
                                    : session->request_keys.Once(fields.sequence);
    }
    if (!van_auth::Verify(keys, trailer, signed_parts)) {
      Refuse("bad tag (changed or forged)");
      return false;
    }
    {
      std::lock_guard<std::mutex> lock(session->mu);
      if (!session->window.Accept(fields.sequence)) {
        Refuse("sequence number taken before (played again)");
        return false;
      }
    }
    if (!session->authenticated) {
      // The I/O thread alone receives on the router, so this flag and the
      // eviction in OnHello never race.
      session->authenticated = true;
      std::lock_guard<std::mutex> lock(sessions_mu);
      --unauthenticated_sessions;
    }
    from->session = std::string(fields.id);
  } else {
    Connection* conn;
    {
      std::lock_guard<std::mutex> lock(mu);
      conn = connections[from->connection].get();
    }
    std::optional<van_auth::MessageKeys> keys;
    {
      std::lock_guard<std::mutex> lock(conn->dealer.mu);
      ClientSession& s = conn->session;
      if (s.ready && fields.id == s.id) {
        keys = s.reply_keys.For(fields.sequence);
      } else if (!s.previous_id.empty() && fields.id == s.previous_id) {
        keys = s.previous_reply_keys.For(fields.sequence);
      }
    }
    if (!keys) {
      Refuse("unknown session");
      return false;
    }
    if (!van_auth::Verify(*keys, trailer, signed_parts)) {
      Refuse("bad tag (changed or forged)");
      return false;
    }
    std::lock_guard<std::mutex> lock(conn->dealer.mu);
    ClientSession& s = conn->session;
    van_auth::ReplayWindow& window = fields.id == s.id ? s.window : s.previous_window;
    if (!window.Accept(fields.sequence)) {
      Refuse("sequence number taken before (played again)");
      return false;
    }
  }
  parts.pop_back();
  return true;
}

bool Van::ReceiveWhile(const std::function<void()>& start,
                       const std::function<bool()>& keep_waiting,
                       std::chrono::steady_clock::time_point deadline) {
  if (impl_->caller_receiving.exchange(true)) return false;
  // Pairs with the fence after the I/O thread's deliveries (see
  // caller_wake_fd).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  impl_->receiving_thread.store(std::this_thread::get_id());
  // Closed before anything is sent: the replies this thread takes must not
  // wake the I/O thread too.
  const bool gated = impl_->SetDealerGate(false);
  if (start) start();
  // Inline: a wait should not allocate (one per call of a window's op).
  absl::InlinedVector<std::pair<LockedSocket*, int>, 8> dealers;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (!impl_->stopped) {
      for (size_t c = 0; c < impl_->connections.size(); ++c) {
        dealers.emplace_back(&impl_->connections[c]->dealer, static_cast<int>(c));
      }
    }
  }
  absl::InlinedVector<pollfd, 9> items;
  for (auto& [socket, connection] : dealers) items.push_back({socket->fd, POLLIN, 0});
  items.push_back({impl_->caller_wake_fd, POLLIN, 0});  // last
  // After a poll: false on a poll error; consumes the I/O thread's wake-up.
  auto polled = [&](int ready) {
    if (ready > 0 && (items.back().revents & POLLIN)) {
      // Before the sockets are checked again: a signal that comes later is
      // seen later.
      impl_->caller_signalled.store(false);
      Impl::ClearSignal(impl_->caller_wake_fd);
    }
    return ready >= 0;
  };
  auto spin_until = std::chrono::steady_clock::now() + impl_->options.busy_poll;
  while (!dealers.empty() && keep_waiting()) {
    int delivered = 0;
    for (auto& [socket, connection] : dealers)
      delivered += impl_->ReceiveReady(*socket, connection, &keep_waiting);
    auto now = std::chrono::steady_clock::now();
    if (delivered > 0) {
      spin_until = now + impl_->options.busy_poll;
      continue;
    }
    if (now >= deadline) break;
    if (now < spin_until) {
      // Busy polling (VanOptions::busy_poll): one poll system call a turn,
      // the sockets are read only once one of them signals.
      const auto spin_end = std::min(spin_until, deadline);
      int ready;
      while ((ready = Impl::PollFds(items, std::chrono::milliseconds(0))) == 0 && keep_waiting() &&
             (now = std::chrono::steady_clock::now()) < spin_end) {
        Impl::YieldWhileSpinning();
      }
      if (!polled(ready)) break;
      continue;
    }
    // Short slices: the call may also complete elsewhere (the I/O thread's
    // deadline tick, a lost connection), which does not wake this poll.
    const auto slice = std::min(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now),
                                impl_->options.tick);
    if (!polled(Impl::PollFds(items, std::max(slice, std::chrono::milliseconds(1))))) break;
  }
  // The sockets are drained (two system calls each inside ZeroMQ): each is
  // then left empty with its ZMQ_FD armed, so the next reply's arrival makes
  // the gate's descriptor readable and wakes the I/O thread by itself. (A
  // socket whose last receive found a message is not armed: ZeroMQ signals
  // only a reader that found it empty, and the next reply would wait for
  // the I/O thread's tick.)
  // Until a round delivers nothing: a delivery may send on a socket drained
  // before it.
  for (int delivered = 1; delivered > 0;) {
    delivered = 0;
    for (auto& [socket, connection] : dealers)
      delivered += impl_->ReceiveReady(*socket, connection);
  }
  impl_->receiving_thread.store(std::thread::id());
  // Cleared before the gate opens: the I/O thread skips the outgoing
  // connections while a caller receives, and a readable gate it skipped
  // would keep waking it.
  impl_->caller_receiving.store(false);
  const bool gate_open = gated && impl_->SetDealerGate(true);
  const bool signalled = impl_->caller_signalled.exchange(false);
  if (!gate_open || signalled) impl_->Wake();
  return true;
}

// ---- I/O thread ----

void Van::Impl::RebuildPollItems() {
  std::lock_guard<std::mutex> lock(mu);
  sockets_changed = false;
  poll_fds.clear();
  polled_sockets.clear();
  polled_monitors.clear();
  poll_fds.push_back({wake_fd, POLLIN, 0});
  polled_router = router != nullptr;
  if (router) {
    polled_sockets.push_back(router.get());
    poll_fds.push_back({router->fd, POLLIN, 0});
  }
  for (auto& c : connections) polled_sockets.push_back(&c->dealer);
  // The outgoing connections are watched through the gate (see gate_fd).
  for (; registered_dealers < connections.size(); ++registered_dealers) {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.u64 = registered_dealers;
    if (::epoll_ctl(dealer_epfd, EPOLL_CTL_ADD, connections[registered_dealers]->dealer.fd, &e) !=
        0) {
      // Its replies are then found on the next pass (at the latest a tick).
      PLOG(ERROR) << "van: cannot watch the connection to "
                  << connections[registered_dealers]->endpoint;
    }
  }
  poll_fds.push_back({gate_fd, POLLIN, 0});
  for (size_t c = 0; c < connections.size(); ++c) {
    polled_monitors.emplace_back(static_cast<int>(c), &connections[c]->monitor);
    // Only this thread uses a monitor, so its ZMQ_FD's edge is never
    // consumed elsewhere: a monitor is read when its descriptor signals.
    poll_fds.push_back({connections[c]->monitor.get(zmq::sockopt::fd), POLLIN, 0});
  }
}

void Van::Impl::Loop() {
  io_thread_id.store(std::this_thread::get_id());
  RebuildPollItems();
  HandleMonitors(/*all=*/true);
  auto spin_until = std::chrono::steady_clock::time_point::min();
  auto next_tick = std::chrono::steady_clock::now() + options.tick;
  bool backlog = false;  // a socket still had messages after the last pass
  // A socket with more waiting than one pass takes (a flood) is left for
  // the next pass, so the others, the tick and Stop() get their turn.
  int taken = 0;
  const std::function<bool()> keep_going = [this, &taken] {
    return ++taken < kMaxMessagesPerPass && running.load(std::memory_order_relaxed);
  };
  while (running.load(std::memory_order_relaxed)) {
    // While a waiting caller receives on the outgoing connections itself
    // (ReceiveWhile), it keeps the gate closed, so this thread does not
    // wake for them: two threads woken for one reply would fight over the 2
    // cores.
    // Busy polling (VanOptions::busy_poll) after recent work. A turn in
    // which nothing signals and no tick is due skips the pass below: the
    // last pass left every socket drained, and a sender that consumes an
    // edge since then wakes this thread (SendOn).
    const bool spinning = backlog || std::chrono::steady_clock::now() < spin_until;
    const int ready = PollFds(poll_fds, spinning ? std::chrono::milliseconds(0) : options.tick);
    if (ready < 0) {
      PLOG(ERROR) << "van poll failed";
      break;
    }
    if (spinning && !backlog && ready == 0 && std::chrono::steady_clock::now() < next_tick) {
      YieldWhileSpinning();
      continue;
    }
    if (poll_fds[0].revents & POLLIN) ClearSignal(wake_fd);
    // ZMQ_FD is edge-like and may have been consumed by a sender, so every
    // socket is checked on every pass, not only those whose fd fired.
    int delivered = 0;
    backlog = false;
    for (size_t i = 0; i < polled_sockets.size(); ++i) {
      // The router, when there is one, is first; dealers follow in id order.
      const int connection = static_cast<int>(i) - (polled_router ? 1 : 0);
      if (connection >= 0 && caller_receiving.load()) continue;
      taken = 0;
      draining_router = connection < 0;
      const int got = ReceiveReady(*polled_sockets[i], connection, &keep_going);
      draining_router = false;
      delivered += got;
      // A backlog is taken up by the next turn (its poll does not sleep),
      // after the tick and Stop() had theirs.
      backlog |= taken >= kMaxMessagesPerPass;
      if (connection >= 0 && got > 0) {
        // Pairs with the fence in ReceiveWhile: either this thread sees
        // the caller receiving, or the caller's keep_waiting() sees what
        // was just delivered (see caller_wake_fd).
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if (caller_receiving.load()) WakeReceivingCaller();
      }
    }
    // A pass woken by nothing (the tick) reads every monitor as well, a
    // safety net that costs two system calls each every few milliseconds.
    HandleMonitors(/*all=*/ready == 0);
    const auto now = std::chrono::steady_clock::now();
    if (delivered > 0) spin_until = now + options.busy_poll;
    next_tick = now + options.tick;
    if (mac()) CheckGreetings(now);
    receiver->OnTick(now);
    bool changed;
    {
      std::lock_guard<std::mutex> lock(mu);
      changed = sockets_changed;
    }
    if (changed) {
      RebuildPollItems();
      // A new monitor's first events may be queued without its descriptor
      // having signalled (ZeroMQ signals only a reader that found its pipe
      // empty once): read each one now.
      HandleMonitors(/*all=*/true);
    }
  }
}

void Van::Impl::HandleMonitors(bool all) {
  const size_t first_monitor = poll_fds.size() - polled_monitors.size();
  for (size_t m = 0; m < polled_monitors.size(); ++m) {
    if (all || (poll_fds[first_monitor + m].revents & POLLIN)) {
      HandleMonitor(polled_monitors[m].first, *polled_monitors[m].second);
    }
  }
}

int Van::Impl::ReceiveReady(LockedSocket& socket, int connection,
                            const std::function<bool()>* keep_going) {
  // One message per lock hold: delivering may send (an error reply), which
  // needs this lock. No ZMQ_EVENTS check first: a receive that finds nothing
  // processes ZeroMQ's commands just as that check would (re-arming the
  // socket's ZMQ_FD), and a message that is there costs no system call.
  for (int delivered = 0;; ++delivered) {
    ReceivedParts parts;
    {
      std::lock_guard<std::mutex> lock(socket.mu);
      if (socket.closed) return delivered;
      bool more = true;
      while (more) {
        zmq::message_t part;
        // ZeroMQ delivers multipart messages atomically: once the first part
        // is readable, the rest are too.
        if (!socket.socket.recv(part, zmq::recv_flags::dontwait)) break;
        more = part.more();
        parts.push_back(std::move(part));
      }
      if (parts.empty()) return delivered;
      socket.delivering.fetch_add(1, std::memory_order_relaxed);
    }
    Route from;
    size_t header_index = 0;
    if (connection >= 0) {
      from.connection = connection;
    } else {
      from.routing_id = parts[0].to_string();
      header_index = 1;
    }
    Deliver(from, parts, header_index);
    socket.delivering.fetch_sub(1, std::memory_order_release);
    if (keep_going != nullptr && !(*keep_going)()) return delivered + 1;
  }
}
void Van::Impl::Deliver(const Route& route, ReceivedParts& parts, size_t header_index) {
  if (parts.size() <= header_index) {
    LOG_EVERY_N(WARNING, 100) << "van: dropping message without header frame ("
                              << google::COUNTER << " so far)";
    return;
  }
  Route from = route;
  if (mac() && !Authenticate(&from, parts, header_index)) return;
  Message message;
  if (!message.header.ParseFromArray(parts[header_index].data(),
                                     static_cast<int>(parts[header_index].size()))) {
    LOG_EVERY_N(WARNING, 100) << "van: dropping message whose header does not parse ("
                              << parts[header_index].size() << " bytes; " << google::COUNTER
                              << " so far)";
    return;
  }
  message.frames.reserve(parts.size() - header_index - 1);
  for (size_t i = header_index + 1; i < parts.size(); ++i) {
    message.frames.push_back(FromZmq(std::move(parts[i])));
  }
  Status valid = message.Validate();
  if (!valid.ok()) {
    receiver->OnMalformed(from, message.header, valid);
    return;
  }
  receiver->OnMessage(from, std::move(message));
}

void Van::Impl::HandleMonitor(int connection, zmq::socket_t& monitor) {
  Connection* conn;
  {
    std::lock_guard<std::mutex> lock(mu);
    conn = connections[connection].get();
  }
  for (;;) {
    zmq::message_t event_part;
    if (!monitor.recv(event_part, zmq::recv_flags::dontwait)) return;
    zmq::message_t address_part;
    if (event_part.more()) (void)monitor.recv(address_part, zmq::recv_flags::none);
    if (event_part.size() < sizeof(uint16_t)) continue;
    uint16_t event;
    std::memcpy(&event, event_part.data(), sizeof(event));
    if (event == ZMQ_EVENT_DISCONNECTED) {
      DeliverBeforeDown(*conn, connection);
      receiver->OnConnectionDown(
          connection, conn->endpoint,
          conn->handshake_failure.value_or(Status::Unavailable(
              "connection lost (peer closed, crashed or missed heartbeats)", conn->endpoint)));
      // The calls just answered or failed may be a waiting caller's: it
      // looks again now rather than at the end of its poll's slice (as
      // after the I/O thread's deliveries in Loop).
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (caller_receiving.load()) WakeReceivingCaller();
    } else if (event == ZMQ_EVENT_CONNECTED) {
      if (mac()) Greet(*conn);
      receiver->OnConnectionUp(connection);
    } else if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      conn->handshake_failure.reset();
    } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL ||
               event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
               event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
      // The peer refused our keys (or we refused its): calls to it cannot
      // succeed until someone with the right keys listens there.
      conn->handshake_failure = Status::Unavailable(
          options.auth && options.encrypt
              ? "CURVE handshake failed: the peer does not hold this job's keys (another job, or "
                "a different job secret?)"
              : "handshake failed: the peer requires this job's credentials (auth is off here, "
                "on there?)",
          conn->endpoint);
      receiver->OnConnectionDown(connection, conn->endpoint, *conn->handshake_failure);
    }
  }
}

// Replies the peer sent before it closed are already in the socket (ZeroMQ
// queues what it read before it reports the close); they are delivered
// first, or the receiver would fail their calls as lost and then drop them.
// A waiting caller (ReceiveWhile) may hold some of them: its deliveries
// finish first, which takes microseconds unless a reply's callback blocks.
void Van::Impl::DeliverBeforeDown(Connection& conn, int connection) {
  ReceiveReady(conn.dealer, connection, /*keep_going=*/nullptr);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (conn.dealer.delivering.load(std::memory_order_acquire) > 0) {
    if (std::chrono::steady_clock::now() > give_up) {
      LOG(WARNING) << "van: a reply from " << conn.endpoint
                   << " was still being delivered 1 s after its connection closed; reporting the "
                      "connection lost anyway";
      return;
    }
    std::this_thread::yield();
  }
}

void Van::Impl::CloseAll() {
  std::lock_guard<std::mutex> lock(mu);
  auto close = [](LockedSocket& s, std::chrono::milliseconds linger) {
    std::lock_guard<std::mutex> socket_lock(s.mu);
    s.closed = true;
    s.socket.set(zmq::sockopt::linger, static_cast<int>(linger.count()));
    s.socket.close();
  };
  for (auto& c : connections) {
    zmq_socket_monitor(c->dealer.socket.handle(), nullptr, 0);
    close(c->dealer, std::chrono::milliseconds(0));
    c->monitor.close();
  }
  if (router) close(*router, options.reply_linger);
  // Its socket must close before the context ends; no handshake needs it now.
  zap.reset();
}

}  // namespace fleet
