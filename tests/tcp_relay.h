// TcpRelay: a TCP relay on loopback in front of a local port, for tests of
// what a network does to a client: it resets the first connections (a
// server failing under load), and can go silent (a cut that drops every
// packet: nothing answered, nothing reset). Thread-safe.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace fleet::testing {

class TcpRelay {
 public:
  // Relays 127.0.0.1:<a free port> to 127.0.0.1:target_port; the first
  // `resets` connections are reset once they have sent something.
  explicit TcpRelay(int target_port, int resets = 0) : target_port_(target_port), resets_(resets) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listen_fd_, 64), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~TcpRelay() {
    stop_.store(true);
    thread_.join();
    ::close(listen_fd_);
  }
  TcpRelay(const TcpRelay&) = delete;
  TcpRelay& operator=(const TcpRelay&) = delete;

  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  int accepted() const { return accepted_.load(); }
  // Silent: from now on nothing is relayed either way and new connections
  // are never accepted (their handshakes wait in the backlog), as when a
  // link drops every packet. false: relays again.
  void set_silent(bool silent) { silent_.store(silent); }

 private:
  static int Connect(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    return fd;
  }
  void Serve() {
    std::vector<std::pair<int, int>> pairs;  // client, server
    while (!stop_.load()) {
      const bool silent = silent_.load();
      std::vector<pollfd> fds = {{listen_fd_, static_cast<short>(silent ? 0 : POLLIN), 0}};
      for (auto [c, t] : pairs) {
        fds.push_back({c, static_cast<short>(silent ? 0 : POLLIN), 0});
        fds.push_back({t, static_cast<short>(silent ? 0 : POLLIN), 0});
      }
      ::poll(fds.data(), fds.size(), 20);
      if (fds[0].revents & POLLIN) {
        const int client = ::accept(listen_fd_, nullptr, nullptr);
        if (accepted_.fetch_add(1) < resets_) {
          char buf[256];
          [[maybe_unused]] ssize_t n = ::recv(client, buf, sizeof(buf), 0);
          linger reset{1, 0};  // close with RST
          ::setsockopt(client, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
          ::close(client);
        } else {
          pairs.emplace_back(client, Connect(target_port_));
        }
      }
      for (size_t i = 0; i < pairs.size(); ++i) {
        for (int side = 0; side < 2; ++side) {
          if (!(fds[1 + 2 * i + side].revents & (POLLIN | POLLHUP))) continue;
          const int from = side == 0 ? pairs[i].first : pairs[i].second;
          const int to = side == 0 ? pairs[i].second : pairs[i].first;
          char buf[4096];
          const ssize_t n = ::recv(from, buf, sizeof(buf), 0);
          if (n > 0) ::send(to, buf, static_cast<size_t>(n), MSG_NOSIGNAL);
          if (n == 0) ::shutdown(to, SHUT_WR);
        }
      }
    }
    for (auto [c, t] : pairs) {
      ::close(c);
      ::close(t);
    }
  }

  const int target_port_;
  const int resets_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> silent_{false};
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

}  // namespace fleet::testing
