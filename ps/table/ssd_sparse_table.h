// SsdSparseTable: a sparse table whose hot rows live in memory and the rest
// in a RocksDB database on local disk (`storage.kind: ssd`; the keys are
// documented in table_config.h StorageConfig). It is a SparseTable: its
// memory tier is the base class, unchanged, and this class overrides the
// operations that must also reach the disk. A row in memory is the row; the
// disk may still hold the copy it came up from (stale once the row
// changes), which saves a delete when it comes up and a write when it goes
// down unchanged. Every reader therefore takes memory first.
//
//   Pull / PushGrad / PushDelta: keys not in memory are looked up on disk
//     (one MultiGet per request; a bloom filter answers for new keys) and
//     the rows found are brought up into memory, then the memory table
//     serves the request as usual (creating, admitting and refusing new
//     keys the same way). When no row lives on disk only, these are the
//     memory table's own calls plus one atomic read.
//   A memory bound: after a request, if more than storage.cache_rows rows
//     are in memory, the coldest are written down until 9/10 of it remain.
//   EndPass: ages every row (memory now, disk rows lazily: see below), then
//     moves down the rows not pushed for storage.evict_unseen_passes passes.
//   Shrink: deletes the rows the accessor marks, in memory and on disk.
//
// "Coldest": more unseen passes first, then lower show/click score
// (CtrAccessor's own statistics; ssd needs `accessor: ctr`).
//
// Rows on disk are aged lazily: each carries the pass count at which it
// went down, and whoever reads it (a request bringing it up, a checkpoint,
// Shrink, DebugRow) applies the EndPass calls it missed. The accessor's
// EndPass is a fixed function of the row, so a row is bit for bit what the
// memory table would hold: the same requests give the same checkpoint
// files as a memory table (tested).
//
// Checkpoints: SerializeLocalShard writes the same shard files as
// SparseTable (shard_file.h) from memory and disk merged, so checkpoints
// load into either kind of table and under any server count. A delta
// holds every row (rows on disk carry no change marks) and the keys
// deleted since the last save. Loading writes every row to a new column
// family of the staging table (memory stays empty; rows come up as
// requests need them); SwapRows then exchanges the column families.
//
// Thread safety: as SparseTable. Requests and checkpoint serialisation run
// concurrently (shared tier lock); moving rows down, EndPass, Shrink and
// SwapRows hold the tier lock exclusively, so requests wait for them.
// Requests block for disk reads and, when they cross the memory bound,
// for the writes that bring it back; no timeout of their own (local disk).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "ps/table/row_db.h"
#include "ps/table/sparse_table.h"

namespace fleet::ps {

class CtrAccessor;

class SsdSparseTable final : public SparseTable {
 public:
  // A table over `db` (not owned alone: shared with the server's other
  // tables on the same path). Errors: InvalidArgument as SparseTable::Create
  // or for a config that is not storage ssd; IOError from RocksDB.
  static Result<std::unique_ptr<SsdSparseTable>> Create(const TableConfig& config, ShardRange owned,
                                                        ThreadPool* pool,
                                                        std::shared_ptr<RowDb> db);
  ~SsdSparseTable() override;

  bool serves_from_memory() const override { return false; }

  // As SparseTable's; also IOError or Corruption naming the table when the
  // disk could not be read (the request was not applied then).
  Status Pull(std::span<const uint64_t> keys, std::span<float> values) override;
  Status PushGrad(std::span<const uint64_t> keys, std::span<const float> grads,
                  std::span<const float> shows = {}, std::span<const float> clicks = {}) override;
  Status PushDelta(std::span<const uint64_t> keys, std::span<const float> deltas,
                   std::span<const float> shows = {}, std::span<const float> clicks = {}) override;
  // Errors writing rows down are logged (the rows stay in memory).
  void EndPass() override;
  // Errors reading or writing the disk are logged; returns the rows deleted.
  uint64_t Shrink() override;
  SparseTableStats Stats() const override;
  bool DebugRow(uint64_t key, std::vector<float>* row, std::vector<float>* ext) const override;

  Result<std::vector<ShardImage>> SerializeLocalShard(size_t local, SaveMode mode) override;
  void CommitSave() override;
  void AbortSave() override;
  Status ApplyShardFile(uint32_t shard, std::string_view image, std::string_view file) override;
  std::unique_ptr<SparseTable> NewEmptyLike() const override;
  void SwapRows(SparseTable& staging) override;

  // Test and benchmark hooks: writes every memory row down (as a memory
  // bound of 0 would), and compacts the disk files.
  Status MoveAllToDisk();
  Status CompactDisk();

 private:
  SsdSparseTable(const TableConfig& config, ShardRange owned, ThreadPool* pool,
                 std::shared_ptr<const Accessor> accessor, std::shared_ptr<RowDb> db);

  // Moves the rows of keys that are on disk into memory, for a request
  // whose sizes Route checks (width floats per key). REQUIRES: tier_mu_
  // held, shared or exclusive.
  Status BringUp(std::span<const uint64_t> keys, size_t values_size, size_t width)
      ABSL_SHARED_LOCKS_REQUIRED(tier_mu_);
  // A request: BringUp, then memory_op (the memory table's own call) under
  // the shared tier lock, then KeepMemoryBound.
  Status Serve(std::span<const uint64_t> keys, size_t values_size, size_t width,
               const std::function<Status()>& memory_op);
  // After a request: brings memory back under the bound if it is over.
  void KeepMemoryBound();
  // Writes down the memory rows for which pick(row) holds; on a failed
  // write the rows go back into memory. Returns the rows moved.
  Result<uint64_t> MoveDown(const RowPick& pick) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tier_mu_);
  // Moves down the `count` coldest memory rows.
  Status MoveColdest(uint64_t count) ABSL_EXCLUSIVE_LOCKS_REQUIRED(tier_mu_);
  Status EnsureColumn() ABSL_EXCLUSIVE_LOCKS_REQUIRED(tier_mu_);
  // Decodes a disk value into row (row_floats) and ext (ext_floats; valid
  // when *has_ext) and applies the EndPass calls it missed. Errors:
  // Corruption naming the key.
  Status DecodeAged(uint64_t key, std::string_view value, std::span<float> row,
                    std::span<float> ext, bool* has_ext) const ABSL_SHARED_LOCKS_REQUIRED(tier_mu_);
  std::string EncodeRow(std::span<const float> row, std::span<const float> ext) const
      ABSL_SHARED_LOCKS_REQUIRED(tier_mu_);
  // Coldness: larger is colder (unseen passes, then lower score).
  uint32_t Coldness(std::span<const float> row) const;

  // Fixed after construction.
  const std::shared_ptr<RowDb> db_;  // before column_: a column is dropped first
  const CtrAccessor* const ctr_;     // accessor(), as what it is
  const size_t row_floats_, ext_floats_;
  const uint64_t cache_rows_;

  // Shared by requests and checkpoint serialisation; exclusive to move rows
  // down, end a pass, shrink, apply a checkpoint file, swap.
  mutable absl::Mutex tier_mu_;
  std::unique_ptr<RowColumn> column_ ABSL_GUARDED_BY(tier_mu_);  // null: nothing on disk yet
  uint32_t pass_ ABSL_GUARDED_BY(tier_mu_) = 0;                  // EndPass calls so far
  // Rows that live on disk only, and those of them with an extension; and
  // the copies on disk of rows now in memory (changed under tier_mu_,
  // shared by concurrent requests).
  std::atomic<uint64_t> disk_rows_{0};
  std::atomic<uint64_t> disk_ext_rows_{0};
  std::atomic<uint64_t> stale_copies_{0};
  std::atomic<uint64_t> rows_read_{0};  // brought up by requests (Stats().disk_rows_read)
  // One request at a time brings memory back under the bound.
  std::atomic<bool> moving_down_{false};
  // Staging tables (a checkpoint being loaded): rows applied per held
  // global shard, to tell a base file (the first) from a delta.
  std::vector<uint64_t> loaded_rows_ ABSL_GUARDED_BY(tier_mu_);

  // Keys deleted (Shrink) since the last save, and those a save in flight
  // took (put back by AbortSave).
  absl::Mutex deleted_mu_;
  absl::flat_hash_set<uint64_t> deleted_ ABSL_GUARDED_BY(deleted_mu_);
  std::vector<uint64_t> saving_deleted_ ABSL_GUARDED_BY(deleted_mu_);
};

// The table a config names: SparseTable for storage memory, SsdSparseTable
// (on the database `dbs` keeps for its storage.path) for storage ssd. `dbs`
// may be null when no config names ssd. Errors: those of the two Creates
// and of RowDbSet::Get.
Result<std::unique_ptr<SparseTable>> CreateSparseTable(const TableConfig& config, ShardRange owned,
                                                       ThreadPool* pool, RowDbSet* dbs);

}  // namespace fleet::ps
