// SparseTable: uint64 key -> row, for the global shards one server holds.
//
// A key lives in global shard ShardOfKey(key, shard_num) (partition.h); this
// instance holds shards [owned.begin, owned.end) and refuses other keys.
// Global shards are the unit of placement and of checkpoint files; in
// memory they are grouped into config.local_shard_num local shards. Each
// local shard has its own lock, a chunked row arena (row_store.h) and an
// open-addressing index (absl::flat_hash_set of 4-byte slot ids hashed by the
// key stored in the arena, which costs ~5 bytes per index slot instead of the
// 17 of a flat_hash_map<uint64_t, uint32_t>). Requests are split by local
// shard and large ones worked on in parallel on the ThreadPool given at
// creation. Grouping matters for small requests: 1000 keys spread over all
// 1000 global shards would take 1000 locks and as many cold index lookups.
//
// Row contents and what pulls, pushes and passes do are the Accessor's
// business (accessor.h): PlainAccessor or CtrAccessor, chosen by
// config.accessor. Admission (config.admission_min_count) is applied here.
//
// Bad input (size mismatches, keys of shards this server does not hold)
// returns InvalidArgument before anything is changed: the table is unchanged.
//
// Duplicate keys in one request are processed one after the other, in
// request order (a push of the same key twice applies two updates); clients
// normally merge them first.
//
// Thread safety: every method is thread-safe. Pull/push/EndPass/Shrink on
// different shards run in parallel; on one shard they serialise. Methods
// block only on shard locks (held for the duration of one request's keys of
// that shard) and never wait for I/O.
//
// Tiers: this class keeps every row in memory. SsdSparseTable
// (ssd_sparse_table.h, `storage.kind: ssd`) derives from it, uses it as its
// memory tier and overrides the virtual methods below to reach the rows it
// keeps on disk; it reads and moves memory rows through the protected
// methods at the end. Servers and checkpoints use either through this
// interface (CreateSparseTable makes the one a config names).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "comm/status.h"
#include "comm/thread_pool.h"
#include "ps/table/accessor.h"
#include "ps/table/partition.h"
#include "ps/table/save_state.h"
#include "ps/table/shard_file.h"
#include "ps/table/table_config.h"

namespace fleet::ps {

class LocalShard;
class RowQuota;

struct SparseTableStats {
  uint64_t rows = 0;            // stored rows
  uint64_t ext_rows = 0;        // rows that have an extension (CTR embedx)
  uint64_t pending_keys = 0;    // keys seen but not admitted yet
  uint64_t dropped_pushes = 0;  // pushes to keys not admitted (since creation)
  uint64_t bytes = 0;           // memory held by rows, indexes and counters
  // Disk tier (SsdSparseTable; 0 for memory tables). `rows` and `ext_rows`
  // above count the rows on disk too; `bytes` is memory only.
  uint64_t disk_rows = 0;       // rows on disk
  uint64_t disk_bytes = 0;      // the disk tier's files and write buffers (an estimate)
  uint64_t disk_rows_read = 0;  // rows brought up from disk by requests, since creation
};

// The file image of one global shard.
struct ShardImage {
  uint32_t shard = 0;
  ShardFileInfo info;
  std::string image;
};

class SparseTable {
 public:
  // Builds an empty table holding global shards `owned`, every row in
  // memory whatever config.storage says (CreateSparseTable in
  // ssd_sparse_table.h honours it). `pool` runs per-shard work; nullptr
  // runs everything on the calling thread. The pool is not owned and must
  // outlive the table.
  // Errors: InvalidArgument for a config that fails ValidateTableConfig, a
  // dense config, or a range outside [0, shard_num) or empty.
  static Result<std::unique_ptr<SparseTable>> Create(const TableConfig& config, ShardRange owned,
                                                     ThreadPool* pool);
  virtual ~SparseTable();
  SparseTable(const SparseTable&) = delete;
  SparseTable& operator=(const SparseTable&) = delete;

  const TableConfig& config() const { return config_; }
  ShardRange owned_shards() const { return owned_; }
  // ShardOfKey for this table's shard_num, fast.
  const KeySharder& sharder() const { return sharder_; }
  // Floats per key of a pull response, and of a gradient or delta.
  size_t pull_dim() const { return accessor_->pull_dim(); }
  size_t push_dim() const { return accessor_->push_dim(); }
  // False when requests may wait for disk reads (a disk tier): servers then
  // run them on their pool, never on the I/O thread.
  virtual bool serves_from_memory() const { return true; }

  // Writes pull_dim() floats per key to values (key i at i * pull_dim()).
  // Missing keys are created with the initializer when admitted; a key not
  // admitted yet gets its initial value and is not stored.
  // Errors: InvalidArgument when values.size() != keys.size() * pull_dim()
  // or a key's shard is not held here; then values is untouched and so is
  // the table. FailedPrecondition naming the table when new keys were
  // refused a row (config.max_rows_per_server reached, or a local shard's
  // slot space used up): values is complete (refused keys get their
  // initial value) and the other keys were served.
  virtual Status Pull(std::span<const uint64_t> keys, std::span<float> values);

  // Applies one gradient of push_dim() floats per key with the optimizer.
  // shows/clicks: empty, or one count per key (CTR accessor; empty means
  // show 1, click 0 each). A missing key counts as a sighting for admission
  // and, if admitted, is created first; otherwise its gradient is dropped
  // (counted in Stats().dropped_pushes).
  // Errors: InvalidArgument for size mismatches or keys not held here; the
  // table is then unchanged. FailedPrecondition as Pull: the gradients of
  // the refused keys were dropped, the others applied.
  virtual Status PushGrad(std::span<const uint64_t> keys, std::span<const float> grads,
                          std::span<const float> shows = {}, std::span<const float> clicks = {});

  // value += delta (geo mode), push_dim() floats per key, with the
  // shows/clicks the delta's steps saw (empty: show 0, click 0 each; the
  // CTR accessor counts them as PushGrad does); missing keys as in PushGrad.
  // Errors as PushGrad.
  virtual Status PushDelta(std::span<const uint64_t> keys, std::span<const float> deltas,
                           std::span<const float> shows = {}, std::span<const float> clicks = {});

  // Ends a training pass: the accessor ages every row (CTR: decays
  // show/click, counts an unseen pass).
  virtual void EndPass();

  // Deletes the rows the accessor marks for deletion and forgets admission
  // counts of keys not admitted. Returns the number of rows deleted.
  virtual uint64_t Shrink();

  virtual SparseTableStats Stats() const;

  // Copies a stored row (row_floats) and its extension (empty if none);
  // false when the key is not stored. For tests and tools; does not admit.
  // REQUIRES: key's shard is held here.
  virtual bool DebugRow(uint64_t key, std::vector<float>* row, std::vector<float>* ext) const;

  // ---- Checkpoint hooks (used by Checkpointer; see checkpoint.h) ----

  // In-memory parts (config.local_shard_num, capped at the shards held),
  // each holding a block of consecutive global shards: LocalShardRange.
  size_t local_shard_count() const { return local_count_; }
  // The global shards of part `local`: block `local` of the held ones split
  // into local_shard_count() (BlockStart; none empty). REQUIRES: local <
  // local_shard_count().
  ShardRange LocalShardRange(size_t local) const {
    auto start = [&](size_t l) {
      return owned_.begin + static_cast<uint32_t>(BlockStart(owned_.size(), local_count_, static_cast<int>(l)));
    };
    return {start(local), start(local + 1)};
  }

  // The shard file images of the global shards in local shard `local`, each
  // with all rows (kBase) or the rows changed and keys deleted since the
  // last save (kDelta), and clears those change marks. The marks come back
  // with AbortSave and are dropped with CommitSave. Holds that part's lock
  // (not the others') while it copies. REQUIRES: local < local_shard_count().
  // Errors: none for memory tables; a disk tier's read errors (IOError,
  // Corruption), after which the caller aborts the save.
  virtual Result<std::vector<ShardImage>> SerializeLocalShard(size_t local, SaveMode mode);
  virtual void CommitSave();
  virtual void AbortSave();

  // Applies one shard file image (base or delta) to this table, which must
  // be a staging table that nobody else uses yet. Rows of shards not held
  // are an error: callers pass only files of held shards.
  // Errors: Corruption naming `file` when the image is malformed, has the
  // wrong table, shard or row widths, or holds a key of another shard.
  virtual Status ApplyShardFile(uint32_t shard, std::string_view image, std::string_view file);

  // An empty table with this one's config, owned range, pool and accessor:
  // the staging area a load fills before SwapRows.
  virtual std::unique_ptr<SparseTable> NewEmptyLike() const;

  // Replaces this table's rows with staging's; staging gets the old rows.
  // Change marks of the new rows are clear: the table now equals the
  // checkpoint it was loaded from. Blocks until in-flight requests finish.
  // REQUIRES: staging came from this->NewEmptyLike().
  virtual void SwapRows(SparseTable& staging);

  SaveState& save_state() { return save_state_; }

 protected:
  // `accessor` is shared with the tables NewEmptyLike makes.
  SparseTable(const TableConfig& config, ShardRange owned, ThreadPool* pool,
              std::shared_ptr<const Accessor> accessor);

  // The errors of Create, for subclasses' own.
  static Status CheckCreate(const TableConfig& config, ShardRange owned);
  const Accessor& accessor() const { return *accessor_; }
  const std::shared_ptr<const Accessor>& shared_accessor() const { return accessor_; }
  ThreadPool* pool() const { return pool_; }

  // ---- For a tier below memory (SsdSparseTable). Thread-safe; each holds
  // the locks of the local shards it visits, one at a time. ----

  // Rows stored in memory now.
  uint64_t MemoryRows() const;
  // Appends to *absent the request indices of the keys not stored in memory.
  // Errors as Pull for `values_size` floats of `width` per key (nothing
  // appended then).
  Status FindAbsent(std::span<const uint64_t> keys, size_t values_size, size_t width,
                    std::vector<uint32_t>* absent);
  // A row as a lower tier hands it up, and as ExtractRows and ForEachRowIn
  // show it. ext: empty when it has no extension.
  struct RowRef {
    uint64_t key;
    std::span<const float> row;  // row_floats()
    std::span<const float> ext;  // ext_floats() or empty
    // The lower tier still holds a copy (the row came from there), and
    // whether the row changed since it came (a push or an EndPass).
    bool has_copy = false;
    bool changed = true;
  };
  // Stores rows whose keys are not in memory (keys already there keep their
  // row; duplicates in `rows` too), with their has_copy and changed marks.
  // Counted like loaded rows: above the row quota too. Sets inserted[i] to
  // whether rows[i] was stored.
  // Errors: FailedPrecondition when a local shard's slot space is used up
  // (the rows before it were stored). REQUIRES: every key's shard held.
  Status InsertAbsentRows(std::span<const RowRef> rows, std::vector<uint8_t>* inserted);
  // Removes from local shard `local` every row for which pick(row) is true,
  // handing it to take() first, under that shard's lock. Not recorded as
  // deleted for delta checkpoints. Returns the rows removed.
  using RowPick = std::function<bool(std::span<const float> row)>;
  using RowTake = std::function<void(const RowRef& row)>;
  uint64_t ExtractRows(size_t local, const RowPick& pick, const RowTake& take);
  // Calls fn on every row of local shard `local`, under its lock.
  void ForEachRowIn(size_t local, const RowTake& fn) const;
  // Forgets the sighting counts of keys not admitted yet (what Shrink does
  // besides deleting rows).
  void ForgetAdmissionCounts();

 private:
  friend class LocalShard;  // fills and reads the tier types above
  struct RoutedKeys;
  // FailedPrecondition describing `refused` keys of one `op` (OK for 0).
  Status RefusedKeys(uint64_t refused, const char* op) const;
  // InvalidArgument unless shows and clicks are empty or one per key.
  Status CheckCounts(size_t keys, std::span<const float> shows,
                     std::span<const float> clicks) const;
  // Checks sizes and ownership and groups key indices by local shard.
  Status Route(std::span<const uint64_t> keys, size_t values_size, size_t width,
               RoutedKeys* routed) const;
  // Route()s the keys, then runs fn(shard, hashes, indices) on every shard
  // with keys, under that shard's lock (in parallel when worthwhile), where
  // hashes[i] = Mix64(keys[i]). Errors: those of Route, before anything ran.
  // (A FunctionRef: a request's lambda, called in place, not copied to the
  // heap as a std::function of its size would be.)
  Status ForEachShardOfKeys(
      std::span<const uint64_t> keys, size_t values_size, size_t width,
      absl::FunctionRef<void(LocalShard&, const uint64_t*, std::span<const uint32_t>)> fn);
  void ForEachShard(const std::function<void(LocalShard&)>& fn);
  LocalShard& shard(uint32_t global) const;
  uint32_t LocalOf(uint32_t global) const { return local_of_[global - owned_.begin]; }

  // Fixed after construction.
  const TableConfig config_;
  const ShardRange owned_;
  ThreadPool* const pool_;
  const std::shared_ptr<const Accessor> accessor_;  // shared with staging tables
  // Counts this table's rows against config.max_rows_per_server; used by
  // the shards and swapped with them by SwapRows (guarded by shards_mu_
  // for that swap; owns its own synchronisation otherwise).
  std::unique_ptr<RowQuota> quota_;
  const uint32_t local_count_;
  const KeySharder sharder_;
  std::vector<uint16_t> local_of_;  // held global shard - owned.begin -> local shard

  // Owns its own synchronisation.
  SaveState save_state_;

  // The shard objects; the vector is replaced only by SwapRows. Shared for
  // every operation, exclusive for SwapRows. Each shard has its own lock
  // for its rows.
  mutable absl::Mutex shards_mu_;
  std::vector<std::unique_ptr<LocalShard>> shards_ ABSL_GUARDED_BY(shards_mu_);
};

}  // namespace fleet::ps
