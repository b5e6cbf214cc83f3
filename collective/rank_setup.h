// What every collective training program (mnist_mlp, gpt_pretrain) does
// before it trains: learn its place in the job from fleetrun's environment
// (comm/cluster.h: flags > FLEET_* variables, FLEET_ROLE defaulting to
// "collective" so a hand-started single process needs no variables), its
// device, how many CPU threads it may use, and join its group: none for a
// world of 1; on CPUs shared memory when every rank is on this host, else
// Gloo; NCCL on GPUs; bootstrapped from the KV store.
//
// The flags every such program takes for its CPU group (--cpu_collective,
// --gloo_hostname, --gloo_iface) are defined here, once, and read by
// RankGroupOptionsFromFlags.
//
// Thread safety: free functions; no state.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "comm/cluster.h"
#include "comm/collective.h"
#include "comm/process_context.h"
#include "comm/program_help.h"
#include "comm/status.h"
#include "trainer/backend.h"
#include "collective/parallel_groups.h"
#include "trainer/kernels/backend_factory.h"

namespace fleet::trainer::collective {

// The flags of a collective rank's device and CPU group (--device,
// --cpu_collective, --gloo_hostname, --gloo_iface) as --help shows them.
HelpGroup RankSetupHelpGroup();

// The process context of a collective rank (comm/process_context.h):
// role collective (also when neither --role nor FLEET_ROLE is given), no
// stop watcher (a signal ends the rank; fleetrun stops the others); its
// env() is the lookup the functions below take. `program` names it in
// errors. Errors: ProcessContext::Create's.
Result<std::unique_ptr<ProcessContext>> CollectiveRankContext(const std::string& program);

// The device a training rank runs on, decided from what it was asked for:
//   wants_gpu     the config asks for a GPU (e.g. Global.device: gpu);
//   assigned      the device the launcher or user gave this rank (--device /
//                 FLEET_DEVICE; fleetrun --gpus sets cuda:K; any spelling
//                 CanonicalDevice takes), or nullopt when neither is set
//                 (ProcessContext::assigned_device);
//   world_size    ranks in the job;
//   visible_gpus  GPUs this process can use (CudaDeviceCount(): 0 without a
//                 GPU or in a build without CUDA).
// Returns "cpu" when !wants_gpu. A GPU rank takes its assigned cuda:K; one
// rank that was assigned nothing takes cuda:0, as FleetX does for a single
// process with device gpu and no launcher. Errors, each saying what to do:
// InvalidArgument when a GPU is wanted but the rank was assigned cpu, or
// when several ranks were assigned nothing (each needs its own GPU);
// Unavailable when the chosen GPU is not among the visible ones (naming it
// and how many there are).
Result<std::string> ResolveRankDevice(bool wants_gpu, const std::optional<std::string>& assigned,
                                      int world_size, int visible_gpus);

// CPU threads for this rank: `flag_threads` when > 0, else the machine's
// cores divided by FLEET_NPROC_PER_NODE (ranks on this node; 1 when unset),
// at least 1. InvalidArgument for a malformed FLEET_NPROC_PER_NODE.
Result<int> CpuThreadsPerRank(const EnvLookup& env, int flag_threads);

struct RankGroupOptions {
  // Names the group's keys in the KV store (with the job id and restart
  // generation), e.g. the program's name.
  std::string group;
  // Bounds rendezvous and every collective call.
  std::chrono::milliseconds timeout{30000};
  // Gloo: the address (or name) to bind and advertise, or an interface
  // whose address to use (wins when set). Checked and resolved here, so an
  // error names the flag (`hostname_flag` / `iface_flag`).
  std::string gloo_hostname = "127.0.0.1";
  std::string gloo_iface;
  std::string hostname_flag = "--gloo_hostname";
  std::string iface_flag = "--gloo_iface";
  // CPU ranks: "shm" (comm/shm_collective.h: every rank on this host),
  // "gloo", or "auto": shm when the job has one node (`nnodes` == 1), Gloo
  // otherwise. On 2 cores, 2 MNIST ranks train 1.4-1.7x faster than 1 rank
  // over shared memory and 0.3x over Gloo's loopback TCP (bench/README.md).
  std::string cpu_collective = "auto";
  // Nodes in the job (FLEET_NNODES, set by fleetrun); 0 when unknown, which
  // "auto" treats as possibly several.
  int nnodes = 0;
};

// The options above from this file's flags (--cpu_collective,
// --gloo_hostname, --gloo_iface) and FLEET_NNODES; the caller sets group and
// timeout. InvalidArgument for an unknown --cpu_collective or a malformed
// FLEET_NNODES.
Result<RankGroupOptions> RankGroupOptionsFromFlags(const EnvLookup& env);

// This rank's group: null for a world of 1, else shared memory or Gloo
// (cpu, options.cpu_collective) or NCCL (cuda:K) from the KV store at
// spec.kv_endpoint. InvalidArgument without a KV
// endpoint for a world above 1 or for an unresolvable host or interface;
// Unavailable for cuda in a build without NCCL; the collectives' errors.
Result<std::unique_ptr<Collective>> CreateRankCollective(const ClusterSpec& spec,
                                                         const Device& device,
                                                         const RankGroupOptions& options);

// Joins the subgroups of a hybrid job (parallel_groups.h) the way
// CreateRankCollective joins the world: the same kind of collective, KV
// store and timeout, group "<options.group>.<name>". The returned function
// copies its arguments and may be called after they are gone.
GroupFactory RankGroupFactory(const ClusterSpec& spec, const Device& device,
                              const RankGroupOptions& options);

}  // namespace fleet::trainer::collective
