// The launch plan: validated flags turned into who runs where with which
// flags, environment and log file. Everything here is pure (no process is
// started, no socket opened) so tests drive it in-process; the facts about
// the machine come in through MachineInfo.
//
// The process contract (what every started process receives) is written out
// in launch/README.md; RenderProcess is its single implementation.
#pragma once

#include <signal.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/cluster.h"
#include "comm/endpoint.h"
#include "comm/status.h"
#include "launch/options.h"

namespace fleet::launch {

// Roles, their FLEET_ROLE names and EndpointKey are the processes' own
// (comm/cluster.h), so launcher and binaries cannot disagree.
using ::fleet::EndpointKey;
using ::fleet::Role;
using ::fleet::RoleName;

// Facts about this machine, gathered once by the launcher (see
// GatherMachineInfo in launcher.h) and given in so planning stays pure.
struct MachineInfo {
  std::vector<std::string> local_addresses;  // IPv4, loopback included
  // The interface of each of them ("10.0.0.2" -> "eth0").
  std::map<std::string, std::string> interface_of;
  // NCCL_SOCKET_IFNAME as fleetrun was given it (unset: nullopt).
  std::optional<std::string> nccl_socket_ifname;
  int gpu_count = 0;
  // CUDA_VISIBLE_DEVICES as fleetrun was given it (unset: nullopt).
  std::optional<std::string> cuda_visible_devices;
  std::string self_dir;  // folder of the fleetrun executable
  std::string path_env;  // $PATH, for finding PROGRAM
  // Slurm's view, empty outside Slurm.
  std::string slurm_procid, slurm_nnodes, slurm_nodelist, slurm_nodeid;
  // SLURM_NODELIST's first host resolved to IPv4 (empty outside Slurm).
  std::string slurm_master_ip;
};

// Upper bounds of the counts and durations fleetrun accepts (also in the
// flag table): far above any job it runs, low enough that a typo
// (--server_num=100000) is refused before anything starts instead of
// forking until memory runs out.
inline constexpr int kMaxProcessesPerRole = 1024;  // each PS count or list, --nproc_per_node, --gpus
inline constexpr int kMaxNodes = 1024;             // --nnodes, --ips
inline constexpr int kMaxRestart = 100;            // --max_restart
inline constexpr double kMaxSeconds = 86400;       // --grace_period, --rendezvous_timeout
// The KV store's port when the job spans machines and --http_port is not
// given (on one machine: a free port).
inline constexpr int kDefaultHttpPort = 36001;

// kStoreOnly: --store_only, the KV store alone for processes started by hand.
enum class Mode { kPsSimulation, kPsCluster, kCollective, kStoreOnly };

// How this node finds its collective node rank.
enum class NodeRankSource {
  kSingleNode,  // nnodes == 1: rank 0, no rendezvous
  kKnown,       // from --ips position or Slurm
  kAssigned,    // handed out by the master's store (KvStoreClient::Add)
};

struct CollectiveLayout {
  std::string program;  // as given; execvp-style lookup is done in ResolveLayout
  std::string program_path;
  std::vector<std::string> program_args;
  std::vector<std::string> devices;  // one per local process: "cpu" or "cuda:K"
  int nnodes = 1;
  int node_rank = 0;       // valid once node_rank_source is resolved
  NodeRankSource node_rank_source = NodeRankSource::kSingleNode;
  // Filled after the node rendezvous (or = devices.size() on one node).
  int rank_offset = 0;
  int world_size = 0;
  // Master without --master: print the command the other nodes run.
  bool print_join_command = false;
  bool from_slurm = false;  // node rank and count came from Slurm's variables
  // The address this node's processes are reached at (127.0.0.1 on one node).
  std::string node_host;
  // Every node's address by node rank, when known before the rendezvous (--ips).
  std::vector<std::string> node_hosts;
  // GPU ranks of a job on several nodes: NCCL's bootstrap and sockets use
  // the interface of node_host ("=eth0"), unless fleetrun was given
  // NCCL_SOCKET_IFNAME (then it is inherited) or the interface is unknown.
  std::string nccl_socket_ifname;
  // For programs not written for FleetPS (launch/compat_env.h), filled by
  // the launcher before the processes start: every rank's ip:port (Paddle's
  // trainer endpoints) and node 0's ip:port for torch's MASTER_ADDR/PORT.
  std::vector<std::string> trainer_endpoints;
  std::string master;
};

struct JobLayout {
  Mode mode = Mode::kPsSimulation;
  std::string job_id;
  std::string log_dir;  // effective: <--log_dir>[/<job_id>]
  std::string bin_dir;
  std::string config;   // empty when not given (collective only)
  std::vector<std::string> overrides;

  // KV store. host_kv: this fleetrun serves it on kv_listen. kv_endpoint is
  // what processes are told; its port is fixed up after a port-0 bind.
  bool host_kv = false;
  std::string kv_listen;
  std::string kv_endpoint;

  // Parameter-server lists, every process of the job (all machines). Port 0
  // = the process binds a free port and publishes it under
  // endpoints/<role>/<rank>; the launcher replaces it with the real one.
  std::vector<Endpoint> servers, heter_workers, workers;
  // Ranks started on this machine.
  std::vector<int> local_servers, local_heter_workers, local_workers;
  // PS mode with a PROGRAM: the workers run it with its ARGS (environment
  // only, as collective PROGRAMs get it) instead of ps_worker, e.g. a PyTorch
  // script over the fleetps module (python/). Empty: ps_worker.
  std::string worker_program;  // as given; execvp-style lookup in ResolveLayout
  std::string worker_program_path;
  std::vector<std::string> worker_program_args;
  int gpu_count = 0;  // heter workers get cuda:(rank % gpu_count) when > 0

  CollectiveLayout collective;

  // --auth. With auth, job_secret (never printed or logged) goes to every
  // process as FLEET_JOB_SECRET, and credentials (derived from it) guard the
  // KV store this fleetrun hosts and sign its own requests. Both are filled
  // by LoadJobSecret (launch/job_secret.h) after ResolveLayout.
  bool auth = true;
  std::string job_secret;
  std::shared_ptr<const JobAuth> credentials;
  std::string auth_note;  // how the secret was obtained, for the start-up lines
  // --metrics_token_file's token (never printed): GET /metrics and the job
  // page answer it (LoadMetricsToken). Empty: not given.
  std::string metrics_token;
  // One-line notes for the start-up lines (e.g. CUDA_VISIBLE_DEVICES on a
  // machine without GPU), each "note: ...".
  std::vector<std::string> notes;
};

// One process to start: everything fork/exec needs.
struct ProcessSpec {
  Role role = Role::kWorker;
  int rank = 0;                  // global rank within its role
  std::string exe;               // path passed to execve
  std::vector<std::string> argv; // argv[0] included
  // Variables set for the child on top of fleetrun's own environment (from
  // which every inherited FLEET_* variable is removed first).
  std::vector<std::pair<std::string, std::string>> env;
  std::string log_path;
  bool tee = false;              // also copy output to fleetrun's stdout
  std::string endpoint;          // announced endpoint (servers, heter), may end ":0"
  // What stops it when the job is abandoned (a process failed, fleetrun was
  // interrupted) rather than finished; SIGTERM at the end of a finished
  // job. ps_server takes SIGINT as "stop without the final save": the
  // tables of an unfinished job are no model to write into server.save_dir.
  int abandon_signal = SIGTERM;
  std::string Name() const { return std::string(RoleName(role)) + " " + std::to_string(rank); }
};

// Whether `name` is one of the FLEET_* variables of the process contract
// (launch/README.md: FLEET_ROLE, FLEET_RANK, ..., FLEET_JOB_SECRET), which
// fleetrun sets itself. The supervisor drops inherited ones, so a stray
// export never reaches a process fleetrun gives no value for; every other
// variable of fleetrun's environment (FLEET_GPT2_VOCAB_DIR, CUDA_*, OMP_*,
// ...) passes through to every process.
bool IsProcessContractVariable(std::string_view name);

// Validates `options` against `machine` and lays out the job. Returns
// InvalidArgument whose message starts with the offending flag ("--servers:
// ...", "PROGRAM: ...") so the launcher can print it as one line and exit 2.
// Checks the files it needs (config, binaries, PROGRAM) exist; touches
// nothing else.
Result<JobLayout> ResolveLayout(const LaunchOptions& options, const MachineInfo& machine);

// The spec for one local process. `rank` is the role rank (for kCollective
// the local rank on this node); `restart` how many times it was restarted
// (FLEET_RESTART_GENERATION; FLEET_RESTART too when > 0). REQUIRES: layout
// came from ResolveLayout and, for collective, the rendezvous fields are
// filled.
ProcessSpec RenderProcess(const JobLayout& layout, Role role, int rank, int restart = 0);


}  // namespace fleet::launch
