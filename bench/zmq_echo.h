// The bare ZeroMQ reference of the bench/ programs: a ROUTER that answers
// every request on its own thread and context, and DEALER clients. Nothing
// of FleetPS's transport is used, so a FleetPS figure divided by this one is
// the cost of FleetPS itself on the same machine in the same run.
//
// Wire: a request is two frames, [u64 reply_size][payload]. The server
// answers with the payload itself when reply_size == kEcho, otherwise with
// reply_size bytes from a buffer it keeps (sent without copying). So one
// server serves a plain echo (comm_bench) and the asymmetric exchanges of a
// PS pull (small request, large reply) or push (large request, empty reply).
//
// Thread safety: BareEchoServer is thread-safe (its own thread does all the
// work). A BareEchoClient is used by one thread at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

namespace fleet::bench {

class BareEchoServer {
 public:
  static constexpr uint64_t kEcho = UINT64_MAX;

  // Binds tcp://<ip>:* and starts serving.
  explicit BareEchoServer(const std::string& ip = "127.0.0.1");
  ~BareEchoServer();  // stops and joins the thread
  BareEchoServer(const BareEchoServer&) = delete;
  BareEchoServer& operator=(const BareEchoServer&) = delete;

  // "tcp://ip:port" as bound.
  const std::string& endpoint() const { return endpoint_; }

 private:
  void Serve();
  // A buffer of at least `size` bytes that lives as long as the server.
  const char* ReplyBuffer(uint64_t size);

  zmq::context_t context_;
  zmq::socket_t router_{context_, zmq::socket_type::router};
  std::string endpoint_;
  std::map<uint64_t, std::unique_ptr<char[]>> replies_;  // by size; only Serve() touches it
  std::thread thread_;
};

// One DEALER per server, all on one context of its own (as a separate
// process would have).
class BareEchoClient {
 public:
  explicit BareEchoClient(const std::vector<std::string>& endpoints);
  BareEchoClient(const BareEchoClient&) = delete;
  BareEchoClient& operator=(const BareEchoClient&) = delete;

  // Sends `size` bytes at `data` to `server`, asking for `reply_size` bytes
  // back (BareEchoServer::kEcho: the same bytes). zero_copy: ZeroMQ sends
  // from `data` directly, which must then stay unchanged until the reply to
  // this request came back; otherwise the bytes are copied first.
  void Send(int server, const void* data, size_t size, uint64_t reply_size, bool zero_copy);
  // The next reply of `server` (replies of one server come in request order).
  zmq::message_t Recv(int server);

  int num_servers() const { return static_cast<int>(dealers_.size()); }

 private:
  zmq::context_t context_;
  std::vector<zmq::socket_t> dealers_;
};

}  // namespace fleet::bench
