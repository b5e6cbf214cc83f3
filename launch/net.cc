#include "launch/net.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <set>

namespace fleet::launch {
bool IsDottedIPv4(const std::string& s) {
  in_addr addr{};
  return inet_pton(AF_INET, s.c_str(), &addr) == 1;
}

std::vector<std::string> SplitString(std::string_view text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t pos = text.find(sep, start);
    out.emplace_back(text.substr(start, pos == std::string_view::npos ? text.size() - start : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

bool IsLoopback(std::string_view ipv4) { return ipv4.starts_with("127."); }

Result<std::vector<InterfaceAddress>> LocalIPv4Interfaces() {
  ifaddrs* raw = nullptr;
  if (getifaddrs(&raw) != 0) return Status::IOError("getifaddrs failed", std::strerror(errno));
  struct Free {
    void operator()(ifaddrs* p) const { freeifaddrs(p); }
  };
  std::unique_ptr<ifaddrs, Free> list(raw);
  std::vector<InterfaceAddress> out;
  for (ifaddrs* it = raw; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN] = {};
    const auto* sin = reinterpret_cast<const sockaddr_in*>(it->ifa_addr);
    if (inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf)) == nullptr) continue;
    if (std::none_of(out.begin(), out.end(), [&](const InterfaceAddress& a) { return a.address == buf; })) {
      out.push_back({buf, it->ifa_name ? it->ifa_name : ""});
    }
  }
  return out;
}

Result<std::string> ResolveIPv4(const std::string& host) {
  if (IsDottedIPv4(host)) return host;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* raw = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &raw);
  if (rc != 0 || raw == nullptr) return Status::NotFound(std::string("cannot resolve host (") + gai_strerror(rc) + ")", host);
  struct Free {
    void operator()(addrinfo* p) const { freeaddrinfo(p); }
  };
  std::unique_ptr<addrinfo, Free> list(raw);
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(raw->ai_addr)->sin_addr, buf, sizeof(buf));
  return std::string(buf);
}

Result<std::string> FirstSlurmHost(std::string_view nodelist) {
  // The first host ends at the first comma outside brackets.
  std::string first;
  int depth = 0;
  for (char c : nodelist) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) return Status::InvalidArgument("unbalanced brackets in node list", std::string(nodelist));
    if (c == ',' && depth == 0) break;
    first += c;
  }
  if (depth != 0 || first.empty()) return Status::InvalidArgument("malformed node list", std::string(nodelist));
  size_t open = first.find('[');
  if (open == std::string::npos) return first;
  // "gpu[03-05,9]" -> prefix "gpu", first range "03-05" -> "03".
  std::string prefix = first.substr(0, open);
  std::string inside = first.substr(open + 1, first.find(']') - open - 1);
  std::string head = SplitString(SplitString(inside, ',')[0], '-')[0];
  if (head.empty()) return Status::InvalidArgument("malformed node list", std::string(nodelist));
  return prefix + head + first.substr(first.find(']') + 1);
}

}  // namespace fleet::launch
