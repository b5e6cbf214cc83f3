// Collective: the operations data-parallel training needs, over a fixed
// group of ranks. GlooCollective (CPU, comm/gloo_collective.h) and
// NcclCollective (GPU, comm/nccl_collective.h) implement it, so trainers
// are written once.
//
// Every call blocks until the operation completed on this rank or the
// group's timeout passed; on timeout or peer failure it returns
// Timeout/Unavailable naming the operation and, where known, the rank, and
// the group must not be used again. Buffers are device pointers for NCCL and
// host pointers for Gloo. Not thread-safe: one thread drives a group.
#pragma once

#include <cstddef>
#include <string>

#include "comm/status.h"

namespace fleet {

enum class ReduceOp { kSum, kMean, kMax };

class Collective {
 public:
  virtual ~Collective() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "gloo" or "nccl", for logs.
  virtual std::string name() const = 0;

  // In place: data[0..count) becomes the reduction over ranks.
  virtual Status AllReduce(float* data, size_t count, ReduceOp op) = 0;
  // In place: data[0..count) on every rank becomes root's.
  virtual Status Broadcast(float* data, size_t count, int root) = 0;
  // out[r*count .. (r+1)*count) = in of rank r. out has size()*count floats.
  // `in` may be this rank's own slot of `out` (in place); otherwise the two
  // must not overlap.
  virtual Status AllGather(const float* in, float* out, size_t count) = 0;
  // in has size()*count floats; out (count floats) = sum over ranks of
  // in[rank()*count .. (rank()+1)*count).
  virtual Status ReduceScatter(const float* in, float* out, size_t count) = 0;
  virtual Status Barrier() = 0;

  // Whether the operations are work of the calling thread's CPU (copies and
  // sums in shared memory) rather than of a device or the network. Callers
  // overlap communication with compute only when this is false.
  virtual bool runs_on_caller_cpu() const { return false; }
};

}  // namespace fleet
