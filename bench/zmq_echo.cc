#include "bench/zmq_echo.h"

#include <cstring>

namespace fleet::bench {

BareEchoServer::BareEchoServer(const std::string& ip) {
  router_.set(zmq::sockopt::linger, 0);
  router_.bind("tcp://" + ip + ":*");
  endpoint_ = router_.get(zmq::sockopt::last_endpoint);
  thread_ = std::thread([this] { Serve(); });
}

BareEchoServer::~BareEchoServer() {
  // Makes the blocking recv in Serve() fail with ETERM.
  context_.shutdown();
  thread_.join();
}

const char* BareEchoServer::ReplyBuffer(uint64_t size) {
  auto it = replies_.lower_bound(size);
  if (it != replies_.end()) return it->second.get();
  auto buffer = std::make_unique<char[]>(size == 0 ? 1 : size);
  for (uint64_t i = 0; i < size; ++i) buffer[i] = static_cast<char>(i * 131);
  const char* data = buffer.get();
  replies_.emplace(size, std::move(buffer));
  return data;
}

void BareEchoServer::Serve() {
  try {
    for (;;) {
      zmq::message_t id, header, body;
      (void)router_.recv(id);
      (void)router_.recv(header);
      if (!header.more()) continue;  // malformed: no payload frame
      (void)router_.recv(body);
      while (body.more()) (void)router_.recv(body);  // extra frames: keep the last
      uint64_t reply_size = BareEchoServer::kEcho;
      if (header.size() == sizeof(reply_size)) std::memcpy(&reply_size, header.data(), sizeof(reply_size));
      router_.send(id, zmq::send_flags::sndmore);
      if (reply_size == kEcho) {
        router_.send(body, zmq::send_flags::none);
      } else {
        // The buffer outlives every message that refers to it.
        zmq::message_t reply(const_cast<char*>(ReplyBuffer(reply_size)), reply_size, nullptr, nullptr);
        router_.send(reply, zmq::send_flags::none);
      }
    }
  } catch (const zmq::error_t& e) {
    if (e.num() != ETERM) throw;
  }
  router_.close();
}

BareEchoClient::BareEchoClient(const std::vector<std::string>& endpoints) {
  for (const std::string& endpoint : endpoints) {
    zmq::socket_t dealer(context_, zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.connect(endpoint);
    dealers_.push_back(std::move(dealer));
  }
}

void BareEchoClient::Send(int server, const void* data, size_t size, uint64_t reply_size, bool zero_copy) {
  zmq::socket_t& d = dealers_[server];
  d.send(zmq::buffer(&reply_size, sizeof(reply_size)), zmq::send_flags::sndmore);
  if (zero_copy) {
    zmq::message_t body(const_cast<void*>(data), size, nullptr, nullptr);
    d.send(body, zmq::send_flags::none);
  } else {
    d.send(zmq::buffer(data, size), zmq::send_flags::none);
  }
}

zmq::message_t BareEchoClient::Recv(int server) {
  zmq::message_t reply;
  (void)dealers_[server].recv(reply);
  return reply;
}

}  // namespace fleet::bench
