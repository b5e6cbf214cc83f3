// NcclCollective: the Collective interface on GPUs over NCCL, bootstrapped
// from the HTTP KV store. Built only when CMake finds CUDA and NCCL
// (FLEET_WITH_NCCL=1 is then defined for everything linking fleet_comm).
//
// Rank 0 creates the ncclUniqueId and publishes it under
// "nccl/<group>/unique_id"; the others wait for it (bounded by the group
// timeout). The communicator is created non-blocking and every wait polls
// with a deadline: init and each operation end within the timeout, and on
// timeout the communicator is aborted (ncclCommAbort) instead of hanging.
// After any failure the group is broken and later calls return
// FailedPrecondition with the first error.
//
// Buffers are device pointers on this rank's device. Each call returns when
// the operation completed on the GPU (the stream is synchronised), so the
// caller may read the result at once.
//
// Thread safety: not thread-safe; one thread drives a group.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "comm/collective.h"
#include "comm/kv_store.h"
#include "comm/status.h"

namespace fleet {

struct NcclCollectiveOptions {
  // Names the group inside the job: the unique id lives at
  // "nccl/<group>/gen<generation>/unique_id". Each group created in a job
  // needs its own name.
  std::string group = "default";
  // Restart generation (ClusterSpec::restart_generation), as for Gloo: a
  // restarted rank never picks up the unique id of a communicator its
  // previous life belonged to (NCCL would wait on it until the timeout).
  int generation = 0;
  int rank = 0;
  int size = 1;
  // CUDA device ordinal for this rank; -1 picks rank % (visible devices),
  // right for one process per GPU on each machine.
  int device = -1;
  // Bounds the id exchange, the communicator init and, separately, every
  // operation. Default 30 s; raise it for ranks that start far apart.
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};
};

class NcclCollective final : public Collective {
 public:
  // Returns Unavailable "no CUDA GPU present" when there is no usable GPU,
  // InvalidArgument for bad options, Timeout when the id or a peer never
  // arrived (naming what it waited for), Unavailable/Internal for NCCL or
  // CUDA errors (with their text). `kv` is used only during Create.
  static Result<std::unique_ptr<NcclCollective>> Create(KvStoreClient& kv,
                                                        const NcclCollectiveOptions& options);
  ~NcclCollective() override;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  std::string name() const override { return "nccl"; }

  // Each blocks at most options.timeout; Timeout names the op and rank.
  Status AllReduce(float* data, size_t count, ReduceOp op) override;
  // InvalidArgument when root is not in [0, size).
  Status Broadcast(float* data, size_t count, int root) override;
  Status AllGather(const float* in, float* out, size_t count) override;
  Status ReduceScatter(const float* in, float* out, size_t count) override;
  Status Barrier() override;

 private:
  struct Impl;  // NCCL communicator, CUDA stream and scratch memory
  NcclCollective(NcclCollectiveOptions options, std::unique_ptr<Impl> impl);

  // Launches one NCCL call and waits for it; marks the group broken on
  // failure.
  template <typename Launch>
  Status Run(const char* op, size_t count, Launch&& launch);

  // Fixed after construction.
  const NcclCollectiveOptions options_;
  const std::unique_ptr<Impl> impl_;

  // Used only by the driving thread.
  Status broken_;
};

}  // namespace fleet
