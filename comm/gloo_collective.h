// GlooCollective: the Collective interface on CPUs over Gloo's TCP
// transport, bootstrapped from the HTTP KV store.
//
// Each operation is one call of a Gloo algorithm: allreduce (ring),
// broadcast (one-to-all), allgather (ring), reduce-scatter (halving-doubling)
// and barrier. Gloo throws on failure; every exception is caught here and
// becomes a Status naming the operation and this rank. After any failed
// operation the group is broken: later calls return FailedPrecondition with
// the first error, since peers may be mid-operation and buffers undefined.
//
// Thread safety: not thread-safe; one thread drives a group (Collective's
// contract). Distinct groups may be used from distinct threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/collective.h"
#include "comm/kv_store.h"
#include "comm/status.h"

namespace gloo {
class Context;
}

namespace fleet {

struct GlooCollectiveOptions {
  // Names the group inside the job: rendezvous keys live under
  // "gloo/<group>/gen<generation>/" in the KV store. Two groups that exist
  // at the same time (or one group created twice in one process) need
  // distinct names.
  std::string group = "default";
  // Restart generation: the process's FLEET_RESTART_GENERATION (0 at first
  // start, n after its n-th restart by fleetrun; launch/README.md). A
  // restarted process then never reads the addresses that its previous life
  // or its peers' previous lives published, which would connect it to dead or
  // already-paired sockets. Ranks rendezvous only with ranks of the same
  // generation; a rank missing at that generation makes the others fail
  // with Timeout after `timeout`.
  int generation = 0;
  // This process's rank in [0, size) and the number of ranks.
  int rank = 0;
  int size = 1;
  // Bounds the rendezvous (waiting for every rank's address) and, separately,
  // every operation. Default 30 s: long enough for ranks started seconds
  // apart, short enough that a dead peer shows up quickly. Raise it for
  // ranks that may start minutes apart (e.g. queued on a scheduler).
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};
  // Address that this rank's Gloo device binds to and advertises to peers.
  // Loopback suits tests and single-machine runs; on a cluster pass this
  // machine's address or hostname, or set `iface` instead. Resolved here
  // (comm/bind_address.h) before Gloo sees it: Gloo gets a numeric address.
  std::string hostname = "127.0.0.1";
  // Network interface name ("eth0"); when non-empty its address is used
  // instead of `hostname`.
  std::string iface;
};

class GlooCollective final : public Collective {
 public:
  // Resolves the address, creates the device, marks this rank arrived under
  // "gloo/<group>/gen<generation>/", waits until every rank arrived, then
  // connects to every other rank (Gloo's connectFullMesh over the same keys).
  // Blocks at most options.timeout for the arrivals and, each, for Gloo's
  // waits in connectFullMesh (an address, a TCP pairing). `kv` is only used
  // during Create and need not outlive the returned object.
  // Returns InvalidArgument (bad rank/size/timeout/group/generation; a
  // hostname that does not resolve or is not this machine's, an interface
  // without an address: naming it), Timeout (ranks that never arrived, by
  // rank, with the timeout; or a peer that never paired), Unavailable (KV
  // store or peer unreachable).
  static Result<std::unique_ptr<GlooCollective>> Create(KvStoreClient& kv,
                                                        const GlooCollectiveOptions& options);
  ~GlooCollective() override;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  std::string name() const override { return "gloo"; }

  // Each blocks at most options.timeout (per Gloo wait; an operation that
  // keeps making progress is not cut short). Buffers are host memory.
  Status AllReduce(float* data, size_t count, ReduceOp op) override;
  // InvalidArgument when root is not in [0, size).
  Status Broadcast(float* data, size_t count, int root) override;
  Status AllGather(const float* in, float* out, size_t count) override;
  // InvalidArgument when size()*count does not fit Gloo's int element count.
  Status ReduceScatter(const float* in, float* out, size_t count) override;
  Status Barrier() override;

 private:
  GlooCollective(GlooCollectiveOptions options, std::shared_ptr<gloo::Context> context);

  // Runs one Gloo call, turning any exception into a Status that names `op`
  // and this rank, and marks the group broken on failure.
  template <typename Fn>
  Status Run(const char* op, size_t count, Fn&& fn);
  // A fresh tag per operation: every rank issues the same sequence of
  // operations, so tags agree across ranks and never repeat back to back.
  uint32_t NextTag() { return next_tag_++; }

  // Fixed after construction.
  const GlooCollectiveOptions options_;
  const std::shared_ptr<gloo::Context> context_;

  // Used only by the driving thread.
  uint32_t next_tag_ = 0;
  Status broken_;  // first failure; OK while the group is usable
};

}  // namespace fleet
