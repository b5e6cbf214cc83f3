// DataParallel: collective data-parallel training over any Collective (Gloo
// on CPUs, NCCL on GPUs; the same code path for both).
//
// Every rank holds the whole model in a ParamArena. DataParallel
//   * makes every rank start from rank 0's parameters (and, when resuming,
//     its optimizer state and step): SyncFromRoot;
//   * all-reduces the gradients (mean over ranks) in buckets while backward
//     still runs: pass grad_ready() to the model's Backward; as soon as every
//     tensor of a bucket is final the bucket is handed to the communication
//     thread, which all-reduces it while the caller computes earlier layers;
//     FinishGradients waits for the rest;
//   * sums small metric vectors over ranks (loss sums, correct counts).
//
// Sharded gradients (ZeRO stage 1 and 2, options.shard_gradients). Instead
// of all-reducing a bucket, the ranks reduce-scatter it: rank r of W keeps
// the SUM over ranks of its piece of every bucket, ShardRange(bucket length,
// W, r) of the bucket, in its own shard buffer (shard_grads(), pieces() says
// where each piece sits). The ranks' pieces of all buckets are what an
// optimizer owning 1/W of the state updates (collective/
// sharded_adamw.h); GatherParams() then all-gathers every bucket's updated
// parameters so each rank holds the whole model again. Cutting every bucket
// (rather than the arena) into W pieces lets a bucket be reduced the moment
// backward finishes it, as in the all-reduce mode. With
// options.release_reduced_gradients (stage 2) a bucket's full gradients are
// discarded once reduced (Backend::Discard: on the CPU its pages go back to
// the system and read as zeros), so between steps a rank holds only its
// pieces; ZeroGrad() then leaves those buckets alone.
//
// Hybrid degrees (DataParallelGroups). With a sharding group of S ranks
// inside a world of W = D x S, the pieces are cut S ways and reduce-scattered
// over the sharding group; the D ranks holding the same piece (the
// data-parallel, or replica, group) then all-reduce it, so each piece holds
// the sum over all W ranks. Parameters are all-gathered over the sharding
// group only; metric sums and SyncFromRoot span the world. Which rank sits
// in which group is the caller's (collective/parallel_groups.h).
//
// Sharded parameters (ZeRO stage 3, options.shard_params). Buckets are then
// exactly the model's parameter units (options.units, e.g. GptModel's
// embeddings, blocks and ln_f), and a rank keeps only its pieces of the
// parameters, in shard_params() beside shard_grads(); the optimizer updates
// them there and GatherParams does nothing. The model reaches the rest
// through param_hooks() (trainer/param_hooks.h): Acquire all-gathers a
// unit's parameters into its range of the arena (and starts the gather of
// the unit named next, on the communication thread where there is one, so it
// overlaps the current unit's compute), Release discards that range again
// (Backend::Discard). Gradients are reduce-scattered per unit as backward
// finishes it and then discarded, as in stage 2. So between steps a rank
// holds its pieces only, and during a pass its pieces plus the units
// acquired (at most: the embeddings, ln_f, the unit computing and the one
// prefetched) and the gradients of the units not yet reduced.
//
// Buckets. The arena's tensors are grouped, from the LAST tensor of the
// table backwards (the order backward finishes them), into contiguous
// ranges of whole tensors holding at least bucket_bytes each (the last
// bucket takes what is left; a tensor larger than bucket_bytes is a bucket
// of its own). Every rank builds the same buckets from the same table, and
// backward finishes them in the same order, so every rank issues the same
// sequence of collective calls.
//
// Threads. One communication thread, owned here, makes every call on the
// Collective (its contract: one thread drives a group); none when the
// collective runs on the caller's CPU (Collective::runs_on_caller_cpu:
// shared memory), whose calls the caller then makes itself, inside
// grad_ready and FinishGradients. 2 MNIST ranks over shared memory on 2
// loaded cores: 1.41-1.49x one rank's samples/s without the thread,
// 0.88-1.07x with it (bench/README.md). Every public method
// is called from the single thread that drives the model; none is
// thread-safe. While a step's buckets are in flight the caller must not
// write the gradients of tensors already reported ready, nor the params
// (backward only reads params and writes the gradients of layers not yet
// reported, which is what makes the overlap safe).
//
// Failure. The first failed collective call breaks the helper: every later
// call returns FailedPrecondition carrying that first error. Each wait of
// the caller is bounded by options.timeout; the Collective bounds each of
// its own calls by its group timeout, so a dead or stalled peer shows up as
// an error (naming this rank, the operation and the bucket) rather than a
// hang.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "comm/collective.h"
#include "comm/status.h"
#include "trainer/optimizer.h"
#include "trainer/param_arena.h"
#include "trainer/param_hooks.h"

namespace fleet::trainer {

struct DataParallelOptions {
  // Minimum bytes of gradient per all-reduce call (whole tensors only).
  // Smaller buckets start communicating earlier in backward but pay the
  // per-call latency more often; larger ones overlap less. Default 1 MiB
  // (PyTorch DDP's first bucket). The 784-128-128-10 MLP (~465 KiB of
  // gradients) is then one bucket: measured on 2 shared cores over Gloo, its
  // overlap window (the first layer's weight-gradient GEMM, ~0.3 ms) is
  // shorter than the latency an extra call adds, and 64 KiB buckets (two
  // calls, one overlapped) ran 10-25% fewer samples/s (bench/collective_bench).
  // Models whose later layers hold megabytes get several buckets and
  // overlap. SIZE_MAX makes one bucket whatever the size.
  size_t bucket_bytes = 1 << 20;
  // Bounds each wait of the calling thread for the communication thread.
  // Keep it above the Collective's own timeout (default 30 s) so that the
  // Collective, which knows which operation and peer failed, reports first.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  // Reduce-scatter every bucket instead of all-reducing it (see the top of
  // this file): each rank keeps the sum over ranks of its 1/W of every
  // bucket. For an optimizer whose state is sharded (ZeRO stage 1 and 2).
  bool shard_gradients = false;
  // With shard_gradients: discard each bucket's full gradients once reduced
  // (ZeRO stage 2). Costs nothing on the CPU (the pages are zero-filled again
  // by the kernel when backward next writes them).
  bool release_reduced_gradients = false;
  // With shard_gradients and release_reduced_gradients: keep only this
  // rank's pieces of the parameters (ZeRO stage 3, see the top of this
  // file). `units` must then be the model's parameter units, consecutive
  // and covering the table.
  bool shard_params = false;
  std::vector<TensorRange> units;
  // Measure what this rank holds for parameters and gradients
  // (ResidentBytesNow) whenever a unit is acquired or a bucket's gradients
  // are complete, keeping the largest (resident_high_water). CPU memory
  // only. Costs a look at the arena's page table (mincore) per measurement.
  bool measure_resident_bytes = false;
};

// The groups a DataParallel reduces over (none owned). `world`: every rank
// (null: a single process). `shard`: the ranks that split each bucket in
// sharded mode (null: the world). `replica`: the ranks holding the same piece
// (null: none besides this one). world size = shard size x replica size.
struct DataParallelGroups {
  Collective* world = nullptr;
  Collective* shard = nullptr;
  Collective* replica = nullptr;
};

// This rank's piece of one bucket in sharded mode: arena floats [begin,
// end) (possibly empty), stored at shard_grads()[offset, offset + end -
// begin). In all-reduce mode one piece covers the whole arena at offset 0 of
// the arena's own gradients.
struct GradPiece {
  size_t begin = 0;
  size_t end = 0;
  size_t offset = 0;
  size_t size() const { return end - begin; }
};

// One bucket: tensors [first_tensor, end_tensor) of the arena's table, i.e.
// floats [begin, end) of params()/grads().
struct GradBucket {
  size_t first_tensor = 0;
  size_t end_tensor = 0;
  size_t begin = 0;
  size_t end = 0;
};

class DataParallel final : public ParamUseHooks {
 public:
  // `collective` may be null for a single process (every operation is then
  // local and immediate); otherwise it must outlive this object, as must
  // `arena` (neither is owned). InvalidArgument for a null arena, a zero
  // bucket_bytes or a non-positive timeout. Starts the communication thread
  // when collective is non-null.
  static Result<std::unique_ptr<DataParallel>> Create(Collective* collective, ParamArena* arena,
                                                      const DataParallelOptions& options);
  // As above over hybrid groups (see the top of this file); the groups must
  // outlive this object. InvalidArgument also when the world's size is not
  // the shard group's times the replica group's.
  static Result<std::unique_ptr<DataParallel>> Create(const DataParallelGroups& groups,
                                                      ParamArena* arena,
                                                      const DataParallelOptions& options);
  // Stops the communication thread. If it is inside a collective call (after
  // a failure or timeout) this blocks until that call ends, i.e. at most the
  // Collective's timeout.
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  // This rank's place in the sharding group and its size (1 when not
  // sharded), and the replica group's size.
  int shard_rank() const { return shard_rank_; }
  int shard_size() const { return shard_size_; }
  int replica_size() const { return world_ / shard_size_; }
  // Rank within the replica group (0 when there is none).
  int replica_rank() const { return replica_rank_; }
  const std::vector<GradBucket>& buckets() const { return buckets_; }

  // Makes this rank's params equal to rank 0's. When `optimizer` is not null
  // (it must be bound to this arena), also its state buffers and step, so a
  // run resumed from a checkpoint that only rank 0 read continues the same
  // everywhere. Blocks for the broadcasts (each bounded as described above).
  Status SyncFromRoot(Optimizer* optimizer);

  // The callback to pass to Mlp::Backward (or any model's backward that
  // reports finished tensor ranges). Marks tensors [first, end) final and
  // hands every bucket that became complete to the communication thread.
  // The callback refers to this object and must not outlive it.
  GradReadyFn grad_ready();

  // Hands over the buckets not yet handed over (all of them if backward ran
  // without grad_ready()), waits until every bucket of this step is reduced,
  // and readies the helper for the next step. On OK every rank's grads()
  // hold the mean of the ranks' gradients. On error the grads are undefined
  // and the helper is broken.
  Status FinishGradients();

  // In place: values become their sum over ranks. Blocks for one all-reduce.
  // Use it for metric sums and counts (exact for integers below 2^24).
  Status SumOverRanks(std::span<float> values);

  // ---- sharded mode (options.shard_gradients) and its all-reduce twin ----
  bool sharded() const { return shard_; }
  // Where this rank's reduced gradients are after FinishGradients: the
  // pieces it owns and the buffer holding them. Sharded: the sum over ranks
  // in shard_grads(); all-reduce mode: one piece, the whole arena, the mean
  // in the arena's grads(). reduced_grads_scale() turns what is there into
  // the mean (1/W sharded, 1 otherwise).
  const std::vector<GradPiece>& pieces() const { return pieces_; }
  float* reduced_grads() const;
  float reduced_grads_scale() const { return shard_ ? 1.0f / static_cast<float>(world_) : 1.0f; }
  // In place: values become their sum over the sharding group (over every
  // piece once; the world in all-reduce mode has one piece, and this is a
  // no-op). For sums over the pieces, e.g. the clipping norm's squares.
  Status SumOverShards(std::span<float> values);
  // Floats of the shard buffer (0 in all-reduce mode).
  size_t shard_floats() const { return shard_floats_; }
  // What bucket b's reduction leaves in reduced_grads(): this rank's piece
  // (sharded), or the bucket's range of the arena.
  GradPiece ReducedPiece(size_t b) const;
  // Calls fn(b) after each bucket's reduction, on the thread that ran it
  // (the communication thread, or the caller's inside grad_ready and
  // FinishGradients), once ReducedPiece(b) is final. Not with one process
  // (nothing is reduced). fn may use this object's const accessors, no
  // other method. It may also write bucket b's piece of the parameters (in
  // the arena, or shard_params() at stage 3): this object reads them next in
  // GatherParams, or in the unit's next all-gather, which backward does not
  // start again once the unit's gradients are reported (sharded_adamw.h's
  // offloaded update does this). Set it before the first step.
  void set_on_bucket_reduced(std::function<void(size_t bucket)> fn) {
    on_bucket_reduced_ = std::move(fn);
  }
  // Zeroes the arena's gradients before a step's first backward, except
  // buckets already discarded after their reduction (stage 2).
  void ZeroGrad();
  // Sharded mode: after the caller updated the parameters of its pieces,
  // every rank's parameters become the union of all ranks' pieces. Blocks
  // for one all-gather per bucket. A no-op in all-reduce mode and in stage 3.
  Status GatherParams();

  // ---- stage 3 (options.shard_params) ----
  bool shards_params() const { return shard_params_ != nullptr; }
  // What the model calls around each use of a unit's parameters (this
  // object); null unless the parameters are sharded.
  ParamUseHooks* param_hooks() { return shards_params() ? this : nullptr; }
  // This rank's pieces of the parameters, at pieces()[b].offset like the
  // gradients. REQUIRES: shards_params().
  float* shard_params() const { return shard_params_.get(); }
  // After the arena received whole parameters (initialised, synced from rank
  // 0, loaded): keeps this rank's pieces and discards the arena's parameters
  // and gradients. REQUIRES: no unit acquired, no operation pending.
  void KeepOnlyShards();
  // Every unit's parameters in the arena (for a checkpoint or the final
  // parameters), until ReleaseAllParams. Blocks for the all-gathers; their
  // errors.
  Status GatherAllParams();
  void ReleaseAllParams();
  void Acquire(TensorRange unit, TensorRange next) override;
  void Release(TensorRange unit) override;

  // Bytes this rank holds now for parameters and gradients: the arena's
  // resident pages (mincore) plus the shard and staging buffers (whole).
  size_t ResidentBytesNow() const;
  // The largest ResidentBytesNow measured (options.measure_resident_bytes;
  // 0 otherwise).
  size_t resident_high_water() const { return resident_high_water_; }
  bool measures_resident() const { return options_.measure_resident_bytes; }

 private:
  DataParallel(const DataParallelGroups& groups, ParamArena* arena,
               const DataParallelOptions& options, std::vector<GradBucket> buckets);
  // All-reduce (sum) of `values` over `group` on the communication thread.
  Status SumOver(Collective* group, std::span<float> values, const char* over);

  // One collective operation. A gradient bucket's reduction is only its
  // index (run by ReduceBucket, named by bucket_what_), so the per-step
  // tasks allocate nothing; any other task carries its name and `run`.
  static constexpr size_t kNoBucket = ~size_t{0};
  struct Task {
    size_t bucket = kNoBucket;
    bool gather = false;  // with a bucket: its parameters' all-gather (stage 3)
    std::string what;     // when no bucket: "broadcast of 118282 parameters from rank 0"
    std::function<Status()> run;
  };
  // Stage 3: where a bucket's parameters are. Written by the caller
  // (kReleased -> kGathering, kResident -> kReleased) and by whoever runs the
  // gather (kGathering -> kResident).
  enum ParamState : int { kReleased = 0, kGathering = 1, kResident = 2 };

  // Queues a task for the communication thread, or runs it now when there
  // is none. REQUIRES: a collective.
  void Enqueue(Task task);
  // Keeps the first failure, with this rank and `what` as context.
  // REQUIRES: mu_ held.
  void RecordFailure(const Status& st, std::string_view what);
  Status RunTask(const Task& task);
  std::string_view WhatOf(const Task& task) const;
  // OK, or FailedPrecondition carrying the first error.
  Status Broken();
  // Waits until every queued task ran; returns the first error.
  Status WaitIdle();
  // Enqueue + WaitIdle for one operation of the caller.
  Status RunAndWait(std::string what, std::function<Status()> run);
  void CommLoop();
  void MarkReady(size_t first, size_t end);
  void EnqueueBucket(size_t b);
  std::string Describe(const GradBucket& bucket) const;
  // Floats each rank's piece of bucket b takes in the collective calls:
  // ceil(length / W), the last pieces padded.
  size_t PieceCount(size_t b) const;
  // Reduce-scatter of bucket b into this rank's piece (sharded mode).
  Status ReduceScatterBucket(size_t b);
  // Bucket b's reduction: reduce-scatter (sharded) or all-reduce to the mean.
  Status ReduceBucket(size_t b);
  // All-gather of bucket b's parameters into the arena, this rank's piece
  // taken from `piece` (sharded mode).
  Status AllGatherBucket(size_t b, const float* piece);
  // Stage 3: the gather task of bucket b; queues it unless b is in the arena
  // or on its way; waits until it is there (or the helper broke).
  Status GatherTask(size_t b);
  void StartGather(size_t b);
  void WaitGathered(size_t b);
  size_t BucketOfUnit(TensorRange unit) const;
  void MeasureResident();

  // Fixed after construction.
  Collective* const collective_;  // null: single process
  ParamArena* const arena_;
  const DataParallelOptions options_;
  const int rank_;
  const int world_;
  // Sharded mode: the group that splits each bucket and the one that
  // all-reduces the pieces (null when the sharding group is the world).
  Collective* const shard_group_;
  Collective* const replica_group_;
  const int shard_rank_;
  const int shard_size_;
  const int replica_rank_;
  const std::vector<GradBucket> buckets_;
  std::vector<size_t> bucket_of_tensor_;  // table index -> bucket index
  std::vector<std::string> bucket_what_;  // each bucket's reduction task, named
  const bool shard_;
  std::vector<GradPiece> pieces_;  // sharded: one per bucket, in bucket order
  size_t shard_floats_ = 0;
  std::shared_ptr<float> shard_grads_;  // sharded: [shard_floats_]
  // Sharded: W x the largest piece, for buckets whose length W does not
  // divide (the collectives take W equal pieces). Used by the communication
  // thread during FinishGradients and by GatherParams, never at once.
  std::shared_ptr<float> staging_;
  std::vector<bool> discarded_;  // stage 2: bucket's gradients discarded since its reduction
  std::function<void(size_t)> on_bucket_reduced_;    // may be empty
  std::vector<std::string> gather_what_;             // stage 3: each bucket's gather task, named
  std::shared_ptr<float> shard_params_;              // stage 3: [shard_floats_]
  std::unique_ptr<std::atomic<int>[]> param_state_;  // stage 3: ParamState per bucket
  mutable std::vector<unsigned char> page_flags_;    // mincore's output, sized once
  size_t staging_floats_ = 0;
  size_t resident_high_water_ = 0;

  // Used only by the caller's thread.
  std::vector<size_t> ready_in_bucket_;  // tensors of each bucket reported this step
  std::vector<bool> bucket_sent_;

  // Guarded by mu_; shared with the communication thread.
  std::mutex mu_;
  std::condition_variable work_cv_;  // tasks queued or stopping
  std::condition_variable idle_cv_;  // a task finished
  std::deque<Task> queue_;
  size_t pending_ = 0;   // queued or running
  std::string running_;  // what the communication thread is doing now
  Status first_error_;   // sticky; OK while usable
  bool stop_ = false;

  std::thread comm_thread_;  // last: starts after every member above exists
};

}  // namespace fleet::trainer
