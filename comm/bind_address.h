// Host and interface names turned into numeric addresses this machine can
// bind, resolved here (getaddrinfo, getifaddrs) before any library sees them.
// Why: the Debian libgloo reads getaddrinfo's result list even when the
// lookup failed, so an unresolvable name handed to Gloo is a SIGSEGV instead
// of an error; and a name that resolves to another machine's address only
// fails deep inside a library's bind. Both become InvalidArgument here,
// naming where the name came from (a flag, a config key) and the name.
//
// Thread safety: plain functions; safe from any thread. Blocking: a name
// (not a numeric address) waits for the system resolver (DNS, /etc/hosts),
// bounded by its own timeouts; nothing else blocks.
#pragma once

#include <string>
#include <string_view>

#include "comm/status.h"

namespace fleet {

// A numeric address (IPv4 "10.0.0.2" or IPv6 "::1") of `host` that a TCP
// socket on this machine can bind: each address getaddrinfo gives is tried
// with bind(port 0) and the first that binds is returned. A numeric `host`
// is checked the same way.
// InvalidArgument "<source>: cannot resolve 'host' (<resolver error>)" for an
// unknown name, "<source>: 'host' (1.2.3.4) is not an address of this
// machine" when no address binds, "<source>: empty" for "".
Result<std::string> ResolveBindAddress(std::string_view host, std::string_view source);

// The address of network interface `iface` ("eth0"): its first IPv4 address,
// else its first IPv6 one. InvalidArgument naming `source`, `iface` and the
// interfaces that do have an address when it has none or does not exist;
// IOError when the interfaces cannot be listed.
Result<std::string> InterfaceAddress(std::string_view iface, std::string_view source);

}  // namespace fleet
