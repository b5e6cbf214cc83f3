#include "comm/van.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

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

void SetCommonOptions(zmq::socket_t& s, const VanOptions& o) {
  s.set(zmq::sockopt::linger, 0);
  // Flow control is the application's (request windows); a ZeroMQ high-water
  // mark would silently drop (ROUTER) or block (DEALER) instead.
  s.set(zmq::sockopt::sndhwm, 0);
  s.set(zmq::sockopt::rcvhwm, 0);
  s.set(zmq::sockopt::heartbeat_ivl, static_cast<int>(o.heartbeat_interval.count()));
  s.set(zmq::sockopt::heartbeat_timeout, static_cast<int>(o.heartbeat_timeout.count()));
  s.set(zmq::sockopt::heartbeat_ttl, static_cast<int>(o.heartbeat_timeout.count()));
}

}  // namespace

Result<std::string> ToZmqEndpoint(const std::string& endpoint, bool allow_port0) {
  // absl here predates std::string_view interop, so work on std::string.
  std::string rest = endpoint.starts_with("tcp://") ? endpoint.substr(6) : endpoint;
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == rest.size()) {
    return Status::InvalidArgument("endpoint must look like ip:port", endpoint);
  }
  int port = -1;
  if (!absl::SimpleAtoi(rest.substr(colon + 1), &port) || port < 0 || port > 65535 ||
      (port == 0 && !allow_port0)) {
    return Status::InvalidArgument(
        absl::StrCat("port must be ", allow_port0 ? "0" : "1", "..65535"), endpoint);
  }
  return absl::StrCat("tcp://", rest.substr(0, colon), ":", port);
}

struct Van::Impl {
  struct Connection {
    std::string endpoint;
    zmq::socket_t dealer;
    zmq::socket_t monitor;
  };
  struct Outgoing {
    Route to;
    Message message;
  };

  Impl(VanOptions o, VanReceiver* r) : options(o), receiver(r), context(o.zmq_io_threads) {}

  // Fixed after construction.
  const VanOptions options;
  VanReceiver* const receiver;
  zmq::context_t context;
  int wake_fd = -1;
  std::thread io_thread;

  // Owned by the I/O thread alone.
  std::unique_ptr<zmq::socket_t> router;
  std::vector<std::unique_ptr<Connection>> connections;
  std::vector<zmq_pollitem_t> poll_items;

  // Guarded by mu.
  mutable std::mutex mu;
  std::deque<Outgoing> outbox;
  std::deque<std::function<void()>> control;  // socket setup, run on the I/O thread
  std::vector<std::string> endpoints;         // endpoint of each connection id
  bool stopped = false;

  std::atomic<bool> running{true};

  void Wake() {
    const uint64_t one = 1;
    // eventfd writes of 8 bytes cannot be partial; EAGAIN means the counter
    // is saturated, i.e. a wake-up is already pending.
    [[maybe_unused]] ssize_t n = ::write(wake_fd, &one, sizeof(one));
  }

  void Loop();
  void RebuildPollItems();
  void DrainQueues();
  void SendNow(Outgoing& out);
  void ReceiveAll(zmq::socket_t& socket, int connection);
  void HandleMonitor(int connection);
  void Deliver(const Route& from, std::vector<zmq::message_t>& parts, size_t header_index);
  void CloseAll();
};

Result<std::unique_ptr<Van>> Van::Create(VanOptions options, VanReceiver* receiver) {
  CHECK(receiver != nullptr);
  auto impl = std::make_unique<Impl>(options, receiver);
  impl->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl->wake_fd < 0) {
    return Status::IOError("eventfd failed", std::strerror(errno));
  }
  Impl* raw = impl.get();
  impl->io_thread = std::thread([raw] { raw->Loop(); });
  return std::unique_ptr<Van>(new Van(std::move(impl)));
}

Van::Van(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Van::~Van() {
  Stop();
  ::close(impl_->wake_fd);
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
}

Result<std::string> Van::Bind(const std::string& endpoint) {
  FLEET_ASSIGN_OR_RETURN(std::string zmq_endpoint, ToZmqEndpoint(endpoint, /*allow_port0=*/true));
  // zmq wants "*" for an ephemeral port.
  if (zmq_endpoint.ends_with(":0")) zmq_endpoint.replace(zmq_endpoint.size() - 1, 1, "*");
  auto done = std::make_shared<std::promise<Result<std::string>>>();
  std::future<Result<std::string>> result = done->get_future();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopped) return Status::FailedPrecondition("van stopped", endpoint);
    Impl* impl = impl_.get();
    impl_->control.push_back([impl, zmq_endpoint, endpoint, done] {
      if (impl->router) {
        done->set_value(Status::FailedPrecondition("van already bound", endpoint));
        return;
      }
      auto router = std::make_unique<zmq::socket_t>(impl->context, zmq::socket_type::router);
      SetCommonOptions(*router, impl->options);
      router->set(zmq::sockopt::router_mandatory, 1);
      try {
        router->bind(zmq_endpoint);
      } catch (const zmq::error_t& e) {
        done->set_value(Status::Unavailable(absl::StrCat("cannot bind: ", e.what()), endpoint));
        return;
      }
      std::string bound = router->get(zmq::sockopt::last_endpoint);
      impl->router = std::move(router);
      impl->RebuildPollItems();
      done->set_value(bound.starts_with("tcp://") ? bound.substr(6) : bound);
    });
  }
  impl_->Wake();
  // The I/O thread runs control work within one tick; 10 s means it is wedged.
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    return Status::Timeout("van I/O thread did not bind within 10000 ms", endpoint);
  }
  return result.get();
}

Result<int> Van::Connect(const std::string& endpoint) {
  FLEET_ASSIGN_OR_RETURN(std::string zmq_endpoint, ToZmqEndpoint(endpoint, /*allow_port0=*/false));
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->stopped) return Status::FailedPrecondition("van stopped", endpoint);
  const int id = static_cast<int>(impl_->endpoints.size());
  impl_->endpoints.push_back(zmq_endpoint);
  Impl* impl = impl_.get();
  impl_->control.push_back([impl, zmq_endpoint, id] {
    auto conn = std::make_unique<Impl::Connection>();
    conn->endpoint = zmq_endpoint;
    conn->dealer = zmq::socket_t(impl->context, zmq::socket_type::dealer);
    SetCommonOptions(conn->dealer, impl->options);
    const std::string monitor_addr = absl::StrCat("inproc://van-monitor-", id, "-",
                                                  reinterpret_cast<uintptr_t>(impl));
    zmq_socket_monitor(conn->dealer.handle(), monitor_addr.c_str(),
                       ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED);
    conn->monitor = zmq::socket_t(impl->context, zmq::socket_type::pair);
    conn->monitor.set(zmq::sockopt::linger, 0);
    conn->monitor.connect(monitor_addr);
    conn->dealer.connect(zmq_endpoint);
    CHECK_EQ(static_cast<int>(impl->connections.size()), id);
    impl->connections.push_back(std::move(conn));
    impl->RebuildPollItems();
  });
  // Wake outside the lock is not needed for correctness; eventfd is cheap.
  impl_->Wake();
  return id;
}

Status Van::Send(const Route& to, Message message) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stopped) return Status::FailedPrecondition("van stopped");
    impl_->outbox.push_back({to, std::move(message)});
  }
  impl_->Wake();
  return Status::OK();
}

std::string Van::endpoint(int connection) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  CHECK(connection >= 0 && connection < static_cast<int>(impl_->endpoints.size()));
  return impl_->endpoints[connection];
}

// ---- I/O thread ----

void Van::Impl::RebuildPollItems() {
  poll_items.clear();
  poll_items.push_back({nullptr, wake_fd, ZMQ_POLLIN, 0});
  poll_items.push_back({router ? router->handle() : nullptr, -1, router ? ZMQ_POLLIN : 0, 0});
  for (auto& c : connections) {
    poll_items.push_back({c->dealer.handle(), -1, ZMQ_POLLIN, 0});
    poll_items.push_back({c->monitor.handle(), -1, ZMQ_POLLIN, 0});
  }
}

void Van::Impl::Loop() {
  RebuildPollItems();
  while (running.load(std::memory_order_relaxed)) {
    try {
      zmq::poll(poll_items.data(), poll_items.size(), options.tick);
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      LOG(ERROR) << "van poll failed: " << e.what();
      break;
    }
    // Copy the revents we need first: handlers below may rebuild poll_items.
    const bool wake = poll_items[0].revents & ZMQ_POLLIN;
    const bool router_ready = poll_items[1].revents & ZMQ_POLLIN;
    std::vector<std::pair<bool, bool>> conn_ready(connections.size());
    for (size_t c = 0; c < connections.size(); ++c) {
      conn_ready[c] = {poll_items[2 + 2 * c].revents & ZMQ_POLLIN,
                       poll_items[3 + 2 * c].revents & ZMQ_POLLIN};
    }
    if (wake) {
      uint64_t count;
      [[maybe_unused]] ssize_t n = ::read(wake_fd, &count, sizeof(count));
    }
    // Always drain: a wake-up may have raced with the previous drain.
    DrainQueues();
    if (router_ready) ReceiveAll(*router, -1);
    for (size_t c = 0; c < conn_ready.size(); ++c) {
      if (conn_ready[c].first) ReceiveAll(connections[c]->dealer, static_cast<int>(c));
      if (conn_ready[c].second) HandleMonitor(static_cast<int>(c));
    }
    receiver->OnTick(std::chrono::steady_clock::now());
  }
  CloseAll();
}

void Van::Impl::DrainQueues() {
  std::deque<std::function<void()>> work;
  std::deque<Outgoing> out;
  {
    std::lock_guard<std::mutex> lock(mu);
    work.swap(control);
    out.swap(outbox);
  }
  // Control first: a Send to a new connection was queued after its Connect.
  for (auto& fn : work) fn();
  for (auto& o : out) SendNow(o);
}

void Van::Impl::SendNow(Outgoing& out) {
  zmq::socket_t* socket = nullptr;
  if (out.to.outgoing()) {
    if (out.to.connection >= static_cast<int>(connections.size())) {
      LOG(WARNING) << "van: dropping message to unknown connection " << out.to.connection;
      return;
    }
    socket = &connections[out.to.connection]->dealer;
  } else {
    if (!router) {
      LOG(WARNING) << "van: dropping reply, no bound socket";
      return;
    }
    socket = router.get();
  }
  std::string header = out.message.header.SerializeAsString();
  const auto& frames = out.message.frames;
  try {
    if (!out.to.outgoing()) {
      socket->send(zmq::buffer(out.to.routing_id), zmq::send_flags::sndmore);
    }
    socket->send(zmq::buffer(header),
                 frames.empty() ? zmq::send_flags::dontwait
                                : zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    for (size_t i = 0; i < frames.size(); ++i) {
      zmq::message_t part = ToZmq(frames[i]);
      socket->send(part, i + 1 == frames.size()
                             ? zmq::send_flags::dontwait
                             : zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    }
  } catch (const zmq::error_t& e) {
    // EHOSTUNREACH: the caller that sent the request has disconnected.
    LOG(WARNING) << "van: send of command " << out.message.header.command() << " failed: "
                 << e.what();
  }
}

void Van::Impl::ReceiveAll(zmq::socket_t& socket, int connection) {
  // Drain everything readable now, so one poll serves a burst.
  for (;;) {
    std::vector<zmq::message_t> parts;
    zmq::message_t part;
    if (!socket.recv(part, zmq::recv_flags::dontwait)) return;
    bool more = part.more();
    parts.push_back(std::move(part));
    while (more) {
      zmq::message_t next;
      // The rest of a multipart message is already here; ZeroMQ delivers
      // multipart messages atomically.
      (void)socket.recv(next, zmq::recv_flags::none);
      more = next.more();
      parts.push_back(std::move(next));
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
  }
}

void Van::Impl::Deliver(const Route& from, std::vector<zmq::message_t>& parts,
                        size_t header_index) {
  if (parts.size() <= header_index) {
    LOG_EVERY_N(WARNING, 100) << "van: dropping message without header frame ("
                              << google::COUNTER << " so far)";
    return;
  }
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

void Van::Impl::HandleMonitor(int connection) {
  Connection& c = *connections[connection];
  for (;;) {
    zmq::message_t event_part;
    if (!c.monitor.recv(event_part, zmq::recv_flags::dontwait)) return;
    zmq::message_t address_part;
    if (event_part.more()) (void)c.monitor.recv(address_part, zmq::recv_flags::none);
    if (event_part.size() < sizeof(uint16_t)) continue;
    uint16_t event;
    std::memcpy(&event, event_part.data(), sizeof(event));
    if (event == ZMQ_EVENT_DISCONNECTED) {
      receiver->OnConnectionDown(
          connection, c.endpoint,
          Status::Unavailable("connection lost (peer closed, crashed or missed heartbeats)",
                              c.endpoint));
    } else if (event == ZMQ_EVENT_CONNECTED) {
      receiver->OnConnectionUp(connection);
    }
  }
}

void Van::Impl::CloseAll() {
  for (auto& c : connections) {
    zmq_socket_monitor(c->dealer.handle(), nullptr, 0);
    c->dealer.close();
    c->monitor.close();
  }
  connections.clear();
  if (router) router->close();
  router.reset();
}

}  // namespace fleet
