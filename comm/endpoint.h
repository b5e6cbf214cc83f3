// Endpoint: a "host:port" pair as given in flags, environment variables and
// configs (FLEET_SERVERS="10.0.0.1:7000,10.0.0.2:7000", --kv_endpoint, ...).
//
// Parsing is strict because these strings come from outside: an empty item,
// a missing or non-numeric port, a port out of range, a malformed IPv4
// address or hostname all give InvalidArgument naming the bad item. IPv6
// literals are not accepted (nothing in FleetPS listens on them).
//
// Thread safety: plain functions over values; safe from any thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "comm/status.h"

namespace fleet {

struct Endpoint {
  // A dotted-quad IPv4 address or an RFC 1123 hostname ("localhost",
  // "node-3.cluster"). Never empty after a successful parse.
  std::string host;
  // 1..65535, or 0 when the parse allowed it (a "pick a free port" listen
  // address).
  int port = 0;

  // "host:port".
  std::string ToString() const;
  bool operator==(const Endpoint&) const = default;
};

struct EndpointParseOptions {
  // Accept port 0 (a listen address that asks the OS for a free port).
  // Peer addresses never have port 0, so the default is to reject it.
  bool allow_port_zero = false;
};

// Parses one "host:port". InvalidArgument names the item and what is wrong
// with it; `source` (a flag or env var name, may be empty) is put in front
// of the message so the user knows where the bad text came from.
Result<Endpoint> ParseEndpoint(std::string_view text, std::string_view source = {},
                               EndpointParseOptions options = {});

// Parses "host:port,host:port,...". An empty string is an empty list; an
// empty item ("a:1,,b:2", trailing comma) is an error. Duplicates are an
// error too: two processes cannot own one endpoint.
Result<std::vector<Endpoint>> ParseEndpointList(std::string_view text,
                                                std::string_view source = {},
                                                EndpointParseOptions options = {});

// "a:1,b:2": the inverse of ParseEndpointList.
std::string JoinEndpoints(const std::vector<Endpoint>& endpoints);

}  // namespace fleet
