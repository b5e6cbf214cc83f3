#include "collective/data_parallel.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "trainer/models/adamw.h"  // ShardRange

namespace fleet::trainer {
namespace {

// Groups tensors from the last one backwards into ranges of at least
// `bucket_bytes` (see the header).
std::vector<GradBucket> PlanBuckets(const ParamArena& arena, size_t bucket_bytes) {
  std::vector<GradBucket> buckets;
  const size_t n = arena.num_tensors();
  size_t end = n;
  while (end > 0) {
    size_t first = end - 1;
    while (first > 0 && (arena.offset(end) - arena.offset(first)) * sizeof(float) < bucket_bytes) {
      --first;
    }
    buckets.push_back(GradBucket{first, end, arena.offset(first), arena.offset(end)});
    end = first;
  }
  return buckets;
}

// Stage 3: one bucket per unit, last unit first (the order backward
// finishes them). InvalidArgument unless the units are consecutive, non-empty
// and cover the table.
Result<std::vector<GradBucket>> UnitBuckets(const ParamArena& arena,
                                            const std::vector<TensorRange>& units) {
  size_t next = 0;
  for (const TensorRange& u : units) {
    if (u.first != next || u.end <= u.first) {
      return Status::InvalidArgument("data parallel: parameter units must be consecutive ranges",
                                     absl::StrCat("unit [", u.first, ", ", u.end, ")"));
    }
    next = u.end;
  }
  if (next != arena.num_tensors()) {
    return Status::InvalidArgument("data parallel: parameter units must cover the parameter table",
                                   absl::StrCat(next, " of ", arena.num_tensors(), " tensors"));
  }
  std::vector<GradBucket> buckets;
  for (auto u = units.rbegin(); u != units.rend(); ++u) {
    buckets.push_back(GradBucket{u->first, u->end, arena.offset(u->first), arena.offset(u->end)});
  }
  return buckets;
}

// Bytes of the pages of [data, data + n) that are in memory.
size_t ResidentPageBytes(const float* data, size_t n, std::vector<unsigned char>* flags) {
  if (n == 0) return 0;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data + n) + page - 1) / page * page;
  const size_t pages = (end - begin) / page;
  if (flags->size() < pages) flags->resize(pages);
  if (mincore(reinterpret_cast<void*>(begin), end - begin, flags->data()) != 0) return 0;
  size_t resident = 0;
  for (size_t i = 0; i < pages; ++i) resident += (*flags)[i] & 1;
  return resident * page;
}

// A step counter travels as two floats, each an integer below 2^24 and so
// exact: hi * 2^24 + lo. Steps beyond 2^48 are not representable.
constexpr int64_t kStepRadix = int64_t{1} << 24;

}  // namespace

Result<std::unique_ptr<DataParallel>> DataParallel::Create(Collective* collective,
                                                           ParamArena* arena,
                                                           const DataParallelOptions& options) {
  return Create(DataParallelGroups{collective, nullptr, nullptr}, arena, options);
}

Result<std::unique_ptr<DataParallel>> DataParallel::Create(const DataParallelGroups& groups,
                                                           ParamArena* arena,
                                                           const DataParallelOptions& options) {
  const int world = groups.world ? groups.world->size() : 1;
  const int shard = groups.shard ? groups.shard->size() : world;
  const int replica = groups.replica ? groups.replica->size() : 1;
  if ((groups.shard || groups.replica) && (groups.world == nullptr || shard * replica != world)) {
    return Status::InvalidArgument(
        "data parallel: the sharding group's size times the replica group's must be the world's",
        absl::StrCat(shard, " x ", replica, " for a world of ", world));
  }
  if (arena == nullptr) return Status::InvalidArgument("data parallel: no parameter arena");
  if (options.bucket_bytes == 0) {
    return Status::InvalidArgument("data parallel: bucket_bytes must be > 0");
  }
  if (options.timeout.count() <= 0) {
    return Status::InvalidArgument("data parallel: timeout must be positive",
                                   absl::StrCat(options.timeout.count(), " ms"));
  }
  if (options.shard_params && !(options.shard_gradients && options.release_reduced_gradients)) {
    return Status::InvalidArgument(
        "data parallel: sharded parameters need sharded and released gradients (stage 3)");
  }
  std::vector<GradBucket> buckets;
  if (options.shard_params) {
    FLEET_ASSIGN_OR_RETURN(buckets, UnitBuckets(*arena, options.units));
  } else {
    buckets = PlanBuckets(*arena, options.bucket_bytes);
  }
  return std::unique_ptr<DataParallel>(
      new DataParallel(groups, arena, options, std::move(buckets)));
}

namespace {

// The group that splits the buckets in sharded mode: the shard group, else
// the world; null when nothing is split.
Collective* ShardGroupOf(const DataParallelGroups& groups, const DataParallelOptions& options) {
  Collective* shard = groups.shard ? groups.shard : groups.world;
  return options.shard_gradients && shard != nullptr && shard->size() > 1 ? shard : nullptr;
}

}  // namespace

DataParallel::DataParallel(const DataParallelGroups& groups, ParamArena* arena,
                           const DataParallelOptions& options, std::vector<GradBucket> buckets)
    : collective_(groups.world),
      arena_(arena),
      options_(options),
      rank_(groups.world ? groups.world->rank() : 0),
      world_(groups.world ? groups.world->size() : 1),
      shard_group_(ShardGroupOf(groups, options)),
      replica_group_(shard_group_ != nullptr && groups.replica != nullptr &&
                             groups.replica->size() > 1
                         ? groups.replica
                         : nullptr),
      shard_rank_(shard_group_ ? shard_group_->rank() : 0),
      shard_size_(shard_group_ ? shard_group_->size() : 1),
      replica_rank_(replica_group_ ? replica_group_->rank() : 0),
      buckets_(std::move(buckets)),
      bucket_of_tensor_(arena->num_tensors()),
      shard_(shard_group_ != nullptr),
      discarded_(buckets_.size(), false),
      ready_in_bucket_(buckets_.size(), 0),
      bucket_sent_(buckets_.size(), false) {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (size_t t = buckets_[b].first_tensor; t < buckets_[b].end_tensor; ++t) {
      bucket_of_tensor_[t] = b;
    }
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    bucket_what_.push_back(absl::StrCat(
        shard_ ? absl::StrCat("reduce-scatter over ", shard_size_, " shards") : "all-reduce",
        replica_group_ ? absl::StrCat(" and all-reduce over ", replica_group_->size(), " replicas")
                       : "",
        " of gradient bucket ", b, " (", Describe(buckets_[b]), ")"));
  }
  if (!shard_) {
    pieces_.push_back(GradPiece{0, arena->size(), 0});
  } else {
    size_t staging = 0;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      const ElementRange r =
          ShardRange(buckets_[b].end - buckets_[b].begin, shard_size_, shard_rank_);
      pieces_.push_back(
          GradPiece{buckets_[b].begin + r.begin, buckets_[b].begin + r.end, shard_floats_});
      shard_floats_ += PieceCount(b);
      staging = std::max(staging, PieceCount(b) * shard_size_);
    }
    shard_grads_ = arena->backend()->AllocateFloats(shard_floats_);
    staging_ = arena->backend()->AllocateFloats(staging);
    staging_floats_ = staging;
    if (options.shard_params) {
      shard_params_ = arena->backend()->AllocateFloats(shard_floats_);
      param_state_ = std::make_unique<std::atomic<int>[]>(buckets_.size());
      for (size_t b = 0; b < buckets_.size(); ++b) {
        param_state_[b].store(kResident);  // the arena starts whole
        gather_what_.push_back(absl::StrCat("all-gather over ", shard_size_,
                                            " shards of parameter bucket ", b, " (",
                                            Describe(buckets_[b]), ")"));
      }
    }
  }
  if (options.measure_resident_bytes) {
    // Sized once, so measuring allocates nothing.
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    page_flags_.resize(arena->size() * sizeof(float) / page + 2);
  }
  // A collective that computes on the caller's CPU (shared memory) gains
  // nothing from a thread of its own while backward fills the cores, and
  // every hand-off to and from it can wait for a time slice: the caller
  // makes its calls itself then.
  if (collective_ != nullptr && !collective_->runs_on_caller_cpu()) {
    comm_thread_ = std::thread([this] { CommLoop(); });
  }
}

DataParallel::~DataParallel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (comm_thread_.joinable()) comm_thread_.join();
}

void DataParallel::CommLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) {
      // Being destroyed: nobody waits for what is still queued (the caller
      // gave up on it after an error or timeout), and running it could
      // block for another collective timeout.
      queue_.clear();
      return;
    }
    Task task = std::move(queue_.front());
    queue_.pop_front();
    Status st;
    if (!first_error_.ok()) {
      // Peers may be mid-operation after a failure; issuing more calls
      // could pair them with the wrong operation. Skip instead.
      st = first_error_;
    } else {
      running_ = WhatOf(task);
      lock.unlock();
      st = RunTask(task);
      lock.lock();
      running_.clear();
      RecordFailure(st, WhatOf(task));
    }
    --pending_;
    idle_cv_.notify_all();
  }
}

Status DataParallel::RunTask(const Task& task) {
  if (task.bucket == kNoBucket) return task.run();
  return task.gather ? GatherTask(task.bucket) : ReduceBucket(task.bucket);
}

std::string_view DataParallel::WhatOf(const Task& task) const {
  if (task.bucket == kNoBucket) return task.what;
  return task.gather ? gather_what_[task.bucket] : bucket_what_[task.bucket];
}

void DataParallel::RecordFailure(const Status& st, std::string_view what) {
  if (st.ok() || !first_error_.ok()) return;
  // Gloo names a lost peer by address only; with two ranks the peer is
  // known, so say which rank it was.
  const std::string peer =
      world_ == 2 ? absl::StrCat(" (peer: rank ", 1 - rank_, ")") : std::string();
  first_error_ = st.WithContext(
      absl::StrCat("data parallel rank ", rank_, " of ", world_, peer, ": ", std::string(what)));
}

void DataParallel::Enqueue(Task task) {
  CHECK(collective_ != nullptr) << "data parallel: no collective to run " << WhatOf(task);
  if (!comm_thread_.joinable()) {
    // No communication thread: run it now, skipped after a failure as the
    // thread would.
    std::lock_guard<std::mutex> lock(mu_);
    if (first_error_.ok()) RecordFailure(RunTask(task), WhatOf(task));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    ++pending_;
  }
  work_cv_.notify_one();
}

Status DataParallel::Broken() {
  std::lock_guard<std::mutex> lock(mu_);
  if (first_error_.ok()) return Status::OK();
  return Status::FailedPrecondition(absl::StrCat("data parallel rank ", rank_, " of ", world_,
                                                 ": unusable after an earlier failure"),
                                    first_error_.ToString());
}

Status DataParallel::WaitIdle() {
  std::unique_lock<std::mutex> lock(mu_);
  const bool done = idle_cv_.wait_for(lock, options_.timeout, [this] { return pending_ == 0; });
  if (!done) {
    // The communication thread is stuck inside the Collective (which has its
    // own, shorter, timeout) or the machine is badly overloaded. Break the
    // helper: later tasks would run out of order with the peers.
    Status st = Status::Timeout(absl::StrCat("data parallel rank ", rank_, " of ", world_,
                                             ": waited ", options_.timeout.count(), " ms for ",
                                             pending_, " pending collective operation(s)"),
                                running_.empty() ? std::string("queued") : "running: " + running_);
    if (first_error_.ok()) first_error_ = st;
    return st;
  }
  if (!first_error_.ok()) {
    return first_error_;
  }
  return Status::OK();
}

Status DataParallel::RunAndWait(std::string what, std::function<Status()> run) {
  FLEET_RETURN_IF_ERROR(Broken());
  Enqueue(Task{kNoBucket, false, std::move(what), std::move(run)});
  return WaitIdle();
}

Status DataParallel::SyncFromRoot(Optimizer* optimizer) {
  if (optimizer != nullptr && optimizer->arena() != arena_) {
    return Status::InvalidArgument("data parallel: optimizer is bound to another arena");
  }
  if (collective_ == nullptr) return Status::OK();
  const size_t n = arena_->size();
  float* params = arena_->params().data();
  FLEET_RETURN_IF_ERROR(
      RunAndWait(absl::StrCat("broadcast of ", n, " parameters from rank 0"),
                 [this, params, n] { return collective_->Broadcast(params, n, 0); }));
  if (optimizer == nullptr) return Status::OK();
  for (size_t i = 0; i < optimizer->state().size(); ++i) {
    float* state = optimizer->state()[i].data();
    FLEET_RETURN_IF_ERROR(RunAndWait(
        absl::StrCat("broadcast of optimizer state ", i, " (", n, " floats) from rank 0"),
        [this, state, n] { return collective_->Broadcast(state, n, 0); }));
  }
  // The step goes through the backend's memory (device memory under NCCL).
  Backend* backend = arena_->backend();
  const int64_t step = optimizer->step();
  const float host[2] = {static_cast<float>(step / kStepRadix),
                         static_cast<float>(step % kStepRadix)};
  std::shared_ptr<float> buffer = backend->AllocateFloats(2);
  backend->CopyFromHost(buffer.get(), host, sizeof(host));
  float* data = buffer.get();
  FLEET_RETURN_IF_ERROR(RunAndWait("broadcast of the optimizer step from rank 0",
                                   [this, data] { return collective_->Broadcast(data, 2, 0); }));
  float root[2];
  backend->CopyToHost(root, buffer.get(), sizeof(root));
  optimizer->RestoreStep(static_cast<int64_t>(root[0]) * kStepRadix +
                         static_cast<int64_t>(root[1]));
  return Status::OK();
}

std::string DataParallel::Describe(const GradBucket& bucket) const {
  const ParamTable& table = arena_->table();
  return absl::StrCat(table[bucket.first_tensor].name, "..", table[bucket.end_tensor - 1].name,
                      ", ", bucket.end - bucket.begin, " floats");
}

size_t DataParallel::PieceCount(size_t b) const {
  return (buckets_[b].end - buckets_[b].begin + shard_size_ - 1) / shard_size_;
}

float* DataParallel::reduced_grads() const {
  return shard_ ? shard_grads_.get() : arena_->grads().data();
}

Status DataParallel::ReduceScatterBucket(size_t b) {
  const GradBucket& bucket = buckets_[b];
  Backend* backend = arena_->backend();
  const size_t length = bucket.end - bucket.begin;
  const size_t count = PieceCount(b);
  float* grads = arena_->grads().data() + bucket.begin;
  const float* in = grads;
  if (count * shard_size_ != length) {
    // The collective wants S pieces of `count`: copy into the padded staging
    // buffer (the pad is zero and its sums are never read). Discard, not
    // Fill: this is the communication thread, and the CPU's Fill runs on the
    // pool the caller is computing with.
    backend->CopyOnDevice(staging_.get(), grads, length * sizeof(float));
    backend->Discard(staging_.get() + length, count * shard_size_ - length);
    in = staging_.get();
  }
  float* piece = shard_grads_.get() + pieces_[b].offset;
  FLEET_RETURN_IF_ERROR(shard_group_->ReduceScatter(in, piece, count));
  // The ranks holding the same piece in the other sharding groups add theirs.
  if (replica_group_)
    FLEET_RETURN_IF_ERROR(replica_group_->AllReduce(piece, count, ReduceOp::kSum));
  if (options_.release_reduced_gradients) {
    backend->Discard(grads, length);
    discarded_[b] = true;
  }
  return Status::OK();
}

void DataParallel::ZeroGrad() {
  if (!shard_ || !options_.release_reduced_gradients) {
    arena_->ZeroGrad();
    return;
  }
  Backend* backend = arena_->backend();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    // A discarded bucket already reads as zeros; writing them would bring
    // its pages back.
    if (!discarded_[b]) {
      backend->Fill(arena_->grads().data() + buckets_[b].begin, buckets_[b].end - buckets_[b].begin,
                    0.0f);
    }
    discarded_[b] = false;
  }
}

Status DataParallel::AllGatherBucket(size_t b, const float* piece) {
  const GradBucket& bucket = buckets_[b];
  Backend* backend = arena_->backend();
  float* params = arena_->params().data();
  const size_t length = bucket.end - bucket.begin;
  const size_t count = PieceCount(b);
  // Every rank's piece starts at rank * count inside the bucket, so the
  // all-gather can write the bucket in place (the Collective contract
  // allows the input to be this rank's slot of the output) when S pieces
  // fill it exactly; otherwise it goes through the padded staging buffer.
  const bool in_place = count * shard_size_ == length;
  float* out = in_place ? params + bucket.begin : staging_.get();
  float* slot = out + shard_rank_ * count;
  // Our piece may be short (or empty): the collective sends `count`.
  if (slot != piece) backend->CopyOnDevice(slot, piece, pieces_[b].size() * sizeof(float));
  FLEET_RETURN_IF_ERROR(shard_group_->AllGather(slot, out, count));
  if (!in_place) backend->CopyOnDevice(params + bucket.begin, out, length * sizeof(float));
  return Status::OK();
}

Status DataParallel::GatherParams() {
  if (!shard_ || shards_params()) return Status::OK();
  const float* params = arena_->params().data();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const float* piece = params + pieces_[b].begin;
    FLEET_RETURN_IF_ERROR(RunAndWait(
        absl::StrCat("all-gather of parameter bucket ", b, " (", Describe(buckets_[b]), ")"),
        [this, b, piece] { return AllGatherBucket(b, piece); }));
  }
  return Status::OK();
}

Status DataParallel::GatherTask(size_t b) {
  FLEET_RETURN_IF_ERROR(AllGatherBucket(b, shard_params_.get() + pieces_[b].offset));
  param_state_[b].store(kResident, std::memory_order_release);
  return Status::OK();
}

size_t DataParallel::BucketOfUnit(TensorRange unit) const {
  CHECK_LT(unit.first, bucket_of_tensor_.size()) << "parameter unit beyond the table";
  const size_t b = bucket_of_tensor_[unit.first];
  CHECK(buckets_[b].first_tensor == unit.first && buckets_[b].end_tensor == unit.end)
      << "parameter unit [" << unit.first << ", " << unit.end << ") is not one of the units "
      << "this helper was made with";
  return b;
}

void DataParallel::StartGather(size_t b) {
  // Only this (the caller's) thread moves a bucket out of kReleased.
  if (param_state_[b].load(std::memory_order_acquire) != kReleased) return;
  param_state_[b].store(kGathering, std::memory_order_relaxed);
  Enqueue(Task{b, true, {}, nullptr});
}

void DataParallel::WaitGathered(size_t b) {
  if (param_state_[b].load(std::memory_order_acquire) == kResident) return;
  std::unique_lock<std::mutex> lock(mu_);
  const bool done = idle_cv_.wait_for(lock, options_.timeout, [this, b] {
    return param_state_[b].load(std::memory_order_acquire) == kResident || !first_error_.ok();
  });
  if (!done && first_error_.ok()) {
    first_error_ =
        Status::Timeout(absl::StrCat("data parallel rank ", rank_, " of ", world_, ": waited ",
                                     options_.timeout.count(), " ms for the ", gather_what_[b]),
                        running_.empty() ? std::string("queued") : "running: " + running_);
  }
}

void DataParallel::Acquire(TensorRange unit, TensorRange next) {
  if (!shards_params()) return;
  const size_t b = BucketOfUnit(unit);
  StartGather(b);
  if (!next.empty()) StartGather(BucketOfUnit(next));
  WaitGathered(b);
  MeasureResident();
}

void DataParallel::Release(TensorRange unit) {
  if (!shards_params()) return;
  const size_t b = BucketOfUnit(unit);
  // After a failure the gather may never have run; the step reports the error.
  if (param_state_[b].load(std::memory_order_acquire) != kResident) return;
  arena_->backend()->Discard(arena_->params().data() + buckets_[b].begin,
                             buckets_[b].end - buckets_[b].begin);
  param_state_[b].store(kReleased, std::memory_order_relaxed);
}

void DataParallel::KeepOnlyShards() {
  if (!shards_params()) return;
  Backend* backend = arena_->backend();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const GradBucket& bucket = buckets_[b];
    backend->CopyOnDevice(shard_params_.get() + pieces_[b].offset,
                          arena_->params().data() + pieces_[b].begin,
                          pieces_[b].size() * sizeof(float));
    backend->Discard(arena_->params().data() + bucket.begin, bucket.end - bucket.begin);
    backend->Discard(arena_->grads().data() + bucket.begin, bucket.end - bucket.begin);
    discarded_[b] = true;
    param_state_[b].store(kReleased, std::memory_order_relaxed);
  }
}

Status DataParallel::GatherAllParams() {
  if (!shards_params()) return Status::OK();
  FLEET_RETURN_IF_ERROR(Broken());
  for (size_t b = 0; b < buckets_.size(); ++b) StartGather(b);
  return WaitIdle();
}

void DataParallel::ReleaseAllParams() {
  if (!shards_params()) return;
  for (const GradBucket& bucket : buckets_) Release({bucket.first_tensor, bucket.end_tensor});
}

size_t DataParallel::ResidentBytesNow() const {
  size_t bytes = ResidentPageBytes(arena_->params().data(), arena_->size(), &page_flags_) +
                 ResidentPageBytes(arena_->grads().data(), arena_->size(), &page_flags_);
  if (shard_) {
    // Counted whole: allocated once and written every step.
    bytes += (shard_floats_ * (shards_params() ? 2 : 1) + staging_floats_) * sizeof(float);
  }
  return bytes;
}

void DataParallel::MeasureResident() {
  if (options_.measure_resident_bytes) {
    resident_high_water_ = std::max(resident_high_water_, ResidentBytesNow());
  }
}

void DataParallel::EnqueueBucket(size_t b) {
  bucket_sent_[b] = true;
  const GradBucket& bucket = buckets_[b];
  Backend* backend = arena_->backend();
  if (backend->device().is_cuda()) {
    // Backward's kernels run asynchronously on the backend's stream while
    // the Collective uses its own stream. The Backend interface has no
    // explicit synchronise; CopyToHost waits for the stream (see
    // backend.h), so after this 4-byte copy the bucket's gradients are final.
    float probe;
    backend->CopyToHost(&probe, arena_->grads().data() + bucket.end - 1, sizeof(probe));
  }
  Enqueue(Task{b, false, {}, nullptr});
}

Status DataParallel::ReduceBucket(size_t b) {
  const GradBucket& bucket = buckets_[b];
  FLEET_RETURN_IF_ERROR(shard_
                            ? ReduceScatterBucket(b)
                            : collective_->AllReduce(arena_->grads().data() + bucket.begin,
                                                     bucket.end - bucket.begin, ReduceOp::kMean));
  if (on_bucket_reduced_) on_bucket_reduced_(b);
  return Status::OK();
}

GradPiece DataParallel::ReducedPiece(size_t b) const {
  if (shard_) return pieces_[b];
  // All-reduce mode: the bucket itself, in the arena's gradients.
  return GradPiece{buckets_[b].begin, buckets_[b].end, buckets_[b].begin};
}

void DataParallel::MarkReady(size_t first, size_t end) {
  if (collective_ == nullptr) return;  // nothing to exchange
  CHECK_LE(end, arena_->num_tensors()) << "grad-ready range beyond the parameter table";
  for (size_t t = first; t < end; ++t) {
    const size_t b = bucket_of_tensor_[t];
    const GradBucket& bucket = buckets_[b];
    if (++ready_in_bucket_[b] == bucket.end_tensor - bucket.first_tensor && !bucket_sent_[b]) {
      MeasureResident();  // the bucket's gradients are all there, not yet reduced
      EnqueueBucket(b);
    }
  }
}

GradReadyFn DataParallel::grad_ready() {
  return [this](size_t first, size_t end) { MarkReady(first, end); };
}

Status DataParallel::FinishGradients() {
  if (collective_ == nullptr) {
    MeasureResident();  // one process: every gradient is complete now
    return Status::OK();
  }
  // Buckets never reported complete go out now, in bucket order, which is
  // the same on every rank. (After a failure the communication thread skips
  // them and WaitIdle returns the first error.)
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!bucket_sent_[b]) EnqueueBucket(b);
  }
  std::fill(ready_in_bucket_.begin(), ready_in_bucket_.end(), 0);
  std::fill(bucket_sent_.begin(), bucket_sent_.end(), false);
  return WaitIdle();
}

Status DataParallel::SumOverRanks(std::span<float> values) {
  return SumOver(collective_, values, "ranks");
}

Status DataParallel::SumOverShards(std::span<float> values) {
  return SumOver(shard_group_, values, "shards");
}

Status DataParallel::SumOver(Collective* group, std::span<float> values, const char* over) {
  if (group == nullptr || values.empty()) return Status::OK();
  Backend* backend = arena_->backend();
  std::shared_ptr<float> buffer = backend->AllocateFloats(values.size());
  backend->CopyFromHost(buffer.get(), values.data(), values.size_bytes());
  float* data = buffer.get();
  const size_t count = values.size();
  FLEET_RETURN_IF_ERROR(
      RunAndWait(absl::StrCat("sum over ", over, " of ", count, " values"),
                 [group, data, count] { return group->AllReduce(data, count, ReduceOp::kSum); }));
  backend->CopyToHost(values.data(), buffer.get(), values.size_bytes());
  return Status::OK();
}

}  // namespace fleet::trainer
