// The environment of programs not written for FleetPS: what Paddle's
// fleetrun (PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM, PADDLE_CURRENT_ENDPOINT,
// PADDLE_TRAINER_ENDPOINTS, FLAGS_selected_gpus) and torchrun (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) give
// each process, so an existing Paddle or PyTorch DDP script runs under
// fleetrun unchanged. Collective processes get these beside FLEET_*.
//
// The ports are the launcher's to find (FreeTcpPorts): each rank one for
// Paddle's trainer endpoint, node 0 one more for torch's rendezvous store
// (MASTER_PORT); nodes exchange them through the KV store (NodeInfo).
//
// Thread safety: pure functions, except FreeTcpPorts (binds sockets).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/status.h"

namespace fleet::launch {

// What one node tells the others: its process count, one ip:port per local
// rank, and (node 0 only) the master's ip:port.
struct NodeInfo {
  int nproc = 0;
  std::vector<std::string> endpoints;
  std::string master;  // empty except on node 0
};

// "<nproc>|<ep>,<ep>,...|<master>" (the KV store value) and back.
// ParseNodeInfo: InvalidArgument naming the text when it does not parse.
std::string FormatNodeInfo(const NodeInfo& info);
Result<NodeInfo> ParseNodeInfo(std::string_view text);

// What the compatibility variables are made of, for one process.
struct CompatPlace {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master;                          // ip:port of torch's rendezvous (node 0)
  std::vector<std::string> trainer_endpoints;  // every rank's ip:port, in rank order
  std::string device;                          // "cpu" or "cuda:K"
};

// The (name, value) pairs: torchrun's and Paddle's names. FLAGS_selected_gpus
// only for a cuda:K device (K: the id CUDA gives it in the process).
std::vector<std::pair<std::string, std::string>> CompatEnv(const CompatPlace& place);

// `count` distinct TCP ports free on `host` now (bound together to port 0,
// then closed: the program binds them moments later). IOError naming the
// host when a socket cannot be bound.
Result<std::vector<int>> FreeTcpPorts(const std::string& host, int count);

// How many GPUs a process sees: CUDA_VISIBLE_DEVICES (when set) lists them,
// the rest hidden; entries are counted up to the first that is not a GPU of
// this machine (a number below `physical`, or a GPU-/MIG- UUID), as CUDA
// does. Unset: all `physical` GPUs.
int VisibleGpuCount(const std::optional<std::string>& cuda_visible_devices, int physical);

// The "Distributed Envs" table fleetrun prints for the first process: every
// variable in `env` whose name starts with one of the compatibility or
// FLEET_ prefixes, the job secret left out.
std::string FormatDistributedEnvs(const std::vector<std::pair<std::string, std::string>>& env);

}  // namespace fleet::launch
