// The shard file: one global shard of a sparse table in a checkpoint, as
// written by SparseTable and SsdSparseTable and read back by either (so a
// checkpoint moves between memory and disk-tier tables).
//
// Layout (little-endian), version 1:
//   char[8] "FPSSHARD", u32 version, u32 table_id, u32 shard, u32 mode (0 base, 1 delta),
//   u32 row_floats, u32 ext_floats, u64 num_rows, u64 num_deleted,
//   num_rows x { u64 key, u8 has_ext, f32[row_floats], f32[ext_floats] if has_ext } in key order,
//   num_deleted x u64 key, ascending.
// Integrity (crc32, size) is recorded in the checkpoint manifest, not here.
//
// Thread safety: a writer is used by one thread; ReadShardFile is a pure
// function of its arguments.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "comm/status.h"
#include "ps/table/partition.h"
#include "ps/table/save_state.h"

namespace fleet::ps {

// Row counts of one shard file.
struct ShardFileInfo {
  uint64_t rows = 0;
  uint64_t deleted = 0;
};

// What a shard file must hold to belong where it is applied.
struct ShardFileShape {
  uint32_t table_id = 0;
  uint32_t shard = 0;      // the global shard
  uint32_t shard_num = 1;  // of the table: every key must map to `shard`
  Partition partition = Partition::kHash;  // ... under the table's partition
  uint32_t row_floats = 0;
  uint32_t ext_floats = 0;
};

// Appends one shard file to a string: rows first (ascending keys), then
// deleted keys (ascending), then Finish. The caller keeps the order.
class ShardFileWriter {
 public:
  // Writes the header into *out (not owned; must outlive the writer).
  ShardFileWriter(std::string* out, const ShardFileShape& shape, SaveMode mode);

  // ext: the row's extension (ext_floats floats), or empty for none.
  // REQUIRES: row.size() == row_floats, ext empty or ext_floats wide.
  void AddRow(uint64_t key, std::span<const float> row, std::span<const float> ext);
  void AddDeleted(uint64_t key);
  // Writes the counts into the header. Call once, last.
  ShardFileInfo Finish();

 private:
  std::string* const out_;
  const size_t start_;  // where this file's header begins in *out
  const ShardFileShape shape_;
  ShardFileInfo info_;
};

// Calls on_row for each row (ext empty when the row has none) and then
// on_deleted for each deleted key, in file order, after checking the header
// against `shape`. The spans are valid during the call only. A callback's
// error stops the read. Errors: Corruption naming `file` and the byte
// offset when the image is malformed (magic, version, table, shard, mode,
// widths, a key of another shard, a bad extension flag, truncation,
// trailing bytes) or when a callback failed (its message).
Status ReadShardFile(std::string_view image, std::string_view file, const ShardFileShape& shape,
                     const std::function<Status(uint64_t key, std::span<const float> row,
                                                std::span<const float> ext)>& on_row,
                     const std::function<Status(uint64_t key)>& on_deleted);

}  // namespace fleet::ps
