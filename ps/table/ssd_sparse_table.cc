#include "ps/table/ssd_sparse_table.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "comm/byte_io.h"
#include "ps/table/accessor.h"

namespace fleet::ps {
namespace {

// A disk row's value (little-endian): u32 pass count when it went down,
// u8 has_ext, f32 row[row_floats], f32 ext[ext_floats] when has_ext.
constexpr size_t kValueHeaderBytes = sizeof(uint32_t) + 1;
// Shrink judges the rows on disk this many at a time.
constexpr size_t kShrinkChunk = 8192;

}  // namespace

Result<std::unique_ptr<SsdSparseTable>> SsdSparseTable::Create(const TableConfig& config,
                                                               ShardRange owned, ThreadPool* pool,
                                                               std::shared_ptr<RowDb> db) {
  FLEET_RETURN_IF_ERROR(CheckCreate(config, owned));
  if (config.storage.kind != StorageKind::kSsd || db == nullptr)
    return Status::InvalidArgument("SsdSparseTable needs storage.kind ssd and a database",
                                   absl::StrCat("table ", config.id));
  std::unique_ptr<SsdSparseTable> t(new SsdSparseTable(
      config, owned, pool, std::shared_ptr<const Accessor>(MakeAccessor(config)), std::move(db)));
  absl::WriterMutexLock l(&t->tier_mu_);
  FLEET_RETURN_IF_ERROR(t->EnsureColumn());
  return t;
}

SsdSparseTable::SsdSparseTable(const TableConfig& config, ShardRange owned, ThreadPool* pool,
                               std::shared_ptr<const Accessor> accessor, std::shared_ptr<RowDb> db)
    : SparseTable(config, owned, pool, std::move(accessor)),
      db_(std::move(db)),
      ctr_(dynamic_cast<const CtrAccessor*>(&this->accessor())),
      row_floats_(this->accessor().row_floats()),
      ext_floats_(this->accessor().ext_floats()),
      cache_rows_(config.storage.cache_rows) {
  CHECK(ctr_ != nullptr) << "storage ssd needs the CTR accessor (ValidateTableConfig)";
  absl::WriterMutexLock l(&tier_mu_);
  loaded_rows_.assign(owned.size(), 0);
}

SsdSparseTable::~SsdSparseTable() = default;

Status SsdSparseTable::EnsureColumn() {
  if (column_ != nullptr) return Status::OK();
  FLEET_ASSIGN_OR_RETURN(
      column_, db_->NewColumn(config().id, size_t{config().storage.write_buffer_mb} << 20));
  return Status::OK();
}

uint32_t SsdSparseTable::Coldness(std::span<const float> row) const {
  const float unseen = std::clamp(row[CtrAccessor::kUnseen], 0.0f, 255.0f);
  const float score = ctr_->Score(row);
  uint32_t bits;
  std::memcpy(&bits, &score, sizeof bits);
  // Float bits made to sort like the floats, as unsigned integers.
  const uint32_t ordered = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return (static_cast<uint32_t>(unseen) << 24) | (0xFFFFFFu - (ordered >> 8));
}

std::string SsdSparseTable::EncodeRow(std::span<const float> row,
                                      std::span<const float> ext) const {
  std::string v;
  v.reserve(kValueHeaderBytes + (row.size() + ext.size()) * sizeof(float));
  ByteWriter w(&v);
  w.Put<uint32_t>(pass_);
  w.Put<uint8_t>(ext.empty() ? 0 : 1);
  w.PutFloats(row);
  if (!ext.empty()) w.PutFloats(ext);
  return v;
}

Status SsdSparseTable::DecodeAged(uint64_t key, std::string_view value, std::span<float> row,
                                  std::span<float> ext, bool* has_ext) const {
  ByteReader r(value);
  uint32_t stamp = 0;
  uint8_t flag = 0;
  if (!r.Get(&stamp) || !r.Get(&flag) || flag > 1 || (flag == 1 && ext_floats_ == 0) ||
      !r.GetFloats(row) || (flag == 1 && !r.GetFloats(ext)) || r.remaining() != 0 ||
      stamp > pass_) {
    return Status::Corruption(absl::StrCat("disk tier row of key ", key, " is malformed"),
                              absl::StrCat("table ", config().id, " in ", db_->dir()));
  }
  *has_ext = flag == 1;
  // The passes it spent on disk: EndPass is a fixed function of the row.
  for (uint32_t p = stamp; p < pass_; ++p) accessor().EndPass(row);
  return Status::OK();
}

Status SsdSparseTable::BringUp(std::span<const uint64_t> keys, size_t values_size, size_t width) {
  if (disk_rows_.load(std::memory_order_acquire) == 0) return Status::OK();
  std::vector<uint32_t> absent;
  FLEET_RETURN_IF_ERROR(FindAbsent(keys, values_size, width, &absent));
  if (absent.empty()) return Status::OK();
  std::vector<std::pair<uint32_t, uint64_t>> wanted;
  wanted.reserve(absent.size());
  for (uint32_t i : absent) wanted.emplace_back(sharder()(keys[i]), keys[i]);
  std::vector<std::string> values;
  std::vector<uint8_t> found;
  FLEET_RETURN_IF_ERROR(column_->MultiGet(wanted, &values, &found));
  const size_t n = std::count(found.begin(), found.end(), 1);
  if (n == 0) return Status::OK();
  // Rows decoded into two flat buffers, then handed up together.
  std::vector<float> rows(n * row_floats_), exts(n * ext_floats_);
  std::vector<RowRef> refs;
  std::vector<size_t> from;  // index into wanted
  refs.reserve(n);
  for (size_t i = 0; i < wanted.size(); ++i) {
    if (!found[i]) continue;
    const size_t j = refs.size();
    std::span<float> row(rows.data() + j * row_floats_, row_floats_);
    std::span<float> ext(exts.data() + j * ext_floats_, ext_floats_);
    bool has_ext = false;
    FLEET_RETURN_IF_ERROR(DecodeAged(wanted[i].second, values[i], row, ext, &has_ext));
    refs.push_back({wanted[i].second, row, has_ext ? ext : std::span<float>(),
                    /*has_copy=*/true, /*changed=*/false});
    from.push_back(i);
  }
  // The disk keeps its copies (a checkpoint running meanwhile, disk view
  // then memory, sees each row in one place at least).
  std::vector<uint8_t> inserted;
  FLEET_RETURN_IF_ERROR(InsertAbsentRows(refs, &inserted));
  uint64_t up = 0, up_ext = 0;
  for (size_t j = 0; j < refs.size(); ++j) {
    if (!inserted[j]) continue;  // another request brought it up first
    ++up;
    if (!refs[j].ext.empty()) ++up_ext;
  }
  disk_rows_.fetch_sub(up, std::memory_order_acq_rel);
  disk_ext_rows_.fetch_sub(up_ext, std::memory_order_relaxed);
  stale_copies_.fetch_add(up, std::memory_order_relaxed);
  rows_read_.fetch_add(up, std::memory_order_relaxed);
  return Status::OK();
}

void SsdSparseTable::KeepMemoryBound() {
  if (MemoryRows() <= cache_rows_) return;
  // One request moves rows down; the others go on (the bound is exceeded
  // by what they add meanwhile, at most their own new keys).
  if (moving_down_.exchange(true, std::memory_order_acq_rel)) return;
  {
    absl::WriterMutexLock l(&tier_mu_);
    const uint64_t rows = MemoryRows();
    // Down to 9/10 of the bound, so the ranking pass is paid once per
    // tenth of the cache, not once per request.
    const uint64_t target = cache_rows_ - cache_rows_ / 10;
    if (rows > cache_rows_) {
      if (Status s = MoveColdest(rows - target); !s.ok()) {
        LOG_EVERY_N(ERROR, 100) << "table " << config().id << ": moving rows to disk failed, "
                                << rows << " rows stay in memory (bound " << cache_rows_
                                << "): " << s.ToString();
      }
    }
  }
  moving_down_.store(false, std::memory_order_release);
}

namespace {

// Runs fn(local) for every local shard, on the pool when there is one.
void ForEachLocal(ThreadPool* pool, size_t count, const std::function<void(size_t)>& fn) {
  if (pool == nullptr) {
    for (size_t i = 0; i < count; ++i) fn(i);
  } else {
    pool->ParallelFor(count, fn);
  }
}

}  // namespace

Status SsdSparseTable::MoveColdest(uint64_t count) {
  const size_t locals = local_shard_count();
  std::vector<std::vector<uint32_t>> per(locals);
  ForEachLocal(pool(), locals, [&](size_t local) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    ForEachRowIn(local, [&](const RowRef& r) { per[local].push_back(Coldness(r.row)); });
  });
  std::vector<uint32_t> all;
  for (const auto& p : per) all.insert(all.end(), p.begin(), p.end());
  per = {};
  if (all.empty() || count == 0) return Status::OK();
  count = std::min<uint64_t>(count, all.size());
  // The count-th coldest: rows colder than it go, and of those as cold as
  // it as many as make up the count.
  std::nth_element(all.begin(), all.begin() + (count - 1), all.end(), std::greater<uint32_t>());
  const uint32_t threshold = all[count - 1];
  const uint64_t colder =
      std::count_if(all.begin(), all.end(), [&](uint32_t c) { return c > threshold; });
  all = {};
  std::atomic<int64_t> ties(static_cast<int64_t>(count - colder));
  return MoveDown([&](std::span<const float> row) {
           const uint32_t c = Coldness(row);
           return c > threshold || (c == threshold && ties.fetch_sub(1) > 0);
         })
      .status();
}

Result<uint64_t> SsdSparseTable::MoveDown(const RowPick& pick) {
  FLEET_RETURN_IF_ERROR(EnsureColumn());
  const size_t locals = local_shard_count();
  std::vector<Status> results(locals);
  std::atomic<uint64_t> moved{0}, moved_ext{0};
  std::atomic<uint64_t> copies_used{0};
  ForEachLocal(pool(), locals, [&](size_t local) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    RowBatch batch;
    // Rows written, kept to put back if the write fails; rows whose copy
    // on disk is current need no write.
    struct Written {
      uint64_t key;
      std::string value;
      bool had_copy;
    };
    std::vector<Written> written;
    uint64_t rows = 0, ext = 0, copies = 0, unchanged = 0;
    ExtractRows(local, pick, [&](const RowRef& r) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      ++rows;
      if (!r.ext.empty()) ++ext;
      if (r.has_copy) ++copies;
      if (r.has_copy && !r.changed) {
        ++unchanged;
        return;
      }
      std::string v = EncodeRow(r.row, r.ext);
      batch.Put(sharder()(r.key), r.key, v);
      written.push_back({r.key, std::move(v), r.has_copy});
    });
    Status s = written.empty() ? Status::OK() : column_->Write(&batch);
    if (s.ok()) {
      moved += rows;
      moved_ext += ext;
      copies_used += copies;
      return;
    }
    results[local] = s;
    // The unchanged rows are safe on disk; the others come back up.
    moved += unchanged;
    copies_used += unchanged;
    std::vector<float> row(row_floats_), exts(ext_floats_);
    std::vector<uint8_t> inserted;
    for (const Written& w : written) {
      bool has_ext = false;
      Status d = DecodeAged(w.key, w.value, row, exts, &has_ext);
      CHECK(d.ok()) << d.ToString();  // encoded above, at this pass
      if (has_ext) ext -= 1;
      const RowRef back{w.key, row, has_ext ? std::span<const float>(exts) : std::span<float>(),
                        w.had_copy, /*changed=*/true};
      Status i = InsertAbsentRows({&back, 1}, &inserted);
      if (!i.ok()) {
        LOG(ERROR) << "table " << config().id << ": row " << w.key << " lost: " << i.ToString();
      }
    }
    moved_ext += ext;
  });
  disk_rows_.fetch_add(moved.load(), std::memory_order_acq_rel);
  disk_ext_rows_.fetch_add(moved_ext.load(), std::memory_order_relaxed);
  stale_copies_.fetch_sub(copies_used.load(), std::memory_order_relaxed);
  for (Status& s : results) FLEET_RETURN_IF_ERROR(s);
  return moved.load();
}

Status SsdSparseTable::Serve(std::span<const uint64_t> keys, size_t values_size, size_t width,
                             const std::function<Status()>& memory_op) {
  Status s;
  {
    absl::ReaderMutexLock l(&tier_mu_);
    FLEET_RETURN_IF_ERROR(BringUp(keys, values_size, width));
    s = memory_op();
  }
  KeepMemoryBound();
  return s;
}

Status SsdSparseTable::Pull(std::span<const uint64_t> keys, std::span<float> values) {
  return Serve(keys, values.size(), pull_dim(), [&] { return SparseTable::Pull(keys, values); });
}

Status SsdSparseTable::PushGrad(std::span<const uint64_t> keys, std::span<const float> grads,
                                std::span<const float> shows, std::span<const float> clicks) {
  return Serve(keys, grads.size(), push_dim(),
               [&] { return SparseTable::PushGrad(keys, grads, shows, clicks); });
}

Status SsdSparseTable::PushDelta(std::span<const uint64_t> keys, std::span<const float> deltas,
                                 std::span<const float> shows, std::span<const float> clicks) {
  return Serve(keys, deltas.size(), push_dim(),
               [&] { return SparseTable::PushDelta(keys, deltas, shows, clicks); });
}

void SsdSparseTable::EndPass() {
  absl::WriterMutexLock l(&tier_mu_);
  SparseTable::EndPass();
  ++pass_;
  const float unseen = static_cast<float>(config().storage.evict_unseen_passes);
  Result<uint64_t> moved =
      MoveDown([&](std::span<const float> row) { return row[CtrAccessor::kUnseen] > unseen; });
  if (!moved.ok()) {
    LOG(ERROR) << "table " << config().id << ": moving unseen rows to disk at the end of pass "
               << pass_ << " failed (they stay in memory): " << moved.status().ToString();
  }
}

uint64_t SsdSparseTable::Shrink() {
  absl::WriterMutexLock l(&tier_mu_);
  const size_t locals = local_shard_count();
  struct Gone {
    std::vector<uint64_t> keys;
    RowBatch copies;  // the disk copies of deleted memory rows
  };
  std::vector<Gone> gone(locals);
  ForEachLocal(pool(), locals, [&](size_t local) {
    ExtractRows(
        local, [&](std::span<const float> row) { return ctr_->ShouldDelete(row); },
        [&](const RowRef& r) {
          gone[local].keys.push_back(r.key);
          if (r.has_copy) gone[local].copies.Delete(sharder()(r.key), r.key);
        });
  });
  ForgetAdmissionCounts();
  std::vector<uint64_t> deleted;
  Status s;
  for (Gone& g : gone) {
    deleted.insert(deleted.end(), g.keys.begin(), g.keys.end());
    if (g.copies.count() == 0) continue;
    stale_copies_.fetch_sub(g.copies.count());
    // A copy left behind would only be read if the key came back, and then
    // memory would hold the new row: logged, not fatal.
    if (Status w = column_->Write(&g.copies); !w.ok() && s.ok()) s = w;
  }

  if (column_ != nullptr && disk_rows_.load() > 0) {
    // Rows on disk only: the copies of rows in memory were judged above.
    struct Entry {
      uint32_t shard;
      uint64_t key;
      std::string value;
    };
    std::vector<Entry> chunk;
    std::vector<float> row(row_floats_), ext(ext_floats_);
    auto judge = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS -> Status {
      std::vector<uint64_t> keys;
      for (const Entry& e : chunk) keys.push_back(e.key);
      std::vector<uint32_t> absent;
      FLEET_RETURN_IF_ERROR(FindAbsent(keys, keys.size(), 1, &absent));
      RowBatch batch;
      std::vector<uint64_t> doomed;
      uint64_t doomed_ext = 0;
      for (uint32_t i : absent) {
        bool has_ext = false;
        FLEET_RETURN_IF_ERROR(DecodeAged(chunk[i].key, chunk[i].value, row, ext, &has_ext));
        if (!ctr_->ShouldDelete(row)) continue;
        batch.Delete(chunk[i].shard, chunk[i].key);
        doomed.push_back(chunk[i].key);
        if (has_ext) ++doomed_ext;
      }
      chunk.clear();
      if (doomed.empty()) return Status::OK();
      FLEET_RETURN_IF_ERROR(column_->Write(&batch));
      disk_rows_.fetch_sub(doomed.size());
      disk_ext_rows_.fetch_sub(doomed_ext);
      deleted.insert(deleted.end(), doomed.begin(), doomed.end());
      return Status::OK();
    };
    Status scan = column_->ForEach([&](uint32_t shard, uint64_t key, std::string_view value) {
      chunk.push_back({shard, key, std::string(value)});
      return chunk.size() >= kShrinkChunk ? judge() : Status::OK();
    });
    if (scan.ok() && !chunk.empty()) scan = judge();
    if (!scan.ok() && s.ok()) s = scan;
  }
  if (!s.ok()) {
    LOG(ERROR) << "table " << config().id
               << ": shrink of the rows on disk stopped: " << s.ToString();
  }
  absl::MutexLock dl(&deleted_mu_);
  deleted_.insert(deleted.begin(), deleted.end());
  return deleted.size();
}

SparseTableStats SsdSparseTable::Stats() const {
  SparseTableStats s = SparseTable::Stats();
  absl::ReaderMutexLock l(&tier_mu_);
  s.disk_rows = disk_rows_.load();
  s.rows += s.disk_rows;
  s.ext_rows += disk_ext_rows_.load();
  s.disk_bytes = column_ != nullptr ? column_->ApproximateBytes() : 0;
  s.disk_rows_read = rows_read_.load(std::memory_order_relaxed);
  return s;
}

bool SsdSparseTable::DebugRow(uint64_t key, std::vector<float>* row,
                              std::vector<float>* ext) const {
  absl::ReaderMutexLock l(&tier_mu_);
  if (SparseTable::DebugRow(key, row, ext)) return true;
  if (column_ == nullptr) return false;
  std::string value;
  Result<bool> got = column_->Get(sharder()(key), key, &value);
  if (!got.ok()) LOG(ERROR) << "table " << config().id << ": " << got.status().ToString();
  if (!got.ok() || !*got) return false;
  row->resize(row_floats_);
  ext->resize(ext_floats_);
  bool has_ext = false;
  Status s = DecodeAged(key, value, *row, *ext, &has_ext);
  if (!s.ok()) {
    LOG(ERROR) << s.ToString();
    return false;
  }
  if (!has_ext) ext->clear();
  return true;
}

Result<std::vector<ShardImage>> SsdSparseTable::SerializeLocalShard(size_t local, SaveMode mode) {
  absl::ReaderMutexLock l(&tier_mu_);
  CHECK_LT(local, local_shard_count());
  const ShardRange held = LocalShardRange(local);
  const uint32_t count = held.size();
  auto position = [&](uint32_t shard) { return shard - held.begin; };
  // The disk view first, memory second: a row a request moves up meanwhile
  // is then in the view, in memory, or both (memory wins).
  std::unique_ptr<RowScan> scan = column_ != nullptr ? column_->NewScan() : nullptr;
  struct MemoryRow {
    uint64_t key;
    size_t at;  // row index in the buffers
    bool has_ext;
  };
  std::vector<std::vector<MemoryRow>> memory(count);
  std::vector<float> rows, exts;
  size_t n = 0;
  ForEachRowIn(local, [&](const RowRef& r) {
    memory[position(sharder()(r.key))].push_back({r.key, n++, !r.ext.empty()});
    rows.insert(rows.end(), r.row.begin(), r.row.end());
    if (r.ext.empty()) {
      exts.resize(exts.size() + ext_floats_, 0.0f);
    } else {
      exts.insert(exts.end(), r.ext.begin(), r.ext.end());
    }
  });
  // The keys deleted since the last save, taken for this one (AbortSave
  // puts them back); written in a delta, left out of a base.
  std::vector<std::vector<uint64_t>> deleted(count);
  {
    absl::MutexLock dl(&deleted_mu_);
    for (auto it = deleted_.begin(); it != deleted_.end();) {
      const uint32_t shard = sharder()(*it);
      if (!held.contains(shard)) {
        ++it;
        continue;
      }
      deleted[position(shard)].push_back(*it);
      saving_deleted_.push_back(*it);
      deleted_.erase(it++);
    }
  }

  std::vector<ShardImage> images(count);
  std::vector<float> row(row_floats_), ext(ext_floats_);
  for (uint32_t p = 0; p < count; ++p) {
    std::vector<MemoryRow>& mem = memory[p];
    std::sort(mem.begin(), mem.end(),
              [](const MemoryRow& a, const MemoryRow& b) { return a.key < b.key; });
    ShardImage& im = images[p];
    im.shard = held.begin + p;
    ShardFileWriter w(&im.image,
                      {.table_id = config().id,
                       .shard = im.shard,
                       .shard_num = config().shard_num,
                       .partition = config().partition,
                       .row_floats = static_cast<uint32_t>(row_floats_),
                       .ext_floats = static_cast<uint32_t>(ext_floats_)},
                      mode);
    size_t i = 0;
    auto write_memory = [&](const MemoryRow& m) {
      w.AddRow(m.key, {rows.data() + m.at * row_floats_, row_floats_},
               m.has_ext ? std::span<const float>(exts.data() + m.at * ext_floats_, ext_floats_)
                         : std::span<const float>());
    };
    if (scan != nullptr) {
      for (scan->Seek(im.shard); scan->Valid(); scan->Next()) {
        const uint64_t key = scan->key();
        while (i < mem.size() && mem[i].key < key) write_memory(mem[i++]);
        if (i < mem.size() && mem[i].key == key) {
          write_memory(mem[i++]);
          continue;
        }
        bool has_ext = false;
        FLEET_RETURN_IF_ERROR(DecodeAged(key, scan->value(), row, ext, &has_ext));
        w.AddRow(key, row, has_ext ? std::span<const float>(ext) : std::span<const float>());
      }
      FLEET_RETURN_IF_ERROR(scan->status());
    }
    while (i < mem.size()) write_memory(mem[i++]);
    if (mode == SaveMode::kDelta) {
      std::sort(deleted[p].begin(), deleted[p].end());
      for (uint64_t key : deleted[p]) {
        // A key created again after its deletion is a row, not a deletion.
        if (std::binary_search(
                mem.begin(), mem.end(), MemoryRow{key, 0, false},
                [](const MemoryRow& a, const MemoryRow& b) { return a.key < b.key; }))
          continue;
        std::string value;
        if (scan != nullptr) {
          FLEET_ASSIGN_OR_RETURN(bool on_disk, scan->Get(im.shard, key, &value));
          if (on_disk) continue;
        }
        w.AddDeleted(key);
      }
    }
    im.info = w.Finish();
  }
  return images;
}

void SsdSparseTable::CommitSave() {
  absl::MutexLock l(&deleted_mu_);
  saving_deleted_.clear();
}

void SsdSparseTable::AbortSave() {
  absl::MutexLock l(&deleted_mu_);
  deleted_.insert(saving_deleted_.begin(), saving_deleted_.end());
  saving_deleted_.clear();
}

Status SsdSparseTable::ApplyShardFile(uint32_t shard, std::string_view image,
                                      std::string_view file) {
  const ShardRange owned = owned_shards();
  if (!owned.contains(shard))
    return Status::InvalidArgument(absl::StrCat("shard ", shard, " not held by this table"), file);
  // Parsed outside the exclusive lock (files of several shards are applied
  // in parallel), written under it.
  RowBatch batch;
  std::vector<std::pair<uint32_t, uint64_t>> keys;  // puts, then deletes
  std::vector<uint8_t> put_ext;
  size_t puts = 0;
  {
    absl::ReaderMutexLock l(&tier_mu_);
    bool first = true;
    uint64_t previous = 0;
    auto on_row = [&](uint64_t key, std::span<const float> row, std::span<const float> ext)
                      ABSL_NO_THREAD_SAFETY_ANALYSIS -> Status {
      // Files list each key once, ascending; the row counts rely on it.
      if (!first && key <= previous) return Status::Corruption("keys out of order");
      first = false;
      previous = key;
      batch.Put(shard, key, EncodeRow(row, ext));
      keys.emplace_back(shard, key);
      put_ext.push_back(ext.empty() ? 0 : 1);
      return Status::OK();
    };
    auto on_deleted = [&](uint64_t key) {
      batch.Delete(shard, key);
      keys.emplace_back(shard, key);
      return Status::OK();
    };
    FLEET_RETURN_IF_ERROR(ReadShardFile(image, file,
                                        {.table_id = config().id,
                                         .shard = shard,
                                         .shard_num = config().shard_num,
                                         .partition = config().partition,
                                         .row_floats = static_cast<uint32_t>(row_floats_),
                                         .ext_floats = static_cast<uint32_t>(ext_floats_)},
                                        on_row, on_deleted));
    puts = put_ext.size();
  }
  absl::WriterMutexLock l(&tier_mu_);
  FLEET_RETURN_IF_ERROR(EnsureColumn());
  int64_t rows = 0, ext_rows = 0;
  uint64_t& loaded = loaded_rows_[shard - owned.begin];
  if (loaded == 0) {
    // Nothing of this shard on disk yet: every row is new, deletions are
    // of nothing.
    rows = static_cast<int64_t>(puts);
    ext_rows = std::count(put_ext.begin(), put_ext.end(), 1);
  } else {
    // A delta over rows already applied: count what it replaces.
    std::vector<std::string> old;
    std::vector<uint8_t> found;
    FLEET_RETURN_IF_ERROR(column_->MultiGet(keys, &old, &found));
    for (size_t i = 0; i < keys.size(); ++i) {
      const bool old_ext = found[i] && old[i].size() > sizeof(uint32_t) && old[i][4] == 1;
      if (i < puts) {
        rows += found[i] ? 0 : 1;
        ext_rows += static_cast<int64_t>(put_ext[i]) - (old_ext ? 1 : 0);
      } else if (found[i]) {
        rows -= 1;
        ext_rows -= old_ext ? 1 : 0;
      }
    }
  }
  FLEET_RETURN_IF_ERROR(column_->Write(&batch));
  loaded += rows;
  disk_rows_.fetch_add(rows);
  disk_ext_rows_.fetch_add(ext_rows);
  return Status::OK();
}

std::unique_ptr<SparseTable> SsdSparseTable::NewEmptyLike() const {
  return std::unique_ptr<SparseTable>(
      new SsdSparseTable(config(), owned_shards(), pool(), shared_accessor(), db_));
}

void SsdSparseTable::SwapRows(SparseTable& staging) {
  auto* other = dynamic_cast<SsdSparseTable*>(&staging);
  CHECK(other != nullptr) << "SwapRows needs a table made by NewEmptyLike";
  absl::WriterMutexLock l(&tier_mu_);
  absl::WriterMutexLock ol(&other->tier_mu_);
  SparseTable::SwapRows(staging);
  std::swap(column_, other->column_);
  std::swap(pass_, other->pass_);
  std::swap(loaded_rows_, other->loaded_rows_);
  const uint64_t rows = disk_rows_.exchange(other->disk_rows_.load());
  other->disk_rows_.store(rows);
  const uint64_t ext = disk_ext_rows_.exchange(other->disk_ext_rows_.load());
  other->disk_ext_rows_.store(ext);
  const uint64_t copies = stale_copies_.exchange(other->stale_copies_.load());
  other->stale_copies_.store(copies);
  // The table now equals the checkpoint: nothing deleted since.
  absl::MutexLock dl(&deleted_mu_);
  deleted_.clear();
  saving_deleted_.clear();
}

Status SsdSparseTable::MoveAllToDisk() {
  absl::WriterMutexLock l(&tier_mu_);
  return MoveDown([](std::span<const float>) { return true; }).status();
}

Status SsdSparseTable::CompactDisk() {
  absl::WriterMutexLock l(&tier_mu_);
  return column_ != nullptr ? column_->Compact() : Status::OK();
}

Result<std::unique_ptr<SparseTable>> CreateSparseTable(const TableConfig& config, ShardRange owned,
                                                       ThreadPool* pool, RowDbSet* dbs) {
  if (config.storage.kind != StorageKind::kSsd) return SparseTable::Create(config, owned, pool);
  if (dbs == nullptr)
    return Status::InvalidArgument("storage.kind ssd needs the server's disk tier",
                                   absl::StrCat("table ", config.id));
  FLEET_ASSIGN_OR_RETURN(std::shared_ptr<RowDb> db, dbs->Get(config.storage));
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<SsdSparseTable> table,
                         SsdSparseTable::Create(config, owned, pool, std::move(db)));
  return std::unique_ptr<SparseTable>(std::move(table));
}

}  // namespace fleet::ps
