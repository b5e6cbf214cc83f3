#include "comm/endpoint.h"

#include <charconv>
#include <set>


namespace fleet {
namespace {

// Splits on `sep`, keeping empty pieces.
std::vector<std::string_view> Split(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    size_t pos = text.find(sep, start);
    if (pos == std::string_view::npos) {
      out.push_back(text.substr(start));
      return out;
    }
    out.push_back(text.substr(start, pos - start));
    start = pos + 1;
  }
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsAlnum(char c) {
  return IsDigit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// Returns an empty string when `host` is a valid IPv4 address or hostname,
// else the reason it is not.
std::string HostProblem(std::string_view host) {
  if (host.empty()) return "empty host";
  if (host.size() > 253) return "host longer than 253 characters";
  bool all_numeric = true;
  for (char c : host) {
    if (!IsDigit(c) && c != '.') all_numeric = false;
  }
  std::vector<std::string_view> labels = Split(host, '.');
  if (all_numeric) {
    // Digits and dots only: it can only mean an IPv4 address.
    if (labels.size() != 4) return "IPv4 address needs 4 parts";
    for (std::string_view part : labels) {
      if (part.empty() || part.size() > 3) return "bad IPv4 part";
      if (part.size() > 1 && part[0] == '0') return "IPv4 part with a leading zero";
      int v = 0;
      std::from_chars(part.data(), part.data() + part.size(), v);
      if (v > 255) return "IPv4 part above 255";
    }
    return {};
  }
  for (std::string_view label : labels) {
    if (label.empty()) return "empty hostname label";
    if (label.size() > 63) return "hostname label longer than 63 characters";
    if (label.front() == '-' || label.back() == '-') return "hostname label starts or ends with '-'";
    for (char c : label) {
      if (!IsAlnum(c) && c != '-') {
        return "character '" + std::string(1, c) + "' not allowed in a hostname";
      }
    }
  }
  return {};
}

Status Bad(std::string_view source, std::string_view item, std::string_view problem) {
  std::string what = "bad endpoint";
  if (!source.empty()) what.append(" in ").append(source);
  std::string which = "'";
  which.append(item).append("' (").append(problem).append(")");
  return Status::InvalidArgument(what, which);
}

}  // namespace

std::string Endpoint::ToString() const { return host + ":" + std::to_string(port); }

Result<Endpoint> ParseEndpoint(std::string_view text, std::string_view source,
                               EndpointParseOptions options) {
  if (text.empty()) return Bad(source, text, "empty item");
  size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) return Bad(source, text, "missing ':port'");
  std::string_view host = text.substr(0, colon);
  std::string_view port_text = text.substr(colon + 1);
  if (host.find(':') != std::string_view::npos) {
    return Bad(source, text, "more than one ':' (IPv6 is not supported)");
  }
  if (port_text.empty()) return Bad(source, text, "missing port");
  if (port_text.size() > 5) return Bad(source, text, "port out of range");
  for (char c : port_text) {
    if (!IsDigit(c)) return Bad(source, text, "port is not a number");
  }
  int port = 0;
  std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port > 65535 || (port == 0 && !options.allow_port_zero)) {
    return Bad(source, text, "port out of range");
  }
  std::string problem = HostProblem(host);
  if (!problem.empty()) return Bad(source, text, problem);
  return Endpoint{std::string(host), port};
}

Result<std::vector<Endpoint>> ParseEndpointList(std::string_view text, std::string_view source,
                                                EndpointParseOptions options) {
  std::vector<Endpoint> out;
  if (text.empty()) return out;
  std::set<std::string> seen;
  for (std::string_view item : Split(text, ',')) {
    FLEET_ASSIGN_OR_RETURN(Endpoint ep, ParseEndpoint(item, source, options));
    // Port 0 ("bind a free port") may repeat: several processes on one host.
    if (ep.port != 0 && !seen.insert(ep.ToString()).second) {
      return Bad(source, item, "listed twice");
    }
    out.push_back(std::move(ep));
  }
  return out;
}

std::string JoinEndpoints(const std::vector<Endpoint>& endpoints) {
  std::string out;
  for (const Endpoint& ep : endpoints) {
    if (!out.empty()) out.push_back(',');
    out.append(ep.ToString());
  }
  return out;
}

}  // namespace fleet
