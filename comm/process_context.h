// ProcessContext: what a FleetPS program knows about itself once its flags
// are parsed, built the same way by every program (ps_server, ps_worker,
// heter_worker, and the collective ranks through collective/rank_setup.h):
//
//   the cluster spec (comm/cluster.h: flags, else FLEET_* variables), its
//   role (the program's own, the default when neither --role nor FLEET_ROLE
//   is given, and the only one accepted), the endpoint it listens on, the
//   job's credentials, SIGTERM/SIGINT as a stop request, its device
//   normalised once ("cpu" or "cuda:K"), and its restart generation.
//
// A PS program adds its job config and transport credentials on top
// (ps/ps_process.h); a collective program reads its own config.
//
//   ProcessContextOptions o{.program = "ps_server", .role = Role::kServer};
//   o.endpoint_flag = FLAGS_endpoint;
//   o.watch_stop_signals = true;
//   FLEET_ASSIGN_OR_RETURN(std::unique_ptr<ProcessContext> ctx, ProcessContext::Create(o));
//
// Thread safety: Create reads gflags and, with watch_stop_signals, must run
// before the program starts any thread (StopSignalWatcher). After that the
// accessors are const and safe from any thread; the stop state is atomic.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm/cluster.h"
#include "comm/job_auth.h"
#include "comm/status.h"
#include "comm/stop_signal.h"

namespace fleet {

struct ProcessContextOptions {
  // The program, as its errors name it ("ps_server").
  std::string program;
  // The role the program runs as: the default when neither --role nor
  // FLEET_ROLE is given, and the only one accepted.
  Role role = Role::kWorker;
  // The program's --endpoint flag; empty when not given or not a flag of it
  // (listen_endpoint() then takes the role's list).
  std::string endpoint_flag = {};
  // Whether SIGTERM and SIGINT become a stop request (stop_requested(),
  // WaitForStop) instead of killing the process. Programs that want it set
  // it; the collective ranks leave it off and die on a signal, as before.
  bool watch_stop_signals = false;
  // With watch_stop_signals: runs on the watcher thread for each signal,
  // after stop_requested() became true. May be empty.
  std::function<void(int signal)> on_stop = {};
  // Where the FLEET_* variables come from; tests pass EnvFromMap.
  EnvLookup env = ProcessEnv();
};

class KvStoreServer;

class ProcessContext {
 public:
  // Installs the stop watcher (when asked), then reads the spec, with
  // another launcher's variables standing in for FLEET_* ones not given
  // (comm/cluster.h ReadLauncherEnv; the start-up line, spec().ToString(),
  // names them). Rank 0 of a job given torchrun's MASTER_ADDR/MASTER_PORT
  // hosts the job's KV store there, for as long as the context lives.
  // Notes in one log line a CUDA_VISIBLE_DEVICES on a machine without GPU.
  // Errors, each InvalidArgument unless the spec's own says otherwise:
  // whatever ReadLauncherEnv and ClusterSpecFromFlagsAndEnv refuse (a bad
  // rank, endpoint, device, FLEET_RESTART_GENERATION or FLEET_RESTART, a
  // TRAINING_ROLE of another program, ...), a role other than options.role
  // ("<program> runs as role <role> only; --role / FLEET_ROLE says:
  // <other>"), a store to host with auth on and no job secret; Unavailable
  // when that store's address cannot be bound.
  static Result<std::unique_ptr<ProcessContext>> Create(ProcessContextOptions options);

  ProcessContext(const ProcessContext&) = delete;
  ProcessContext& operator=(const ProcessContext&) = delete;
  ~ProcessContext();  // stops the watcher first

  const std::string& program() const { return program_; }
  const ClusterSpec& spec() const { return spec_; }
  Role role() const { return spec_.role; }
  int rank() const { return spec_.rank; }
  // The environment the spec was read from, FLEET_ROLE defaulting to the
  // program's role and another launcher's variables answering for the
  // FLEET_* ones they stand for: later lookups (FLEET_NNODES, ...) use it too.
  const EnvLookup& env() const { return env_; }

  // "cpu" or "cuda:K" (CanonicalDevice of --device / FLEET_DEVICE).
  const std::string& device() const { return device_; }
  // device() when --device or FLEET_DEVICE was given, nullopt when it is
  // only the default (a lone collective rank then picks cuda:0 for a GPU
  // config: collective/rank_setup.h ResolveRankDevice).
  std::optional<std::string> assigned_device() const;

  // FLEET_RESTART_GENERATION: 0 at first start, then fleetrun's restart
  // count. Rendezvous keys carry it.
  int restart_generation() const { return spec_.restart_generation; }
  // FLEET_RESTART > 0 (fleetrun --max_restart restarted this process).
  bool restarted() const { return spec_.restarted; }

  // The "ip:port" to listen on: --endpoint when given, else this rank's
  // entry of the role's list, else 127.0.0.1:0 (a free port).
  const std::string& listen_endpoint() const { return listen_endpoint_; }

  // The job's credentials for KV store requests (spec().credentials): null
  // when auth is off or no secret was given.
  const std::shared_ptr<const JobAuth>& kv_auth() const { return spec_.credentials; }
  // Those of its ZeroMQ traffic given the job config's Distributed.auth:
  // TransportAuth (comm/cluster.h).
  Result<std::shared_ptr<const JobAuth>> TransportAuthFor(bool config_auth) const;

  // The real "ip:port" of every process of `role` (ResolveEndpoints: port-0
  // entries are read from the KV store, waiting up to `timeout`).
  Result<std::vector<std::string>> PeerEndpoints(Role role,
                                                 std::chrono::milliseconds timeout) const;
  // Claims this process's (role, rank) in the KV store as `who`
  // (RegisterRank, waiting up to 10 s for the holder's name); OK without a
  // KV store.
  Status ClaimRank(const std::string& who) const;
  // ClaimRank(bound), then publishes `bound` for peers (PublishEndpoint):
  // claimed first, so a second process given this rank never replaces the
  // first one's endpoint.
  Status Announce(const std::string& bound) const;

  // Set once SIGTERM or SIGINT arrived (watch_stop_signals); never set
  // otherwise. Lives as long as the context.
  const std::atomic<bool>& stop_requested() const { return stop_requested_; }
  // Whether `signal` (SIGTERM or SIGINT) was among those received.
  bool ReceivedSignal(int signal) const;
  // Blocks until a stop was requested or `timeout` passed; true when one was.
  bool WaitForStop(std::chrono::milliseconds timeout);
  // Requests a stop as SIGTERM would (stop_requested(), WaitForStop), for a
  // reason of the program's own (the job failed elsewhere); on_stop is not
  // called and ReceivedSignal stays false. Never blocks.
  void RequestStop();

 private:
  ProcessContext() = default;
  void OnSignal(int signal);
  // Serves the job's KV store on `listen` (torchrun's rank 0), which came
  // from torchrun's variables `from` ("MASTER_ADDR:MASTER_PORT").
  Status HostKvStore(const std::string& listen, const std::string& from);

  // Fixed after Create.
  std::string program_;
  ClusterSpec spec_;
  EnvLookup env_;
  std::string device_;
  bool device_given_ = false;
  std::string listen_endpoint_;
  std::function<void(int)> on_stop_;

  // Stop state: written by the watcher thread.
  std::atomic<bool> stop_requested_{false};
  std::atomic<uint32_t> signals_received_{0};  // bit s: signal s arrived
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;

  // The job's KV store when this process hosts it (HostKvStore); null
  // otherwise.
  std::unique_ptr<KvStoreServer> hosted_store_;

  // Last: destroyed (joined) before the state its callback touches.
  std::unique_ptr<StopSignalWatcher> watcher_;
};

}  // namespace fleet
