#include "collective/rank_setup.h"

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "comm/bind_address.h"
#include "comm/gloo_collective.h"
#include "comm/kv_store.h"
#include "comm/shm_collective.h"
#ifdef FLEET_WITH_NCCL
#include "comm/nccl_collective.h"
#endif

DEFINE_string(cpu_collective, "auto",
              "CPU ranks' collective: shm (shared memory; every rank on this host), gloo (TCP), "
              "or auto: shm when the job has one node (FLEET_NNODES=1, as fleetrun "
              "--nproc_per_node sets), gloo otherwise.");
DEFINE_string(gloo_hostname, "127.0.0.1",
              "Address Gloo binds and advertises (CPU ranks). Unset under fleetrun: this host's "
              "address in the job (FLEET_HOST); else loopback, which fits one machine.");
DEFINE_string(gloo_iface, "", "Network interface for Gloo (e.g. eth0); wins over --gloo_hostname.");

namespace fleet::trainer::collective {

HelpGroup RankSetupHelpGroup() {
  return {"Device and CPU group",
          {GflagsHelpFlag("device", "cpu|cuda:K"), GflagsHelpFlag("cpu_collective", "auto|shm|gloo"),
           GflagsHelpFlag("gloo_hostname", "ADDRESS"), GflagsHelpFlag("gloo_iface", "IFACE")}};
}

Result<std::unique_ptr<ProcessContext>> CollectiveRankContext(const std::string& program) {
  return ProcessContext::Create({.program = program, .role = Role::kCollective});
}

Result<std::string> ResolveRankDevice(bool wants_gpu, const std::optional<std::string>& assigned,
                                      int world_size, int visible_gpus) {
  if (!wants_gpu) return std::string("cpu");
  std::string device;
  if (assigned.has_value()) {
    Result<std::string> canonical = CanonicalDevice(*assigned, "--device / FLEET_DEVICE");
    if (!canonical.ok()) {
      return Status::InvalidArgument("bad device: want cpu, cuda or cuda:N", *assigned);
    }
    device = *canonical;
    if (device == "cpu") {
      return Status::InvalidArgument(
          "the config asks for a GPU (Global.device gpu) but this rank was given cpu "
          "(--device / FLEET_DEVICE); run under fleetrun --gpus=... or set -o Global.device=cpu",
          *assigned);
    }
  } else if (world_size > 1) {
    return Status::InvalidArgument(
        absl::StrCat("the config asks for a GPU (Global.device gpu) and the job has ", world_size,
                     " ranks, but no rank was given its GPU (--device / FLEET_DEVICE)"),
        "run under fleetrun --gpus=...");
  } else {
    device = "cuda:0";  // one process, no launcher: the first GPU
  }
  int index = 0;
  if (!absl::StartsWith(device, "cuda:") || !absl::SimpleAtoi(device.substr(5), &index) ||
      index < 0) {
    return Status::InvalidArgument("bad device: want cpu, cuda or cuda:N", device);
  }
  if (index >= visible_gpus) {
    return Status::Unavailable(
        visible_gpus == 0
            ? std::string("the config asks for a GPU (Global.device gpu) but this machine has "
                          "none that CUDA can use (or FleetPS was built without CUDA); set -o "
                          "Global.device=cpu to train on the CPU")
            : absl::StrCat("only ", visible_gpus, " GPU(s) visible"),
        device);
  }
  return device;
}

Result<int> CpuThreadsPerRank(const EnvLookup& env, int flag_threads) {
  if (flag_threads > 0) return flag_threads;
  int per_node = 1;
  if (std::optional<std::string> n = env("FLEET_NPROC_PER_NODE")) {
    if (!absl::SimpleAtoi(*n, &per_node) || per_node < 1) {
      return Status::InvalidArgument("bad FLEET_NPROC_PER_NODE: want a positive integer",
                                     "'" + *n + "'");
    }
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / per_node);
}

Result<RankGroupOptions> RankGroupOptionsFromFlags(const EnvLookup& env) {
  RankGroupOptions o;
  o.gloo_hostname = FLAGS_gloo_hostname;
  o.gloo_iface = FLAGS_gloo_iface;
  // Under fleetrun, this host's address in the job (FLEET_HOST) unless a
  // flag says otherwise: one command then serves every host of a cluster.
  std::optional<std::string> host = env("FLEET_HOST");
  if (host && !host->empty() && o.gloo_iface.empty() &&
      gflags::GetCommandLineFlagInfoOrDie("gloo_hostname").is_default) {
    o.gloo_hostname = *host;
    o.hostname_flag = "FLEET_HOST (fleetrun's address of this host)";
  }
  o.cpu_collective = FLAGS_cpu_collective;
  if (o.cpu_collective != "auto" && o.cpu_collective != "shm" && o.cpu_collective != "gloo") {
    return Status::InvalidArgument("--cpu_collective: want auto, shm or gloo",
                                   "'" + o.cpu_collective + "'");
  }
  if (std::optional<std::string> n = env("FLEET_NNODES")) {
    if (!absl::SimpleAtoi(*n, &o.nnodes) || o.nnodes < 1) {
      return Status::InvalidArgument("bad FLEET_NNODES: want a positive integer", "'" + *n + "'");
    }
  }
  return o;
}

namespace {

// The fields every collective's options share (Shm-, Gloo-, NcclCollectiveOptions).
template <typename Options>
Options GroupOptions(const ClusterSpec& spec, const RankGroupOptions& options) {
  Options o;
  o.group = options.group;
  o.rank = spec.rank;
  o.size = spec.world_size;
  o.timeout = options.timeout;
  o.generation = spec.restart_generation;
  return o;
}

Result<std::unique_ptr<Collective>> JoinGroup(const ClusterSpec& spec, const Device& device,
                                              const RankGroupOptions& options) {
  if (spec.world_size == 1) return std::unique_ptr<Collective>();
  if (!spec.kv_endpoint) {
    return Status::InvalidArgument(
        "a world of more than 1 needs a KV store: set FLEET_KV_ENDPOINT or --kv_endpoint (fleetrun "
        "does)",
        absl::StrCat("world size ", spec.world_size));
  }
  KvStoreClient kv(spec.kv_endpoint->ToString(), spec.job_id, {.auth = spec.credentials});
  if (device.is_cpu() && (options.cpu_collective == "shm" ||
                          (options.cpu_collective == "auto" && options.nnodes == 1))) {
    ShmCollectiveOptions o = GroupOptions<ShmCollectiveOptions>(spec, options);
    FLEET_ASSIGN_OR_RETURN(std::unique_ptr<ShmCollective> shm, ShmCollective::Create(kv, o));
    return std::unique_ptr<Collective>(std::move(shm));
  }
  if (device.is_cpu()) {
    GlooCollectiveOptions o = GroupOptions<GlooCollectiveOptions>(spec, options);
    // Resolved here so the error names the flag (Create checks it again).
    Result<std::string> address =
        options.gloo_iface.empty()
            ? ResolveBindAddress(options.gloo_hostname, options.hostname_flag)
            : InterfaceAddress(options.gloo_iface, options.iface_flag);
    if (!address.ok()) return address.status();
    o.hostname = *address;
    FLEET_ASSIGN_OR_RETURN(std::unique_ptr<GlooCollective> gloo, GlooCollective::Create(kv, o));
    return std::unique_ptr<Collective>(std::move(gloo));
  }
#ifdef FLEET_WITH_NCCL
  NcclCollectiveOptions o = GroupOptions<NcclCollectiveOptions>(spec, options);
  o.device = device.index;
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<NcclCollective> nccl, NcclCollective::Create(kv, o));
  return std::unique_ptr<Collective>(std::move(nccl));
#else
  return Status::Unavailable("built without CUDA/NCCL: cannot train on", device.ToString());
#endif
}

}  // namespace

Result<std::unique_ptr<Collective>> CreateRankCollective(const ClusterSpec& spec,
                                                         const Device& device,
                                                         const RankGroupOptions& options) {
  Result<std::unique_ptr<Collective>> group = JoinGroup(spec, device, options);
  if (group.ok() && *group) {
    LOG(INFO) << "joined " << (*group)->name() << " group " << options.group << " as rank "
              << spec.rank << " of " << spec.world_size;
  }
  return group;
}

GroupFactory RankGroupFactory(const ClusterSpec& spec, const Device& device,
                              const RankGroupOptions& options) {
  return [spec, device, options](const std::string& name, int rank,
                                 int size) -> Result<std::unique_ptr<Collective>> {
    ClusterSpec member = spec;
    member.rank = rank;
    member.world_size = size;
    RankGroupOptions named = options;
    named.group = absl::StrCat(options.group, ".", name);
    return CreateRankCollective(member, device, named);
  };
}

}  // namespace fleet::trainer::collective
