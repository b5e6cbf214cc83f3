// ClusterSpec: who this process is (role, rank) and where everyone else is
// (server, worker and heter-worker endpoints, the KV store), read once at
// startup from command-line flags and, for any flag not given on the command
// line, from the FLEET_* environment variables fleetrun sets. A flag on the
// command line always wins over the environment.
//
//   flag             env var               default  meaning
//   --role           FLEET_ROLE            (none)   server | worker | heter_worker | collective
//   --rank           FLEET_RANK            0        this process's index within its role; a
//                                                   server's or heter worker's default is the
//                                                   position of --endpoint (FLEET_ENDPOINT) in its
//                                                   list; several workers need it given
//   --world_size     FLEET_WORLD_SIZE      derived  processes in this role; default: the length
//                                                   of the role's endpoint list, else 1
//   --servers        FLEET_SERVERS         ""       "ip:port,ip:port" of the PS servers
//   --workers        FLEET_WORKERS         ""       endpoints of the workers / collective ranks
//                                                   (a bare ip = ip:0, as fleetrun takes it)
//   --heter_workers  FLEET_HETER_WORKERS   ""       endpoints of the heter workers
//   --kv_endpoint    FLEET_KV_ENDPOINT     ""       "host:port" of fleetrun's KV store
//   --job_id         FLEET_JOB_ID          default  scopes KV keys; [A-Za-z0-9_.-]+
//   --device         FLEET_DEVICE          cpu      cpu | cuda | cuda:N (gpu[:N] too)
//   --log_dir (glog) FLEET_LOG_DIR         ""       where <role>log.<rank> goes; empty = stderr
//   --auth           FLEET_AUTH            on       on | off: authenticate every message of
//                                                   the job's traffic (comm/job_auth.h); off
//                                                   only on a trusted network
//   --job_secret_file FLEET_JOB_SECRET_FILE ""      file holding the job secret, mode 600
//   (no flag)        FLEET_JOB_SECRET      ""       the job secret itself; never a flag (flags
//                                                   show in `ps`). Used when no file is named.
//   (no flag)        FLEET_RESTART_GENERATION 0    rendezvous key generation: fleetrun sets
//                                                   the process's restart count (0 at first
//                                                   start); Gloo/NCCL groups key by it
//   (no flag)        FLEET_RESTART         0        set (> 0) only on a restart: a server reloads
//                                                   its recovery checkpoint and replays its log
//
// Other launchers' variables stand in for FLEET_* ones a process was not
// given (ReadLauncherEnv below), so torchrun, Paddle's launcher or a user
// copying their recipes can start FleetPS programs by hand.
//
// Every value is validated; a bad one is InvalidArgument naming the flag or
// variable it came from and the offending text.
//
// Thread safety: ClusterSpecFromFlagsAndEnv reads gflags, so call it from
// main() after gflags::ParseCommandLineFlags, before starting threads that
// change flags. The returned spec is a plain value.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/endpoint.h"
#include "comm/job_auth.h"
#include "comm/status.h"

namespace fleet {

enum class Role { kServer, kWorker, kHeterWorker, kCollective };

// "server", "worker", "heter_worker", "collective".
std::string_view RoleName(Role role);
// InvalidArgument naming `source` for anything else.
Result<Role> ParseRole(std::string_view text, std::string_view source);

struct ClusterSpec {
  Role role = Role::kWorker;
  int rank = 0;
  int world_size = 1;
  std::vector<Endpoint> servers;
  std::vector<Endpoint> workers;
  std::vector<Endpoint> heter_workers;
  // Empty host when no KV store was given.
  std::optional<Endpoint> kv_endpoint;
  std::string job_id = "default";
  // "cpu", "cuda", "cuda:N" ("gpu", "gpu:N" are synonyms).
  std::string device = "cpu";
  std::string log_dir;
  // --auth / FLEET_AUTH.
  bool auth = true;
  // The job's credentials, from the secret file or FLEET_JOB_SECRET; null
  // when auth is off or no secret was given. KV store clients sign with
  // them; the ZeroMQ transport takes them through TransportAuth().
  std::shared_ptr<const JobAuth> credentials;
  // FLEET_RESTART_GENERATION: how many times fleetrun restarted this
  // process. Collective groups put it in their rendezvous keys
  // (GlooCollectiveOptions::generation) so a restarted process never reads
  // keys its previous life published.
  int restart_generation = 0;
  // FLEET_RESTART > 0: fleetrun restarted this process (--max_restart). It
  // sets it with the generation, but only on a restart; a parameter server
  // started with it recovers (ps/job_config.h, server.recovery_dir).
  bool restarted = false;
  // When another launcher's variables gave this process its place
  // (LauncherEnv::summary): "torchrun's RANK=1 WORLD_SIZE=2 ..."; else empty.
  std::string launcher_env;

  // The endpoint list of `role` (workers for collective).
  const std::vector<Endpoint>& EndpointsOf(Role role) const;
  // That of this process's role.
  const std::vector<Endpoint>& RoleEndpoints() const { return EndpointsOf(role); }
  // "worker 3/8 job=x device=cpu ...", for logs; with the other launcher's
  // variables it was read from, if any.
  std::string ToString() const;
};

// The device `text` names, as trainers take it: "cpu" or "cuda:K". "cuda"
// and "gpu" are cuda:0, "gpu:K" is cuda:K (K: 1-3 digits). InvalidArgument
// "bad <source>: want cpu, cuda or cuda:N" naming the text otherwise.
Result<std::string> CanonicalDevice(std::string_view text, std::string_view source);

// Looks a variable up: its value, or nullopt when unset. Injected so tests
// never touch the process environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// std::getenv, the lookup main() passes.
EnvLookup ProcessEnv();
// A lookup over a fixed map, for tests.
EnvLookup EnvFromMap(std::map<std::string, std::string> vars);

// Another launcher's variables, read as the FLEET_* ones they stand for
// (which, like flags, win over them):
//
//   torchrun (role collective: mnist_mlp, gpt_pretrain):
//     RANK -> FLEET_RANK, WORLD_SIZE -> FLEET_WORLD_SIZE,
//     LOCAL_WORLD_SIZE -> FLEET_NPROC_PER_NODE (and FLEET_NNODES when it
//     divides WORLD_SIZE; 1 without it when MASTER_ADDR is loopback),
//     LOCAL_RANK -> FLEET_DEVICE cuda:LOCAL_RANK on a machine with GPUs,
//     MASTER_ADDR:MASTER_PORT -> FLEET_KV_ENDPOINT, which rank 0 hosts (as
//     torch's env:// rank 0 hosts its store on MASTER_PORT): host_kv_store;
//     MASTER_PORT+1 instead when TORCHELASTIC_USE_AGENT_STORE=True (torchrun's
//     agent holds MASTER_PORT with its own store).
//   Paddle's parameter-server launcher (ps_server, ps_worker, heter_worker):
//     TRAINING_ROLE (PSERVER, TRAINER, HETER_TRAINER) -> the role, checked
//     against the program's; PADDLE_PSERVERS_IP_PORT_LIST -> FLEET_SERVERS;
//     PADDLE_TRAINER_ENDPOINTS -> FLEET_WORKERS; PADDLE_TRAINERS_NUM ->
//     FLEET_WORLD_SIZE (workers); PADDLE_TRAINER_ID -> FLEET_RANK (workers);
//     POD_IP:PADDLE_PORT -> FLEET_ENDPOINT (servers, heter workers; the rank
//     is its place in the list).
//
// None is read when the process has fleetrun's own (FLEET_ROLE or
// FLEET_KV_ENDPOINT set: fleetrun gives collective processes torchrun's
// names too, for scripts not written for FleetPS).
struct LauncherEnv {
  // "torchrun" or "Paddle"; empty when no variable of theirs is read.
  std::string launcher;
  // FLEET_* name -> (value, the variables it came from: "RANK",
  // "POD_IP:PADDLE_PORT").
  std::map<std::string, std::pair<std::string, std::string>> values;
  // For the start-up line: "torchrun's RANK=1 WORLD_SIZE=2 MASTER_ADDR=...".
  std::string summary;
  // Set for torchrun's variables: the address rank 0 hosts the job's KV
  // store on (MASTER_ADDR:MASTER_PORT, or +1; values["FLEET_KV_ENDPOINT"]
  // says which); ProcessContext does.
  std::optional<std::string> host_kv_store;
};

// Reads the variables above for a process of `role` (the program's) from
// `env`. InvalidArgument naming the variable for one that contradicts the
// program (TRAINING_ROLE=TRAINER for ps_server), MASTER_ADDR without
// MASTER_PORT (or the reverse), or a value that does not parse.
Result<LauncherEnv> ReadLauncherEnv(Role role, const EnvLookup& env);
// `env` with `launcher`'s values answering for the FLEET_* variables `env`
// does not have.
EnvLookup WithLauncherEnv(EnvLookup env, LauncherEnv launcher);

// Number of NVIDIA GPUs, counted as /dev/nvidia<N> device nodes under
// `dev_dir` (no CUDA link needed). 0 when there are none.
int CountGpus(const std::string& dev_dir = "/dev");

// The KV store key under which a process of `role` publishes the endpoint it
// actually bound ("endpoints/server/0"), so port 0 works in simulation.
std::string EndpointKey(Role role, int rank);

// Publishes the endpoint this process bound at EndpointKey(spec.role,
// spec.rank) in the spec's KV store, so processes given port 0 can be found
// (ResolveEndpoints); OK without doing anything when there is no KV store.
// Errors: the store's, with the key.
Status PublishEndpoint(const ClusterSpec& spec, const std::string& bound);

// Claims (spec.role, spec.rank) for this process in the spec's KV store, so
// two processes given the same rank are told at start instead of failing
// later. The first claim wins; a later one gets InvalidArgument naming the
// holder and how to fix it, unless this process is a restart
// (restart_generation > 0) or the holder is gone (its endpoint refuses
// connections, or its pid on this host is gone), which take the rank over. `who` names this
// process in messages (its endpoint, or host and pid). OK without doing
// anything when there is no KV store; the store's errors otherwise. Blocks
// up to `timeout` reading the holder's name.
Status RegisterRank(const ClusterSpec& spec, const std::string& who,
                    std::chrono::milliseconds timeout);

// The real "ip:port" of every entry of `list` (the endpoints of `role`'s
// ranks 0, 1, ...). An entry with port 0 was bound by that process itself
// and is read from the KV store of `spec` at EndpointKey(role, rank),
// waiting up to `timeout` for it to be published. InvalidArgument when an
// entry has port 0 and the spec names no KV store; the KV store's errors
// (Timeout naming the key) otherwise.
Result<std::vector<std::string>> ResolveEndpoints(const std::vector<Endpoint>& list, Role role,
                                                  const ClusterSpec& spec,
                                                  std::chrono::milliseconds timeout);

// The credentials a program's ZeroMQ transport (VanOptions::auth) uses:
// null when `spec.auth` or `config_auth` (the job config's Distributed.auth)
// is off; InvalidArgument, saying how to give one, when both are on and no
// secret was given.
Result<std::shared_ptr<const JobAuth>> TransportAuth(const ClusterSpec& spec, bool config_auth);

// Builds the spec from gflags and `env` as described at the top of this
// file. Returns InvalidArgument for a missing role, a non-numeric or out of
// range rank or world size, a bad endpoint or endpoint list, a bad job id
// or device, a bad --auth, a secret too short, or a secret file that group
// or others can read (NotFound / IOError when it cannot be read). A missing
// secret is not an error here: see TransportAuth.
Result<ClusterSpec> ClusterSpecFromFlagsAndEnv(const EnvLookup& env);
// The same with another launcher's variables (ReadLauncherEnv) standing in
// for the FLEET_* ones `env` lacks; errors name the variable a value came
// from ("bad RANK (torchrun's): ...").
Result<ClusterSpec> ClusterSpecFromFlagsAndEnv(const EnvLookup& env, const LauncherEnv& launcher);

}  // namespace fleet
