#include "ps/table/shard_file.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/byte_io.h"
#include "ps/table/partition.h"

namespace fleet::ps {
namespace {

constexpr std::string_view kShardMagic = "FPSSHARD";
constexpr uint32_t kShardFormatVersion = 1;
// Offset of num_rows in the header: magic, then six u32.
constexpr size_t kCountsOffset = 8 + 6 * sizeof(uint32_t);

}  // namespace

ShardFileWriter::ShardFileWriter(std::string* out, const ShardFileShape& shape, SaveMode mode)
    : out_(out), start_(out->size()), shape_(shape) {
  ByteWriter w(out_);
  w.PutBytes(kShardMagic);
  w.Put<uint32_t>(kShardFormatVersion);
  w.Put<uint32_t>(shape.table_id);
  w.Put<uint32_t>(shape.shard);
  w.Put<uint32_t>(mode == SaveMode::kBase ? 0 : 1);
  w.Put<uint32_t>(shape.row_floats);
  w.Put<uint32_t>(shape.ext_floats);
  w.Put<uint64_t>(0);  // rows and deleted: Finish writes them
  w.Put<uint64_t>(0);
}

void ShardFileWriter::AddRow(uint64_t key, std::span<const float> row, std::span<const float> ext) {
  ByteWriter w(out_);
  w.Put<uint64_t>(key);
  w.Put<uint8_t>(ext.empty() ? 0 : 1);
  w.PutFloats(row);
  if (!ext.empty()) w.PutFloats(ext);
  ++info_.rows;
}

void ShardFileWriter::AddDeleted(uint64_t key) {
  ByteWriter(out_).Put<uint64_t>(key);
  ++info_.deleted;
}

ShardFileInfo ShardFileWriter::Finish() {
  std::string counts;
  ByteWriter w(&counts);
  w.Put<uint64_t>(info_.rows);
  w.Put<uint64_t>(info_.deleted);
  out_->replace(start_ + kCountsOffset, counts.size(), counts);
  return info_;
}

Status ReadShardFile(
    std::string_view image, std::string_view file, const ShardFileShape& shape,
    const std::function<Status(uint64_t, std::span<const float>, std::span<const float>)>& on_row,
    const std::function<Status(uint64_t)>& on_deleted) {
  ByteReader r(image);
  auto bad = [&](const std::string& what) {
    return Status::Corruption(absl::StrCat(what, " at byte ", r.position()), file);
  };
  std::string_view magic;
  uint32_t version, table_id, shard, mode, row_floats, ext_floats;
  uint64_t num_rows, num_deleted;
  if (!r.GetBytes(kShardMagic.size(), &magic) || magic != kShardMagic)
    return bad("not a shard file (bad magic)");
  if (!r.Get(&version) || !r.Get(&table_id) || !r.Get(&shard) || !r.Get(&mode) ||
      !r.Get(&row_floats) || !r.Get(&ext_floats) || !r.Get(&num_rows) || !r.Get(&num_deleted))
    return bad("truncated shard header");
  if (version != kShardFormatVersion)
    return bad(absl::StrCat("unsupported shard format version ", version));
  if (table_id != shape.table_id)
    return bad(absl::StrCat("shard file of table ", table_id, ", expected ", shape.table_id));
  if (shard != shape.shard)
    return bad(absl::StrCat("shard file of shard ", shard, ", expected ", shape.shard));
  if (mode > 1) return bad(absl::StrCat("bad save mode ", mode));
  if (row_floats != shape.row_floats || ext_floats != shape.ext_floats)
    return bad(absl::StrCat("row width ", row_floats, "+", ext_floats, ", table has ",
                            shape.row_floats, "+", shape.ext_floats));
  std::vector<float> row(row_floats), ext(ext_floats);
  for (uint64_t n = 0; n < num_rows; ++n) {
    uint64_t key;
    uint8_t has_ext;
    if (!r.Get(&key) || !r.Get(&has_ext)) return bad(absl::StrCat("truncated row ", n));
    if (ShardOfKey(key, shape.shard_num, shape.partition) != shape.shard)
      return bad(absl::StrCat("key ", key, " does not belong to this shard"));
    if (has_ext > 1 || (has_ext && ext_floats == 0))
      return bad(absl::StrCat("bad extension flag of row ", n));
    if (!r.GetFloats(row) || (has_ext && !r.GetFloats(ext)))
      return bad(absl::StrCat("truncated row ", n));
    Status s = on_row(key, row, has_ext ? std::span<const float>(ext) : std::span<const float>());
    if (!s.ok()) return bad(absl::StrCat("row ", n, ": ", std::string(s.message())));
  }
  for (uint64_t n = 0; n < num_deleted; ++n) {
    uint64_t key;
    if (!r.Get(&key)) return bad(absl::StrCat("truncated deleted key ", n));
    // Checked like rows: a local shard also holds other global shards.
    if (ShardOfKey(key, shape.shard_num, shape.partition) != shape.shard)
      return bad(absl::StrCat("deleted key ", key, " does not belong to this shard"));
    Status s = on_deleted(key);
    if (!s.ok()) return bad(absl::StrCat("deleted key ", n, ": ", std::string(s.message())));
  }
  if (r.remaining() != 0) return bad(absl::StrCat(r.remaining(), " trailing bytes"));
  return Status::OK();
}

}  // namespace fleet::ps
