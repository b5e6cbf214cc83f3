// Checkpointer: saves and loads the tables of one server through a
// FileSystem, so a job can restart, possibly with a different number of
// servers.
//
// Directory layout (all servers of a job save into the same directory):
//   MANIFEST-g<gen>-s<rank>-of-<S>      one per server per save (generation)
//   t<table>-g<gen>-shard<k>.bin        one per sparse global shard
//   t<table>-g<gen>-dense-s<rank>.bin   one per dense table per server
// Generations are numbered 0, 1, 2, ...; each is a base (every row) or a
// delta (rows changed and keys deleted since the previous generation), and
// Load applies the newest base and the deltas after it in order. Files are written as "<name>.tmp",
// fsynced, renamed, the directory fsynced, and the manifest (magic, format
// version, table configs, file list with row counts, sizes and crc32, and
// its own crc32) is written the same way and renamed LAST: a save that dies
// midway leaves no manifest naming it, so Load never sees a half checkpoint.
// What such a save (a server killed midway) left behind is removed by the
// server's next save into the directory or load from it: its own temp files, and its own
// shard and dense files of generations newer than the newest complete one
// that it published no manifest for. Files of other servers are left alone
// (they may be saving at the same moment).
//
// Failure handling:
//   * any failure before the manifest rename: the new files are removed,
//     change marks restored (the next delta still contains those rows), and
//     the error (usually IOError) returned; the previous checkpoint is intact
//     and saving may be retried.
//   * a failed manifest rename or directory sync after it: whether the save
//     happened is unknown, so every table involved refuses further saves with
//     FailedPrecondition until a successful Load (as LevelDB stops writing
//     after a failed manifest write).
//
// Thread safety: Save and Load of one Checkpointer serialise on its mutex;
// tables keep serving pulls and pushes during Save (each shard is
// serialised under its lock; pushes that land after a shard was written go
// into the next delta). Load swaps tables' contents only after every file was
// read and verified; until then the tables keep their state. Both block for
// the file I/O, with no timeout of their own (local disk).
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "comm/status.h"
#include "comm/thread_pool.h"
#include "comm/file_system.h"
#include "ps/table/dense_table.h"
#include "ps/table/sparse_table.h"

namespace fleet::ps {

// The tables of one server. Pointers are not owned.
struct ServerTables {
  std::vector<SparseTable*> sparse;
  std::vector<DenseTable*> dense;
};

class Checkpointer {
 public:
  // fs and pool (may be nullptr: work on the calling thread) are not owned
  // and must outlive this. server_rank of num_servers names this server's
  // files; tables must hold the shards/range of that rank.
  // REQUIRES: fs != nullptr, 0 <= server_rank < num_servers (validate flags
  // first, e.g. with AssignShards, which returns InvalidArgument).
  Checkpointer(FileSystem* fs, int server_rank, int num_servers, ThreadPool* pool);

  // Saves every table. kBase starts a new chain, as the generation after the
  // newest complete one in dir (0 in an empty dir); older generations stay
  // on disk (delete old directories yourself). kDelta needs the tables'
  // previous save or load to have been in the same dir.
  // Errors: FailedPrecondition (a table is poisoned, or delta without a
  // base in dir), IOError (with the file) from the file system. See the
  // header comment for what each leaves behind.
  Status Save(const std::string& dir, SaveMode mode, const ServerTables& tables);

  // A base save that leaves the tables' save state alone: change marks stay
  // for the next delta, and the last save's directory is unchanged (a
  // server's recovery checkpoints, taken between the job's own saves). A
  // failed publish removes what it wrote and does not refuse later saves.
  // Errors as Save.
  Status SaveSnapshot(const std::string& dir, const ServerTables& tables);

  // Loads the newest complete checkpoint chain in dir (the last generation
  // for which every server's manifest exists, on top of its base), taking
  // the shards and dense elements this server's tables hold now, whatever
  // number of servers saved them.
  // Errors: NotFound (no checkpoint or a table absent from it), Corruption
  // naming the file (bad checksum, size, magic, missing file or manifest,
  // a shard not covered by the base), InvalidArgument (table config not
  // compatible: kind, dim, accessor, optimizer rule, shard_num), IOError.
  // On any error every table keeps its state.
  Status Load(const std::string& dir, const ServerTables& tables);

 private:
  Status SaveImpl(const std::string& dir, SaveMode mode, const ServerTables& tables, bool snapshot);
  // Removes the leftovers of this server's unfinished saves among `names`
  // (the listing of dir); see the top of this file. Failures to remove are
  // logged, not returned: the save can go on.
  void RemoveUnfinishedSaves(const std::string& dir, const std::vector<std::string>& names,
                             const ServerTables& tables);

  FileSystem* const fs_;
  const int rank_;
  const int num_servers_;
  ThreadPool* const pool_;
  std::mutex mu_;  // serialises Save and Load
};

// How ps/ writes checkpoint and recovery files (AtomicFileWriter): under
// "<name>.tmp", the names RemoveUnfinishedSaves looks for, and without a
// directory sync per file: the save syncs the directory once, after all of
// them and before the manifest is published.
inline constexpr AtomicWriteOptions kCheckpointFileWrite{
    .temp_name = AtomicWriteOptions::TempName::kPathDotTmp, .sync_dir = false};

}  // namespace fleet::ps
