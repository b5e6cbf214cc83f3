// ShmCollective: the Collective interface for ranks on ONE host, through a
// shared memory segment instead of sockets.
//
// Why: data-parallel ranks on one machine (fleetrun --nproc_per_node on a
// CPU host) exchange gradients every step. Over Gloo's loopback TCP each
// all-reduce crosses two kernel socket paths and hands every message from
// Gloo's I/O thread to the caller; on a machine whose cores the ranks fill,
// each hand-off can wait a scheduler tick (measured: a 4 KiB all-reduce
// between 2 processes, min 0.13-0.19 ms, p50 0.34-4.0 ms). Here the ranks
// copy into and reduce out of one mapping, on the calling thread, and meet
// at barriers that spin briefly before sleeping on a futex.
//
// Segment. Rank 0 creates it under a random name (shm_open, mode 0600,
// "/fleet-<its pid>-<random>"),
// publishes the name in the KV store under "shm/<group>/gen<generation>/"
// (readable only with the job's credentials). The last rank to map it
// removes the name at once, so a crash leaves nothing in /dev/shm after
// start-up; if a rank dies before that, rank 0 removes it when the
// rendezvous fails, and a launcher removes what a killed rank 0 left
// (RemoveShmSegmentsOf). It holds a header (one arrival counter and pid per rank), one
// slot of `slot_bytes` per rank and one result slot.
//
// Algorithms, per chunk of at most one slot: all-reduce = every rank copies
// its chunk into its slot; barrier; rank r reduces the r-th 1/W of the
// chunk over all slots in rank order (so every rank gets identical bits)
// into the result slot; barrier; every rank copies the result out. Two
// barriers a chunk suffice: a slot is rewritten only after the barrier that
// follows every rank's last read of it. Broadcast, all-gather,
// reduce-scatter and barrier are the same pattern.
//
// Waiting. A barrier spins for `spin` (the peer is usually on another core
// and moments away), then sleeps on a futex in the segment. While asleep it
// checks every 50 ms that the ranks it waits for are alive: a peer that
// exited is Unavailable naming its rank and pid at once, one that is stuck
// is Timeout after `timeout`, naming the operation and the missing ranks.
// After any failure the group is broken: later calls return
// FailedPrecondition with the first error.
//
// Thread safety: not thread-safe; one thread drives a group (Collective's
// contract). The ranks may be processes or threads of one process.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/collective.h"
#include "comm/kv_store.h"
#include "comm/status.h"

namespace fleet {

struct ShmCollectiveOptions {
  // As GlooCollectiveOptions: names the group's rendezvous keys; ranks meet
  // only ranks of the same restart generation.
  std::string group = "default";
  int generation = 0;
  int rank = 0;
  int size = 1;
  // Bounds the rendezvous and, separately, every operation.
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};
  // Bytes of each rank's slot: an operation on more is done in chunks of
  // this size (a multiple of 64, at least 4 KiB). The segment takes
  // (size + 1) x slot_bytes. Default 1 MiB: a whole MLP's gradients, or a
  // default data-parallel bucket, in one chunk.
  size_t slot_bytes = size_t{1} << 20;
  // How long a barrier spins before it sleeps.
  std::chrono::microseconds spin{200};
};

// Removes the segments that process `creator` created and left behind
// (named "/fleet-<creator>-*"), e.g. a rank 0 killed during the
// rendezvous. For a launcher, once `creator` has exited; ranks that mapped
// a segment keep their mapping. Returns how many names it removed.
int RemoveShmSegmentsOf(int creator);

// Removes every segment in /dev/shm named "/fleet-<pid>-*" that this user
// owns and whose creator <pid> is no longer alive: what a rank killed
// during the rendezvous left when its launcher was killed too (kill -9 of
// fleetrun). fleetrun calls it when it starts. Returns how many it removed.
int RemoveOrphanedShmSegments();

class ShmCollective final : public Collective {
 public:
  // Creates (rank 0) or maps (the others) the segment, then waits until
  // every rank has mapped it. Blocks at most options.timeout. `kv` is used
  // only here. InvalidArgument for bad options; Timeout naming the ranks
  // that never arrived; Unavailable when the segment cannot be opened
  // (e.g. ranks on different hosts: use Gloo there); IOError for a failed
  // shm_open / ftruncate / mmap.
  static Result<std::unique_ptr<ShmCollective>> Create(KvStoreClient& kv,
                                                       const ShmCollectiveOptions& options);
  ~ShmCollective() override;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  std::string name() const override { return "shm"; }

  Status AllReduce(float* data, size_t count, ReduceOp op) override;
  Status Broadcast(float* data, size_t count, int root) override;
  Status AllGather(const float* in, float* out, size_t count) override;
  Status ReduceScatter(const float* in, float* out, size_t count) override;
  Status Barrier() override;
  bool runs_on_caller_cpu() const override { return true; }

 private:
  struct Header;
  // The header's size rounded up to a page; the slots follow it.
  static size_t HeaderBytes();
  ShmCollective(ShmCollectiveOptions options, void* base, size_t bytes);

  // Marks this rank arrived at the next barrier and waits for every rank.
  // `op` names the operation for errors.
  Status Meet(const char* op);
  // OK, or FailedPrecondition carrying the first error.
  Status Usable(const char* op) const;
  float* slot(int rank) const;
  float* result() const;

  const ShmCollectiveOptions options_;
  void* const base_;
  const size_t bytes_;
  Header* const header_;
  const size_t slot_floats_;
  // Where a reduction reads each rank's values; reused so an operation
  // allocates nothing.
  std::vector<const float*> inputs_;
  uint64_t round_ = 0;  // barriers this rank has arrived at
  Status broken_;
};

}  // namespace fleet
