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
  // "gloo/<group>/" in the KV store. Two groups that exist at the same time
  // (or one group created twice in one job) need distinct names.
  std::string group = "default";
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
  // machine's address or hostname, or set `iface` instead.
  std::string hostname = "127.0.0.1";
  // Network interface name ("eth0"); when non-empty it is used instead of
  // `hostname`.
  std::string iface;
};

class GlooCollective final : public Collective {
 public:
  // Creates the device, publishes this rank's address under
  // "gloo/<group>/" and connects to every other rank. Blocks until every
  // rank joined or options.timeout passed. `kv` is only used during Create
  // and need not outlive the returned object.
  // Returns InvalidArgument (bad rank/size/timeout/group, bad hostname or
  // interface), Timeout (a rank never published its address: names the
  // keys), Unavailable (KV store or peer unreachable).
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
