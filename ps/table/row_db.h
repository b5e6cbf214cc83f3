// RowDb: the RocksDB database a server keeps the disk-tier rows of its
// sparse tables in (SsdSparseTable, `storage.kind: ssd`), one per server
// and `storage.path`, each table in column families of its own (RowColumn).
// Rows are keyed by global shard, then key (big-endian, so a shard's rows
// are contiguous and in key order: a checkpoint reads them in file order).
//
// The database is scratch: checkpoints and the push log are what survive a
// crash. Open empties its folder, and closing it removes its files. The
// write-ahead log is off for the same reason.
//
// Files: the folder `<path>/s<rank>` is made with mode 0700 and opened
// without following a symbolic link (O_NOFOLLOW, then everything relative
// to its descriptor); a folder that FleetPS did not make (no marker file)
// is refused rather than emptied, and so is a symbolic link in its place.
// RocksDB opens its own files by name; it does so through a file system
// that refuses to open a symbolic link there (checked with lstat just
// before: a same-user process could still race that, which the folder's
// 0700 mode leaves to the server's own user). An flock on the marker keeps
// a second live server from opening (and emptying) the same folder.
//
// Thread safety: RowDb, RowColumn and RowScan are thread-safe (RocksDB's
// own locking); a RowBatch is filled by one thread. Calls block for disk
// I/O, with no timeout of their own (local disk).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/status.h"
#include "ps/table/table_config.h"

namespace rocksdb {
class Cache;
class Status;
class ColumnFamilyHandle;
class DB;
class Env;
class Iterator;
class Snapshot;
}  // namespace rocksdb

namespace fleet::ps {

class RowColumn;

class RowDb {
 public:
  // Opens a fresh database in `<path>/s<server_rank>` (creating `path` and
  // the folder when missing, emptying the folder otherwise) with a block
  // cache of `block_cache_bytes`. Errors: FailedPrecondition naming the
  // folder when it is a symbolic link or not a directory, holds files but
  // no FleetPS marker, or is in use by another live process; IOError from
  // the file system or RocksDB.
  static Result<std::shared_ptr<RowDb>> Open(const std::string& path, int server_rank,
                                             size_t block_cache_bytes);
  // Closes the database and removes its files (the folder and marker stay).
  ~RowDb();
  RowDb(const RowDb&) = delete;
  RowDb& operator=(const RowDb&) = delete;

  const std::string& dir() const { return dir_; }
  // Raises the block cache to at least `bytes` (never lowers it).
  void ReserveBlockCache(size_t bytes);
  // A new, empty column family for one table's rows ("t<table>.<n>"),
  // dropped when the RowColumn is destroyed. Errors: IOError.
  Result<std::unique_ptr<RowColumn>> NewColumn(uint32_t table_id, size_t write_buffer_bytes);

 private:
  friend class RowColumn;
  friend class RowScan;
  RowDb(std::string dir, int dir_fd, int marker_fd);
  // Removes every entry of the folder but the marker (never following a
  // link). Errors: FailedPrecondition for a subfolder, IOError.
  Status EmptyFolder();

  // Fixed after Open.
  const std::string dir_;
  const int dir_fd_;     // the folder, opened O_NOFOLLOW
  const int marker_fd_;  // holds the flock
  std::unique_ptr<rocksdb::Env> env_;
  std::shared_ptr<rocksdb::Cache> block_cache_;
  std::unique_ptr<rocksdb::DB> db_;

  std::mutex mu_;
  uint64_t next_column_ = 0;  // guarded by mu_
};

// Puts and deletes applied together by RowColumn::Write (the column is
// named there, so a batch can be filled before its column exists).
class RowBatch {
 public:
  void Put(uint32_t shard, uint64_t key, std::string_view value);
  void Delete(uint32_t shard, uint64_t key);
  size_t count() const { return ops_.size(); }

 private:
  friend class RowColumn;
  struct Op {
    uint32_t shard;
    uint64_t key;
    bool put;
    size_t value_at, value_size;  // in values_
  };
  std::vector<Op> ops_;
  std::string values_;
};

// A consistent view of a column (a RocksDB snapshot) that reads one global
// shard's rows in key order, and single rows, as of its creation.
class RowScan {
 public:
  ~RowScan();
  // Positions at the first row of `shard`.
  void Seek(uint32_t shard);
  // Whether the position holds a row of the shard last sought.
  bool Valid() const;
  uint64_t key() const;
  std::string_view value() const;
  void Next();
  // The row of (shard, key) in this view: false when absent.
  Result<bool> Get(uint32_t shard, uint64_t key, std::string* value) const;
  // OK, or the IOError that stopped the scan.
  Status status() const;

 private:
  friend class RowColumn;
  RowScan(const RowColumn* column, const rocksdb::Snapshot* snapshot);
  const RowColumn* const column_;
  const rocksdb::Snapshot* const snapshot_;
  std::unique_ptr<rocksdb::Iterator> it_;
  uint32_t shard_ = 0;
};

class RowColumn {
 public:
  // Drops the column family (its rows go away with it).
  ~RowColumn();
  RowColumn(const RowColumn&) = delete;
  RowColumn& operator=(const RowColumn&) = delete;

  // Applies the batch (without the write-ahead log). Errors: IOError.
  Status Write(RowBatch* batch);
  // values[i] and found[i] for each (shard, key). Errors: IOError.
  Status MultiGet(std::span<const std::pair<uint32_t, uint64_t>> keys,
                  std::vector<std::string>* values, std::vector<uint8_t>* found) const;
  // One row: false when absent. Errors: IOError.
  Result<bool> Get(uint32_t shard, uint64_t key, std::string* value) const;
  // Calls fn(shard, key, value) for every row, in (shard, key) order; an
  // error of fn stops the scan and is returned. Errors: IOError.
  Status ForEach(
      const std::function<Status(uint32_t shard, uint64_t key, std::string_view value)>& fn) const;
  std::unique_ptr<RowScan> NewScan() const;
  // Writes the memtables to files and compacts them (benchmarks measure
  // the bytes a row takes on disk after this). Errors: IOError.
  Status Compact();
  // Bytes in this column's files and write buffers (RocksDB's estimate).
  uint64_t ApproximateBytes() const;

 private:
  friend class RowDb;
  friend class RowScan;
  RowColumn(RowDb* db, rocksdb::ColumnFamilyHandle* handle) : db_(db), handle_(handle) {}
  Status Check(const rocksdb::Status& s, std::string_view what) const;

  RowDb* const db_;  // outlives the column (the table holds the RowDb)
  rocksdb::ColumnFamilyHandle* const handle_;
};

// The disk-tier databases of one server, one per storage.path, opened on
// first use and shared by the tables naming that path. Thread-safe.
class RowDbSet {
 public:
  explicit RowDbSet(int server_rank) : rank_(server_rank) {}
  // The database of config.storage.path (block cache raised to the
  // config's size). Errors: those of RowDb::Open.
  Result<std::shared_ptr<RowDb>> Get(const StorageConfig& config);

 private:
  const int rank_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<RowDb>> dbs_;  // guarded by mu_
};

}  // namespace fleet::ps
