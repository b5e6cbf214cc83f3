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
  // One relayed connection: client and server sockets, and whether each
  // has ended (sent EOF or failed), after which it is no longer polled (an
  // ended socket polls readable forever).
  struct Pair {
    int fd[2];
    bool ended[2] = {false, false};
  };
  void Serve() {
    std::vector<Pair> pairs;
    while (!stop_.load()) {
      const bool silent = silent_.load();
      std::vector<pollfd> fds = {{listen_fd_, static_cast<short>(silent ? 0 : POLLIN), 0}};
      for (const Pair& p : pairs) {
        for (int side = 0; side < 2; ++side) {
          fds.push_back({p.fd[side], static_cast<short>(silent || p.ended[side] ? 0 : POLLIN), 0});
        }
      }
      ::poll(fds.data(), fds.size(), 20);
      for (size_t i = 0; i < pairs.size(); ++i) {
        for (int side = 0; side < 2; ++side) {
          if (!(fds[1 + 2 * i + side].revents & (POLLIN | POLLHUP | POLLERR))) continue;
          const int from = pairs[i].fd[side];
          const int to = pairs[i].fd[1 - side];
          char buf[4096];
          const ssize_t n = ::recv(from, buf, sizeof(buf), 0);
          if (n > 0) ::send(to, buf, static_cast<size_t>(n), MSG_NOSIGNAL);
          if (n <= 0) {
            pairs[i].ended[side] = true;
            ::shutdown(to, SHUT_WR);
          }
        }
      }
      // A connection both sides ended is closed; the others stay in order.
      for (size_t i = pairs.size(); i-- > 0;) {
        if (pairs[i].ended[0] && pairs[i].ended[1]) {
          ::close(pairs[i].fd[0]);
          ::close(pairs[i].fd[1]);
          pairs.erase(pairs.begin() + static_cast<std::ptrdiff_t>(i));
        }
      }
      if (fds[0].revents & POLLIN) {
        const int client = ::accept(listen_fd_, nullptr, nullptr);
        if (accepted_.fetch_add(1) < resets_) {
          char buf[256];
          [[maybe_unused]] ssize_t n = ::recv(client, buf, sizeof(buf), 0);
          linger reset{1, 0};  // close with RST
          ::setsockopt(client, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
          ::close(client);
        } else {
          pairs.push_back(Pair{.fd = {client, Connect(target_port_)}});
        }
      }
    }
    for (const Pair& p : pairs) {
      ::close(p.fd[0]);
      ::close(p.fd[1]);
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
