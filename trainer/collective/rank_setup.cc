#include "trainer/collective/rank_setup.h"

#include <algorithm>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "comm/bind_address.h"
#include "comm/gloo_collective.h"
#include "comm/kv_store.h"
#ifdef FLEET_WITH_NCCL
#include "comm/nccl_collective.h"
#endif

namespace fleet::trainer::collective {

EnvLookup CollectiveProcessEnv() {
  EnvLookup process = ProcessEnv();
  return [process](const std::string& name) -> std::optional<std::string> {
    std::optional<std::string> value = process(name);
    if (!value && name == "FLEET_ROLE") return std::string("collective");
    return value;
  };
}

std::string CanonicalDevice(const std::string& device) {
  if (device == "cuda" || device == "gpu") return "cuda:0";
  if (absl::StartsWith(device, "gpu:")) return "cuda:" + device.substr(4);
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

Result<std::unique_ptr<Collective>> CreateRankCollective(const ClusterSpec& spec,
                                                         const Device& device,
                                                         const RankGroupOptions& options) {
  if (spec.world_size == 1) return std::unique_ptr<Collective>();
  if (!spec.kv_endpoint) {
    return Status::InvalidArgument(
        "a world of more than 1 needs a KV store: set FLEET_KV_ENDPOINT or --kv_endpoint (fleetrun "
        "does)",
        absl::StrCat("world size ", spec.world_size));
  }
  KvStoreClient kv(spec.kv_endpoint->ToString(), spec.job_id, {.auth = spec.credentials});
  if (device.is_cpu()) {
    GlooCollectiveOptions o;
    o.group = options.group;
    o.rank = spec.rank;
    o.size = spec.world_size;
    o.timeout = options.timeout;
    o.generation = spec.restart_generation;
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
  NcclCollectiveOptions o;
  o.group = options.group;
  o.rank = spec.rank;
  o.size = spec.world_size;
  o.device = device.index;
  o.timeout = options.timeout;
  o.generation = spec.restart_generation;
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<NcclCollective> nccl, NcclCollective::Create(kv, o));
  return std::unique_ptr<Collective>(std::move(nccl));
#else
  return Status::Unavailable("built without CUDA/NCCL: cannot train on", device.ToString());
#endif
}

}  // namespace fleet::trainer::collective
