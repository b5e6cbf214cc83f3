#include "comm/http_listen.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace fleet {
namespace {

// Connections the kernel queues until the listener accepts them (the
// system's own cap, net.core.somaxconn, applies on top).
constexpr int kListenBacklog = SOMAXCONN;

}  // namespace

Result<ListeningSocket> ListenTcp(const std::string& host, int port) {
  const std::string where = absl::StrCat(host, ":", port);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    return Status::InvalidArgument(absl::StrCat("cannot resolve the host: ", gai_strerror(rc)),
                                   where);
  }
  sockaddr_in addr = *reinterpret_cast<const sockaddr_in*>(found->ai_addr);
  ::freeaddrinfo(found);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::IOError(absl::StrCat("socket: ", std::strerror(errno)), where);
  int yes = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(fd, kListenBacklog) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::Unavailable(
        absl::StrCat("cannot listen (", std::strerror(err), "; port in use or address not local)"),
        where);
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return ListeningSocket{fd, ntohs(addr.sin_port)};
}

}  // namespace fleet
