// What fleetrun needs to know about this machine: its interface addresses
// and Slurm's node list. Endpoint parsing itself is comm/endpoint.h.
// SplitString, IsLoopback and FirstSlurmHost are pure; the probes
// (LocalIPv4Interfaces, ResolveIPv4) touch the OS. GPUs are counted by
// comm/cluster.h CountGpus.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "comm/status.h"

namespace fleet::launch {

// "a,b,c" -> {"a","b","c"} (no trimming, empty pieces kept).
std::vector<std::string> SplitString(std::string_view text, char sep);

// True when s is a dotted IPv4 address ("10.0.0.2").
bool IsDottedIPv4(const std::string& s);

// True for 127.0.0.0/8.
bool IsLoopback(std::string_view ipv4);

// This machine's IPv4 interface addresses (getifaddrs), loopback included,
// each with the name of its interface ("10.0.0.2" -> "eth0"), in
// getifaddrs' order. IOError when getifaddrs fails.
struct InterfaceAddress {
  std::string address;
  std::string interface;
};
Result<std::vector<InterfaceAddress>> LocalIPv4Interfaces();

// First IPv4 address of `host` (getaddrinfo). NotFound naming the host.
// Blocks for as long as the resolver does.
Result<std::string> ResolveIPv4(const std::string& host);

// First host name of a Slurm node list: "gpu[03-05,9],cpu1" -> "gpu03".
// InvalidArgument for an empty or unbalanced list.
Result<std::string> FirstSlurmHost(std::string_view nodelist);

}  // namespace fleet::launch
