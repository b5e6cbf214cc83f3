#include "ps/table/row_db.h"

#include <dirent.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <rocksdb/cache.h>
#include <rocksdb/convenience.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace fleet::ps {
namespace {

// Marks a folder as a FleetPS disk tier's: only such a folder is emptied.
constexpr const char* kMarker = "FLEETPS_DISK_TIER";
constexpr size_t kDiskKeyBytes = 12;

// (shard, key) as 12 big-endian bytes.
struct DiskKey {
  char bytes[kDiskKeyBytes];
  DiskKey(uint32_t shard, uint64_t key) {
    for (int i = 0; i < 4; ++i) bytes[i] = static_cast<char>(shard >> (24 - 8 * i));
    for (int i = 0; i < 8; ++i) bytes[4 + i] = static_cast<char>(key >> (56 - 8 * i));
  }
  rocksdb::Slice slice() const { return {bytes, kDiskKeyBytes}; }
};

uint64_t BigEndian(const char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

std::string Errno(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

// RocksDB's own files are opened by name: refuse a symbolic link planted
// in their place (see the header for what this leaves open).
class NoSymlinkFileSystem : public rocksdb::FileSystemWrapper {
 public:
  explicit NoSymlinkFileSystem(const std::shared_ptr<rocksdb::FileSystem>& base)
      : FileSystemWrapper(base) {}
  const char* Name() const override { return "FleetNoSymlinkFileSystem"; }

  rocksdb::IOStatus NewSequentialFile(const std::string& f, const rocksdb::FileOptions& o,
                                      std::unique_ptr<rocksdb::FSSequentialFile>* r,
                                      rocksdb::IODebugContext* d) override {
    return Unlinked(f, [&] { return FileSystemWrapper::NewSequentialFile(f, o, r, d); });
  }
  rocksdb::IOStatus NewRandomAccessFile(const std::string& f, const rocksdb::FileOptions& o,
                                        std::unique_ptr<rocksdb::FSRandomAccessFile>* r,
                                        rocksdb::IODebugContext* d) override {
    return Unlinked(f, [&] { return FileSystemWrapper::NewRandomAccessFile(f, o, r, d); });
  }
  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* d) override {
    return Unlinked(f, [&] { return FileSystemWrapper::NewWritableFile(f, o, r, d); });
  }
  rocksdb::IOStatus ReopenWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                       std::unique_ptr<rocksdb::FSWritableFile>* r,
                                       rocksdb::IODebugContext* d) override {
    return Unlinked(f, [&] { return FileSystemWrapper::ReopenWritableFile(f, o, r, d); });
  }
  rocksdb::IOStatus ReuseWritableFile(const std::string& f, const std::string& old,
                                      const rocksdb::FileOptions& o,
                                      std::unique_ptr<rocksdb::FSWritableFile>* r,
                                      rocksdb::IODebugContext* d) override {
    if (IsLink(old)) return Refused(old);
    return Unlinked(f, [&] { return FileSystemWrapper::ReuseWritableFile(f, old, o, r, d); });
  }
  rocksdb::IOStatus NewRandomRWFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSRandomRWFile>* r,
                                    rocksdb::IODebugContext* d) override {
    return Unlinked(f, [&] { return FileSystemWrapper::NewRandomRWFile(f, o, r, d); });
  }

 private:
  static bool IsLink(const std::string& path) {
    struct stat st;
    return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
  }
  static rocksdb::IOStatus Refused(const std::string& path) {
    return rocksdb::IOStatus::IOError("refusing to open a symbolic link in the disk tier", path);
  }
  // open() unless `path` is a symbolic link.
  template <typename Open>
  static rocksdb::IOStatus Unlinked(const std::string& path, Open open) {
    return IsLink(path) ? Refused(path) : open();
  }
};

// The folder `name` under `parent_fd`, made if missing (0700) and opened
// without following a link; `*created` when this call made it.
Result<int> OpenTierFolder(int parent_fd, const std::string& name, const std::string& path) {
  if (::mkdirat(parent_fd, name.c_str(), 0700) != 0 && errno != EEXIST)
    return Status::IOError(Errno("mkdir"), path);
  const int fd = ::openat(parent_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ELOOP || errno == ENOTDIR)
      return Status::FailedPrecondition(
          "the disk tier's folder is a symbolic link or not a directory; refused (remove it or "
          "choose another storage.path)",
          path);
    return Status::IOError(Errno("open"), path);
  }
  return fd;
}

// The entries of the folder, but "." and "..".
Result<std::vector<std::string>> ListFolder(int dir_fd, const std::string& path) {
  const int fd = ::dup(dir_fd);
  if (fd < 0) return Status::IOError(Errno("dup"), path);
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    ::close(fd);
    return Status::IOError(Errno("fdopendir"), path);
  }
  ::rewinddir(d);
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  return names;
}

}  // namespace

Result<std::shared_ptr<RowDb>> RowDb::Open(const std::string& path, int server_rank,
                                           size_t block_cache_bytes) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return Status::IOError(absl::StrCat("cannot create storage.path: ", ec.message()), path);
  // storage.path itself is the user's choice and may be a link; nothing
  // under it is followed.
  const int parent = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (parent < 0) return Status::IOError(Errno("open storage.path"), path);
  const std::string name = absl::StrCat("s", server_rank);
  const std::string dir = absl::StrCat(path, path.ends_with('/') ? "" : "/", name);
  Result<int> opened = OpenTierFolder(parent, name, dir);
  ::close(parent);
  if (!opened.ok()) return opened.status();
  const int dir_fd = *opened;
  auto fail = [&](Status s, int marker_fd) {
    if (marker_fd >= 0) ::close(marker_fd);
    ::close(dir_fd);
    return s;
  };

  Result<std::vector<std::string>> names = ListFolder(dir_fd, dir);
  if (!names.ok()) return fail(names.status(), -1);
  int marker = ::openat(dir_fd, kMarker, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (marker < 0 && errno == ENOENT) {
    if (!names->empty())
      return fail(Status::FailedPrecondition(
                      absl::StrCat("holds ", names->size(), " entries but no ", kMarker,
                                   " marker: not a folder FleetPS made, so it is not emptied; "
                                   "remove it or choose another storage.path"),
                      dir),
                  -1);
    marker = ::openat(dir_fd, kMarker, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  }
  if (marker < 0) return fail(Status::IOError(Errno("open marker"), dir), -1);
  if (::flock(marker, LOCK_EX | LOCK_NB) != 0) {
    return fail(Status::FailedPrecondition(
                    "the disk tier's folder is in use by another live process (a second server "
                    "of the same rank and storage.path?)",
                    dir),
                marker);
  }
  std::shared_ptr<RowDb> db(new RowDb(dir, dir_fd, marker));
  FLEET_RETURN_IF_ERROR(db->EmptyFolder());

  db->env_ = rocksdb::NewCompositeEnv(
      std::make_shared<NoSymlinkFileSystem>(rocksdb::FileSystem::Default()));
  db->block_cache_ = rocksdb::NewLRUCache(block_cache_bytes);
  rocksdb::Options options;
  options.env = db->env_.get();
  options.create_if_missing = true;
  options.error_if_exists = true;
  options.max_open_files = 512;
  options.max_background_jobs = 2;
  options.keep_log_file_num = 2;
  options.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  options.avoid_flush_during_shutdown = true;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, dir, &raw);
  if (!s.ok()) return Status::IOError(absl::StrCat("RocksDB open: ", s.ToString()), dir);
  db->db_.reset(raw);
  return db;
}

RowDb::RowDb(std::string dir, int dir_fd, int marker_fd)
    : dir_(std::move(dir)), dir_fd_(dir_fd), marker_fd_(marker_fd) {}

RowDb::~RowDb() {
  if (db_ != nullptr) {
    rocksdb::Status s = db_->Close();
    if (!s.ok()) LOG(WARNING) << "disk tier " << dir_ << ": close: " << s.ToString();
    db_.reset();
  }
  if (Status s = EmptyFolder(); !s.ok())
    LOG(WARNING) << "disk tier: could not remove its files: " << s.ToString();
  ::close(marker_fd_);  // releases the flock
  ::close(dir_fd_);
}

Status RowDb::EmptyFolder() {
  FLEET_ASSIGN_OR_RETURN(std::vector<std::string> names, ListFolder(dir_fd_, dir_));
  for (const std::string& n : names) {
    if (n == kMarker) continue;
    struct stat st;
    if (::fstatat(dir_fd_, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
      return Status::IOError(Errno("stat"), absl::StrCat(dir_, "/", n));
    if (S_ISDIR(st.st_mode))
      return Status::FailedPrecondition(
          "the disk tier's folder holds a subfolder FleetPS did not make; remove it by hand",
          absl::StrCat(dir_, "/", n));
    // A link is removed itself, never what it names.
    if (::unlinkat(dir_fd_, n.c_str(), 0) != 0 && errno != ENOENT)
      return Status::IOError(Errno("unlink"), absl::StrCat(dir_, "/", n));
  }
  return Status::OK();
}

void RowDb::ReserveBlockCache(size_t bytes) {
  if (block_cache_->GetCapacity() < bytes) block_cache_->SetCapacity(bytes);
}

Result<std::unique_ptr<RowColumn>> RowDb::NewColumn(uint32_t table_id, size_t write_buffer_bytes) {
  rocksdb::ColumnFamilyOptions cf;
  cf.write_buffer_size = write_buffer_bytes;
  cf.max_write_buffer_number = 2;
  cf.level_compaction_dynamic_level_bytes = true;
  // Most lookups are of rows not in the write buffer (they went down
  // earlier): a bloom filter over its keys skips the skip-list search.
  cf.memtable_prefix_bloom_size_ratio = 0.05;
  cf.memtable_whole_key_filtering = true;
  // Rows are floats that compress poorly; LZ4 still takes the keys' and
  // the flags' redundancy at little CPU. None when this build lacks it.
  cf.compression = rocksdb::kNoCompression;
  for (rocksdb::CompressionType t : rocksdb::GetSupportedCompressions()) {
    if (t == rocksdb::kLZ4Compression) cf.compression = t;
  }
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = block_cache_;
  // Each file's index and bloom filter stay in memory beside the block
  // cache (about 1.5 bytes per row on disk): in the cache, a small cache
  // evicted them and every lookup read and checksummed a filter block again
  // (a quarter of a disk-tier job's server time, measured).
  table.cache_index_and_filter_blocks = false;
  // A lookup of a key never written down (a new key) is answered by the
  // filter, without a read.
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  cf.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  std::string name;
  {
    std::lock_guard<std::mutex> l(mu_);
    name = absl::StrCat("t", table_id, ".", next_column_++);
  }
  rocksdb::ColumnFamilyHandle* handle = nullptr;
  rocksdb::Status s = db_->CreateColumnFamily(cf, name, &handle);
  if (!s.ok())
    return Status::IOError(absl::StrCat("RocksDB create column family ", name, ": ", s.ToString()),
                           dir_);
  return std::unique_ptr<RowColumn>(new RowColumn(this, handle));
}

// ---- RowBatch ----

void RowBatch::Put(uint32_t shard, uint64_t key, std::string_view value) {
  ops_.push_back({shard, key, true, values_.size(), value.size()});
  values_.append(value);
}

void RowBatch::Delete(uint32_t shard, uint64_t key) { ops_.push_back({shard, key, false, 0, 0}); }

// ---- RowColumn ----

RowColumn::~RowColumn() {
  rocksdb::Status s = db_->db_->DropColumnFamily(handle_);
  if (!s.ok())
    LOG(WARNING) << "disk tier " << db_->dir_ << ": drop column family: " << s.ToString();
  s = db_->db_->DestroyColumnFamilyHandle(handle_);
  if (!s.ok()) LOG(WARNING) << "disk tier " << db_->dir_ << ": " << s.ToString();
}

Status RowColumn::Check(const rocksdb::Status& s, std::string_view what) const {
  if (s.ok()) return Status::OK();
  return Status::IOError(absl::StrCat("disk tier ", std::string(what), ": ", s.ToString()),
                         db_->dir_);
}

Status RowColumn::Write(RowBatch* batch) {
  // In key order: the memtable's skip list then inserts each next to the
  // last (RocksDB keeps that position), about 3x cheaper than at random.
  // Stable, so a key written twice keeps its last write.
  std::stable_sort(batch->ops_.begin(), batch->ops_.end(),
                   [](const RowBatch::Op& a, const RowBatch::Op& b) {
                     return a.shard != b.shard ? a.shard < b.shard : a.key < b.key;
                   });
  rocksdb::WriteBatch b;
  for (const RowBatch::Op& op : batch->ops_) {
    const DiskKey key(op.shard, op.key);
    rocksdb::Status s =
        op.put ? b.Put(handle_, key.slice(),
                       rocksdb::Slice(batch->values_.data() + op.value_at, op.value_size))
               : b.Delete(handle_, key.slice());
    FLEET_RETURN_IF_ERROR(Check(s, "batch"));
  }
  rocksdb::WriteOptions w;
  w.disableWAL = true;
  return Check(db_->db_->Write(w, &b), "write");
}

Status RowColumn::MultiGet(std::span<const std::pair<uint32_t, uint64_t>> keys,
                           std::vector<std::string>* values, std::vector<uint8_t>* found) const {
  const size_t n = keys.size();
  std::vector<DiskKey> disk_keys;
  disk_keys.reserve(n);
  std::vector<rocksdb::Slice> slices;
  slices.reserve(n);
  for (const auto& [shard, key] : keys) disk_keys.emplace_back(shard, key);
  for (const DiskKey& k : disk_keys) slices.push_back(k.slice());
  std::vector<rocksdb::PinnableSlice> got(n);
  std::vector<rocksdb::Status> statuses(n);
  db_->db_->MultiGet(rocksdb::ReadOptions(), handle_, n, slices.data(), got.data(),
                     statuses.data());
  values->resize(n);
  found->assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    if (statuses[i].IsNotFound()) continue;
    FLEET_RETURN_IF_ERROR(Check(statuses[i], "read"));
    (*values)[i].assign(got[i].data(), got[i].size());
    (*found)[i] = 1;
  }
  return Status::OK();
}

Result<bool> RowColumn::Get(uint32_t shard, uint64_t key, std::string* value) const {
  rocksdb::Status s =
      db_->db_->Get(rocksdb::ReadOptions(), handle_, DiskKey(shard, key).slice(), value);
  if (s.IsNotFound()) return false;
  FLEET_RETURN_IF_ERROR(Check(s, "read"));
  return true;
}

Status RowColumn::ForEach(
    const std::function<Status(uint32_t, uint64_t, std::string_view)>& fn) const {
  std::unique_ptr<rocksdb::Iterator> it(db_->db_->NewIterator(rocksdb::ReadOptions(), handle_));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    const rocksdb::Slice k = it->key();
    if (k.size() != kDiskKeyBytes)
      return Status::Corruption("disk tier holds a key of the wrong size", db_->dir_);
    FLEET_RETURN_IF_ERROR(fn(static_cast<uint32_t>(BigEndian(k.data(), 4)),
                             BigEndian(k.data() + 4, 8),
                             std::string_view(it->value().data(), it->value().size())));
  }
  return Check(it->status(), "scan");
}

std::unique_ptr<RowScan> RowColumn::NewScan() const {
  return std::unique_ptr<RowScan>(new RowScan(this, db_->db_->GetSnapshot()));
}

Status RowColumn::Compact() {
  FLEET_RETURN_IF_ERROR(Check(db_->db_->Flush(rocksdb::FlushOptions(), handle_), "flush"));
  return Check(db_->db_->CompactRange(rocksdb::CompactRangeOptions(), handle_, nullptr, nullptr),
               "compact");
}

uint64_t RowColumn::ApproximateBytes() const {
  uint64_t files = 0, memtables = 0;
  db_->db_->GetIntProperty(handle_, "rocksdb.total-sst-files-size", &files);
  db_->db_->GetIntProperty(handle_, "rocksdb.cur-size-all-mem-tables", &memtables);
  return files + memtables;
}

// ---- RowScan ----

RowScan::RowScan(const RowColumn* column, const rocksdb::Snapshot* snapshot)
    : column_(column), snapshot_(snapshot) {
  rocksdb::ReadOptions r;
  r.snapshot = snapshot_;
  it_.reset(column_->db_->db_->NewIterator(r, column_->handle_));
}

RowScan::~RowScan() {
  it_.reset();
  column_->db_->db_->ReleaseSnapshot(snapshot_);
}

void RowScan::Seek(uint32_t shard) {
  shard_ = shard;
  it_->Seek(DiskKey(shard, 0).slice());
}

bool RowScan::Valid() const {
  if (!it_->Valid()) return false;
  const rocksdb::Slice k = it_->key();
  return k.size() == kDiskKeyBytes && BigEndian(k.data(), 4) == shard_;
}

uint64_t RowScan::key() const { return BigEndian(it_->key().data() + 4, 8); }

std::string_view RowScan::value() const {
  return std::string_view(it_->value().data(), it_->value().size());
}

void RowScan::Next() { it_->Next(); }

Result<bool> RowScan::Get(uint32_t shard, uint64_t key, std::string* value) const {
  rocksdb::ReadOptions r;
  r.snapshot = snapshot_;
  rocksdb::Status s =
      column_->db_->db_->Get(r, column_->handle_, DiskKey(shard, key).slice(), value);
  if (s.IsNotFound()) return false;
  FLEET_RETURN_IF_ERROR(column_->Check(s, "read"));
  return true;
}

Status RowScan::status() const { return column_->Check(it_->status(), "scan"); }

// ---- RowDbSet ----

Result<std::shared_ptr<RowDb>> RowDbSet::Get(const StorageConfig& config) {
  std::lock_guard<std::mutex> l(mu_);
  const size_t cache = size_t{config.block_cache_mb} << 20;
  auto it = dbs_.find(config.path);
  if (it != dbs_.end()) {
    it->second->ReserveBlockCache(cache);
    return it->second;
  }
  FLEET_ASSIGN_OR_RETURN(std::shared_ptr<RowDb> db, RowDb::Open(config.path, rank_, cache));
  dbs_[config.path] = db;
  return db;
}

}  // namespace fleet::ps
