#include "comm/bind_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace fleet {
namespace {

std::string Quoted(std::string_view s) { return "'" + std::string(s) + "'"; }

// Numeric text of an AF_INET / AF_INET6 socket address; empty otherwise.
std::string NumericText(const sockaddr* addr) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (addr->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, buf, sizeof(buf));
  } else if (addr->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

// Binding port 0 of the address is the test a library's listener will face.
bool CanBind(const addrinfo& ai) {
  const int fd = socket(ai.ai_family, ai.ai_socktype | SOCK_CLOEXEC, ai.ai_protocol);
  if (fd < 0) return false;
  const bool ok = bind(fd, ai.ai_addr, ai.ai_addrlen) == 0;
  close(fd);
  return ok;
}

}  // namespace

Result<std::string> ResolveBindAddress(std::string_view host, std::string_view source) {
  if (host.empty()) return Status::InvalidArgument(absl::StrCat(std::string(source), ": empty"));
  const std::string name(host);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* raw = nullptr;
  const int rc = getaddrinfo(name.c_str(), "0", &hints, &raw);
  // Only a zero rc makes `raw` meaningful (the very mistake that crashes libgloo).
  if (rc != 0 || raw == nullptr) {
    const char* why = rc == EAI_SYSTEM ? std::strerror(errno) : gai_strerror(rc);
    return Status::InvalidArgument(absl::StrCat(std::string(source), ": cannot resolve ", Quoted(host), " (",
                                                rc == 0 ? "no address" : why, ")"));
  }
  struct Free {
    void operator()(addrinfo* p) const { freeaddrinfo(p); }
  };
  std::unique_ptr<addrinfo, Free> list(raw);
  std::vector<std::string> tried;
  for (const addrinfo* ai = raw; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) continue;
    const std::string text = NumericText(ai->ai_addr);
    if (CanBind(*ai)) return text;
    tried.push_back(text);
  }
  return Status::InvalidArgument(absl::StrCat(std::string(source), ": ", Quoted(host), " (",
                                              absl::StrJoin(tried, ", "),
                                              ") is not an address of this machine"));
}

Result<std::string> InterfaceAddress(std::string_view iface, std::string_view source) {
  if (iface.empty()) return Status::InvalidArgument(absl::StrCat(std::string(source), ": empty"));
  ifaddrs* raw = nullptr;
  if (getifaddrs(&raw) != 0) {
    return Status::IOError(absl::StrCat(std::string(source), ": cannot list network interfaces"),
                           std::strerror(errno));
  }
  struct Free {
    void operator()(ifaddrs* p) const { freeifaddrs(p); }
  };
  std::unique_ptr<ifaddrs, Free> list(raw);
  std::string v4, v6;
  std::set<std::string> with_address;
  for (const ifaddrs* it = raw; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_name == nullptr) continue;
    const std::string text = NumericText(it->ifa_addr);
    if (text.empty()) continue;
    with_address.insert(it->ifa_name);
    if (iface != it->ifa_name) continue;
    if (it->ifa_addr->sa_family == AF_INET && v4.empty()) v4 = text;
    // A link-local IPv6 address needs a scope id that a bare address loses.
    const bool link_local = it->ifa_addr->sa_family == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(it->ifa_addr)->sin6_addr);
    if (it->ifa_addr->sa_family == AF_INET6 && !link_local && v6.empty()) v6 = text;
  }
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  return Status::InvalidArgument(absl::StrCat(std::string(source), ": no network interface ", Quoted(iface),
                                              " with an address (interfaces here: ",
                                              absl::StrJoin(with_address, ", "), ")"));
}

}  // namespace fleet
