#include "ps/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/byte_io.h"
#include "comm/checksum.h"
#include "comm/yaml_config.h"

namespace fleet::ps {
namespace {

constexpr std::string_view kManifestMagic = "FPSMANIF";
constexpr uint32_t kManifestVersion = 1;
constexpr const char* kTmpSuffix = ".tmp";  // AtomicWriteOptions::TempName::kPathDotTmp
// The manifest is renamed last and the directory synced after it, so that
// a published checkpoint survives a crash.
constexpr AtomicWriteOptions kManifestWrite{.temp_name = AtomicWriteOptions::TempName::kPathDotTmp,
                                            .sync_dir = true};

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (!dir.empty() && dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

std::string ManifestName(uint32_t gen, int rank, int num_servers) {
  return absl::StrFormat("MANIFEST-g%06u-s%05d-of-%05d", gen, rank, num_servers);
}
std::string ShardFileName(uint32_t table, uint32_t gen, uint32_t shard) {
  return absl::StrFormat("t%u-g%06u-shard%05u.bin", table, gen, shard);
}
std::string DenseFileName(uint32_t table, uint32_t gen, int rank) {
  return absl::StrFormat("t%u-g%06u-dense-s%05d.bin", table, gen, rank);
}

struct ManifestId {
  uint32_t gen = 0;
  int rank = 0;
  int num_servers = 0;
};

std::optional<ManifestId> ParseManifestName(const std::string& name) {
  ManifestId id;
  int consumed = 0;
  if (std::sscanf(name.c_str(), "MANIFEST-g%u-s%d-of-%d%n", &id.gen, &id.rank, &id.num_servers, &consumed) != 3)
    return std::nullopt;
  if (static_cast<size_t>(consumed) != name.size()) return std::nullopt;  // e.g. a ".tmp"
  if (id.num_servers < 1 || id.rank < 0 || id.rank >= id.num_servers) return std::nullopt;
  return id;
}

// A data file's name: "t<table>-g<gen>-shard<part>.bin" (sparse) or
// "t<table>-g<gen>-dense-s<part>.bin" (dense, part = rank), perhaps + ".tmp".
struct DataFileId {
  uint32_t table = 0;
  uint32_t gen = 0;
  bool dense = false;
  uint32_t part = 0;
  bool tmp = false;
};

std::optional<DataFileId> ParseDataFileName(const std::string& name) {
  DataFileId id;
  int consumed = 0;
  if (std::sscanf(name.c_str(), "t%u-g%u-shard%u.bin%n", &id.table, &id.gen, &id.part, &consumed) != 3) {
    consumed = 0;
    if (std::sscanf(name.c_str(), "t%u-g%u-dense-s%u.bin%n", &id.table, &id.gen, &id.part, &consumed) != 3)
      return std::nullopt;
    id.dense = true;
  }
  if (consumed == 0) return std::nullopt;
  const std::string_view rest = std::string_view(name).substr(static_cast<size_t>(consumed));
  if (!rest.empty() && rest != kTmpSuffix) return std::nullopt;
  id.tmp = !rest.empty();
  return id;
}

// Manifests of one generation: the number of servers that saved it and the
// manifest name of each rank present.
struct Generation {
  int num_servers = 0;
  std::map<int, std::string> by_rank;
  bool complete() const { return static_cast<int>(by_rank.size()) == num_servers; }
};
using Generations = std::map<uint32_t, Generation>;

Result<Generations> GroupManifests(const std::string& dir, const std::vector<std::string>& names) {
  Generations groups;
  for (const std::string& n : names) {
    std::optional<ManifestId> id = ParseManifestName(n);
    if (!id) continue;
    Generation& g = groups[id->gen];
    if (g.num_servers != 0 && g.num_servers != id->num_servers)
      return Status::Corruption(absl::StrCat("generation ", id->gen, " has manifests of ", g.num_servers, " and of ",
                                             id->num_servers, " servers"),
                                JoinPath(dir, n));
    g.num_servers = id->num_servers;
    g.by_rank[id->rank] = n;
  }
  return groups;
}

// The newest generation every server finished. Newer partial ones are saves
// that failed (or are still running) on some server and are ignored.
std::optional<uint32_t> NewestComplete(const Generations& groups) {
  for (auto it = groups.rbegin(); it != groups.rend(); ++it)
    if (it->second.complete()) return it->first;
  return std::nullopt;
}

// ---- Manifest ----

struct ManifestFile {
  std::string name;
  uint32_t shard = 0;               // sparse: global shard
  uint64_t begin = 0, end = 0;      // dense: element range
  uint64_t rows = 0;                // sparse: rows written
  uint64_t deleted = 0;             // sparse delta: deleted keys written
  uint64_t bytes = 0;
  uint32_t crc = 0;
};

struct ManifestTable {
  TableConfig config;
  std::vector<ManifestFile> files;
};

struct Manifest {
  uint32_t generation = 0;
  SaveMode mode = SaveMode::kBase;
  uint32_t rank = 0;
  uint32_t num_servers = 0;
  std::vector<ManifestTable> tables;
  std::string file;  // where it was read from (for messages)

  const ManifestTable* Find(uint32_t table_id) const {
    for (const ManifestTable& t : tables)
      if (t.config.id == table_id) return &t;
    return nullptr;
  }
};

// Layout (little-endian): "FPSMANIF", u32 version, u32 generation, u32 mode,
// u32 rank, u32 num_servers, u32 num_tables, then per table: string config
// (YAML), u32 num_files, per file: string name, u32 shard, u64 begin, u64 end,
// u64 rows, u64 deleted, u64 bytes, u32 crc32; finally u32 crc32 of all the
// bytes before it.
std::string EncodeManifest(const Manifest& m) {
  std::string out;
  ByteWriter w(&out);
  w.PutBytes(kManifestMagic);
  w.Put<uint32_t>(kManifestVersion);
  w.Put<uint32_t>(m.generation);
  w.Put<uint32_t>(m.mode == SaveMode::kBase ? 0 : 1);
  w.Put<uint32_t>(m.rank);
  w.Put<uint32_t>(m.num_servers);
  w.Put<uint32_t>(static_cast<uint32_t>(m.tables.size()));
  for (const ManifestTable& t : m.tables) {
    w.PutString(TableConfigToYaml(t.config));
    w.Put<uint32_t>(static_cast<uint32_t>(t.files.size()));
    for (const ManifestFile& f : t.files) {
      w.PutString(f.name);
      w.Put<uint32_t>(f.shard);
      w.Put<uint64_t>(f.begin);
      w.Put<uint64_t>(f.end);
      w.Put<uint64_t>(f.rows);
      w.Put<uint64_t>(f.deleted);
      w.Put<uint64_t>(f.bytes);
      w.Put<uint32_t>(f.crc);
    }
  }
  w.Put<uint32_t>(Crc32(out));
  return out;
}

Result<Manifest> DecodeManifest(std::string_view data, const std::string& file) {
  auto bad = [&](const std::string& what) { return Status::Corruption(absl::StrCat("manifest ", what), file); };
  if (data.size() < kManifestMagic.size() + 4) return bad("truncated");
  uint32_t stored_crc;
  std::memcpy(&stored_crc, data.data() + data.size() - 4, 4);
  const std::string_view body = data.substr(0, data.size() - 4);
  ByteReader r(body);
  std::string_view magic;
  if (!r.GetBytes(kManifestMagic.size(), &magic) || magic != kManifestMagic) return bad("has a bad magic number");
  if (Crc32(body) != stored_crc) return bad("checksum mismatch");
  Manifest m;
  m.file = file;
  uint32_t version, mode, num_tables;
  if (!r.Get(&version)) return bad("truncated");
  if (version != kManifestVersion) return bad(absl::StrCat("has unsupported format version ", version));
  if (!r.Get(&m.generation) || !r.Get(&mode) || !r.Get(&m.rank) || !r.Get(&m.num_servers) || !r.Get(&num_tables))
    return bad("truncated");
  if (mode > 1) return bad(absl::StrCat("has bad save mode ", mode));
  m.mode = mode == 0 ? SaveMode::kBase : SaveMode::kDelta;
  for (uint32_t t = 0; t < num_tables; ++t) {
    std::string yaml;
    uint32_t num_files;
    if (!r.GetString(&yaml) || !r.Get(&num_files)) return bad("truncated");
    ManifestTable mt;
    Result<YAML::Node> table_yaml = ParseYaml(yaml, "table config");
    if (!table_yaml.ok()) return bad(absl::StrCat("has unparsable ", table_yaml.status().message()));
    try {
      Result<TableConfig> config = ParseTableConfig(*table_yaml);
      if (!config.ok()) return bad(absl::StrCat("has a bad table config: ", config.status().message()));
      mt.config = std::move(config).value();
    } catch (const YAML::Exception& e) {
      return bad(absl::StrCat("has unparsable table config: ", e.what()));
    }
    for (uint32_t i = 0; i < num_files; ++i) {
      ManifestFile f;
      if (!r.GetString(&f.name) || !r.Get(&f.shard) || !r.Get(&f.begin) || !r.Get(&f.end) || !r.Get(&f.rows) ||
          !r.Get(&f.deleted) || !r.Get(&f.bytes) || !r.Get(&f.crc))
        return bad("truncated");
      if (f.name.empty() || f.name.find('/') != std::string::npos)
        return bad(absl::StrCat("names a bad file '", f.name, "'"));
      mt.files.push_back(std::move(f));
    }
    m.tables.push_back(std::move(mt));
  }
  if (r.remaining() != 0) return bad("has trailing bytes");
  return m;
}

// Reads a file listed in a manifest and checks its size and crc.
Result<std::string> ReadVerified(FileSystem* fs, const std::string& dir, const ManifestFile& f) {
  const std::string path = JoinPath(dir, f.name);
  Result<std::string> data = fs->ReadFile(path);
  if (!data.ok()) {
    if (data.status().IsNotFound()) return Status::Corruption("checkpoint file listed in the manifest is missing", path);
    return data.status();
  }
  if (data->size() != f.bytes)
    return Status::Corruption(absl::StrCat("size ", data->size(), " differs from the manifest's ", f.bytes), path);
  if (Crc32(*data) != f.crc) return Status::Corruption("checksum mismatch", path);
  return std::move(data).value();
}

// Runs fn(i) for i in [0, n) on the pool (or inline) and returns the first
// error by index, so the reported error does not depend on thread timing.
Status ParallelStatus(ThreadPool* pool, size_t n, const std::function<Status(size_t)>& fn) {
  std::vector<Status> results(n);
  auto run = [&](size_t i) { results[i] = fn(i); };
  if (pool == nullptr) {
    for (size_t i = 0; i < n; ++i) run(i);
  } else {
    pool->ParallelFor(n, run);
  }
  for (Status& s : results)
    if (!s.ok()) return s;
  return Status::OK();
}

}  // namespace

Checkpointer::Checkpointer(FileSystem* fs, int server_rank, int num_servers, ThreadPool* pool)
    : fs_(fs), rank_(server_rank), num_servers_(num_servers), pool_(pool) {
  CHECK(fs_ != nullptr);
  CHECK(num_servers_ >= 1 && rank_ >= 0 && rank_ < num_servers_) << rank_ << " of " << num_servers_;
}

Status Checkpointer::Save(const std::string& dir, SaveMode mode, const ServerTables& tables) {
  return SaveImpl(dir, mode, tables, /*snapshot=*/false);
}

Status Checkpointer::SaveSnapshot(const std::string& dir, const ServerTables& tables) {
  return SaveImpl(dir, SaveMode::kBase, tables, /*snapshot=*/true);
}

Status Checkpointer::SaveImpl(const std::string& dir, SaveMode mode, const ServerTables& tables,
                              bool snapshot) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SaveState*> states;
  for (SparseTable* t : tables.sparse) states.push_back(&t->save_state());
  for (DenseTable* t : tables.dense) states.push_back(&t->save_state());
  for (SaveState* s : states) FLEET_RETURN_IF_ERROR(s->CheckWritable());

  // Pick the generation.
  uint32_t gen = 0;
  if (mode == SaveMode::kDelta) {
    for (SaveState* s : states) {
      std::optional<SaveState::Last> last = s->last();
      if (!last || last->dir != dir)
        return Status::FailedPrecondition("delta save needs an earlier save or load of every table in the same directory",
                                          dir);
      if (s == states.front()) gen = last->generation + 1;
      if (last->generation + 1 != gen)
        return Status::FailedPrecondition("tables were last saved at different generations", dir);
    }
  }
  FLEET_RETURN_IF_ERROR(fs_->CreateDir(dir));
  FLEET_ASSIGN_OR_RETURN(std::vector<std::string> names, fs_->ListDir(dir));
  RemoveUnfinishedSaves(dir, names, tables);
  if (mode == SaveMode::kBase) {
    // A base goes after the newest complete generation. Servers of one job
    // save at about the same time; one that finished first has made a
    // generation that is still incomplete for the others, who therefore
    // pick the same number.
    FLEET_ASSIGN_OR_RETURN(Generations groups, GroupManifests(dir, names));
    if (std::optional<uint32_t> newest = NewestComplete(groups)) gen = *newest + 1;
  }

  Manifest manifest;
  manifest.generation = gen;
  manifest.mode = mode;
  manifest.rank = rank_;
  manifest.num_servers = num_servers_;
  std::mutex written_mu;
  std::vector<std::string> written;  // guarded by written_mu: final paths to remove on failure
  // Written and finished inside the save; only its Commit (the rename,
  // below) publishes the checkpoint. Its destructor removes what is left.
  std::unique_ptr<AtomicFileWriter> manifest_file;

  auto write = [&](const std::string& name, std::string_view data, ManifestFile* f) -> Status {
    const std::string path = JoinPath(dir, name);
    {
      std::lock_guard<std::mutex> l(written_mu);
      written.push_back(path);
    }
    f->name = name;
    f->bytes = data.size();
    f->crc = Crc32(data);
    return WriteFileAtomically(path, data, fs_, kCheckpointFileWrite);
  };

  Status st = [&]() -> Status {
    for (SparseTable* t : tables.sparse) {
      const ShardRange owned = t->owned_shards();
      std::vector<ManifestFile> files(owned.size());
      std::vector<uint8_t> present(owned.size(), 0);  // not vector<bool>: written in parallel
      FLEET_RETURN_IF_ERROR(ParallelStatus(pool_, t->local_shard_count(), [&](size_t local) -> Status {
        FLEET_ASSIGN_OR_RETURN(std::vector<ShardImage> images, t->SerializeLocalShard(local, mode));
        for (ShardImage& im : images) {
          // A delta lists only shards with changes; a base lists every shard
          // so Load can tell a missing shard from an empty one.
          if (mode == SaveMode::kDelta && im.info.rows == 0 && im.info.deleted == 0) continue;
          const size_t i = im.shard - owned.begin;
          present[i] = 1;
          files[i].shard = im.shard;
          files[i].rows = im.info.rows;
          files[i].deleted = im.info.deleted;
          FLEET_RETURN_IF_ERROR(write(ShardFileName(t->config().id, gen, im.shard), im.image, &files[i]));
        }
        return Status::OK();
      }));
      ManifestTable mt{t->config(), {}};
      for (size_t i = 0; i < files.size(); ++i)
        if (present[i]) mt.files.push_back(std::move(files[i]));
      manifest.tables.push_back(std::move(mt));
    }
    for (DenseTable* t : tables.dense) {
      ManifestFile f;
      f.begin = t->range().begin;
      f.end = t->range().end;
      f.rows = t->range().size();
      // Dense slices are small next to sparse tables and always saved whole,
      // so Load needs only the newest generation of a dense table.
      FLEET_RETURN_IF_ERROR(write(DenseFileName(t->config().id, gen, rank_), t->Serialize(), &f));
      manifest.tables.push_back(ManifestTable{t->config(), {std::move(f)}});
    }
    FLEET_RETURN_IF_ERROR(fs_->SyncDir(dir));
    // The manifest's temp file is written and synced here; only its rename
    // (below) publishes the checkpoint.
    FLEET_ASSIGN_OR_RETURN(manifest_file,
                           AtomicFileWriter::Create(JoinPath(dir, ManifestName(gen, rank_, num_servers_)),
                                                    fs_, kManifestWrite));
    FLEET_RETURN_IF_ERROR(manifest_file->Append(EncodeManifest(manifest)));
    return manifest_file->Finish();
  }();

  auto remove_written = [&] {
    for (const std::string& p : written) {
      Status rm = fs_->Remove(p);
      if (!rm.ok() && !rm.IsNotFound()) LOG(WARNING) << "could not remove " << p << ": " << rm.ToString();
    }
  };
  auto abort_tables = [&] {
    for (SparseTable* t : tables.sparse) t->AbortSave();
  };
  if (!st.ok()) {
    abort_tables();
    manifest_file.reset();  // removes its temp file
    remove_written();
    return st.WithContext(absl::StrCat("checkpoint save to ", dir, " failed; the previous checkpoint is intact"));
  }

  const std::string path = manifest_file->path();
  Status published = manifest_file->Commit();  // rename, then sync the directory
  if (!published.ok()) {
    // The rename may or may not have reached the disk: the directory may now
    // hold this generation or not, and later deltas cannot know which base
    // they extend. Stop saving until a Load re-establishes a known state.
    const std::string reason =
        absl::StrCat("publishing ", path, " failed: ", published.ToString());
    // A snapshot is outside the tables' save chain: that chain stays known.
    if (!snapshot) {
      for (SaveState* s : states) s->Poison(reason);
    }
    abort_tables();
    manifest_file.reset();  // removes the temp manifest if the rename failed
    return published.WithContext("checkpoint save outcome unknown; further saves are refused");
  }
  if (snapshot) {
    // The change marks stay for the next delta of the tables' own chain.
    abort_tables();
    return Status::OK();
  }
  for (SparseTable* t : tables.sparse) t->CommitSave();
  for (SaveState* s : states) s->SetLast(dir, gen);
  return Status::OK();
}

void Checkpointer::RemoveUnfinishedSaves(const std::string& dir, const std::vector<std::string>& names,
                                         const ServerTables& tables) {
  Result<Generations> groups = GroupManifests(dir, names);
  if (!groups.ok()) return;  // the save reports it
  const std::optional<uint32_t> complete = NewestComplete(*groups);
  std::set<uint32_t> published;  // generations this server published a manifest of
  for (const auto& [gen, g] : *groups) {
    if (g.num_servers == num_servers_ && g.by_rank.contains(rank_)) published.insert(gen);
  }
  auto mine = [&](const DataFileId& id) {
    if (id.dense) {
      if (static_cast<int>(id.part) != rank_) return false;
      for (const DenseTable* t : tables.dense)
        if (t->config().id == id.table) return true;
      return false;
    }
    for (const SparseTable* t : tables.sparse)
      if (t->config().id == id.table && t->owned_shards().contains(id.part)) return true;
    return false;
  };
  int removed = 0;
  for (const std::string& name : names) {
    bool leftover = false;
    if (std::optional<DataFileId> id = ParseDataFileName(name); id && mine(*id)) {
      const bool unfinished = (!complete || id->gen > *complete) && !published.contains(id->gen);
      leftover = id->tmp || unfinished;
    } else if (name.ends_with(kTmpSuffix)) {
      std::optional<ManifestId> m = ParseManifestName(name.substr(0, name.size() - std::strlen(kTmpSuffix)));
      leftover = m && m->rank == rank_ && m->num_servers == num_servers_;
    }
    if (!leftover) continue;
    Status rm = fs_->Remove(JoinPath(dir, name));
    if (rm.ok()) {
      ++removed;
    } else if (!rm.IsNotFound()) {
      LOG(WARNING) << "could not remove " << JoinPath(dir, name) << " left by an unfinished save: " << rm.ToString();
    }
  }
  if (removed > 0) LOG(INFO) << "removed " << removed << " files left in " << dir << " by an unfinished save of server " << rank_;
}

Status Checkpointer::Load(const std::string& dir, const ServerTables& tables) {
  std::lock_guard<std::mutex> lock(mu_);
  FLEET_ASSIGN_OR_RETURN(std::vector<std::string> names, fs_->ListDir(dir));
  // A read-only checkpoint directory just keeps them (logged).
  RemoveUnfinishedSaves(dir, names, tables);

  FLEET_ASSIGN_OR_RETURN(Generations groups, GroupManifests(dir, names));
  const std::optional<uint32_t> newest = NewestComplete(groups);
  if (!newest) return Status::NotFound("no complete checkpoint (all servers' manifests) in directory", dir);

  // Walk back from the newest generation to its base, reading manifests.
  std::vector<std::vector<Manifest>> chain;  // oldest first
  for (int64_t gen = *newest;; --gen) {
    auto it = groups.find(static_cast<uint32_t>(gen));
    if (it == groups.end() || !it->second.complete()) {
      const int have = it == groups.end() ? 0 : static_cast<int>(it->second.by_rank.size());
      return Status::Corruption(absl::StrCat("generation ", gen, " of the delta chain ending at ", *newest,
                                             " lacks manifests (", have, " found)"),
                                dir);
    }
    std::vector<Manifest> ms;
    for (const auto& [rank, name] : it->second.by_rank) {
      const std::string path = JoinPath(dir, name);
      FLEET_ASSIGN_OR_RETURN(std::string data, fs_->ReadFile(path));
      FLEET_ASSIGN_OR_RETURN(Manifest m, DecodeManifest(data, path));
      if (m.generation != static_cast<uint32_t>(gen) || m.rank != static_cast<uint32_t>(rank) ||
          m.num_servers != static_cast<uint32_t>(it->second.num_servers))
        return Status::Corruption("manifest contents disagree with its name", path);
      if (!ms.empty() && ms.front().mode != m.mode)
        return Status::Corruption("servers disagree on base/delta mode of this generation", path);
      ms.push_back(std::move(m));
    }
    const bool base = ms.front().mode == SaveMode::kBase;
    chain.insert(chain.begin(), std::move(ms));
    if (base) break;
    if (gen == 0) return Status::Corruption("delta chain has no base", dir);
  }

  // Check every table against every manifest before reading any data.
  for (const std::vector<Manifest>& ms : chain) {
    for (const Manifest& m : ms) {
      auto check = [&](const TableConfig& current) -> Status {
        const ManifestTable* mt = m.Find(current.id);
        if (mt == nullptr) return Status::NotFound(absl::StrCat("table ", current.id, " is not in the checkpoint"), m.file);
        return CheckCheckpointCompatible(mt->config, current).WithContext(m.file);
      };
      for (SparseTable* t : tables.sparse) FLEET_RETURN_IF_ERROR(check(t->config()));
      for (DenseTable* t : tables.dense) FLEET_RETURN_IF_ERROR(check(t->config()));
    }
  }

  // Stage sparse tables: generation by generation, the shards we hold in
  // parallel within a generation.
  std::vector<std::unique_ptr<SparseTable>> sparse_staging;
  for (SparseTable* t : tables.sparse) {
    std::unique_ptr<SparseTable> staging = t->NewEmptyLike();
    const ShardRange owned = t->owned_shards();
    for (size_t g = 0; g < chain.size(); ++g) {
      std::vector<const ManifestFile*> by_shard(owned.size(), nullptr);
      for (const Manifest& m : chain[g]) {
        for (const ManifestFile& f : m.Find(t->config().id)->files) {
          if (f.shard >= t->config().shard_num)
            return Status::Corruption(absl::StrCat("manifest lists shard ", f.shard, " of table ", t->config().id,
                                                   " beyond shard_num ", t->config().shard_num),
                                      m.file);
          if (!owned.contains(f.shard)) continue;
          const ManifestFile*& slot = by_shard[f.shard - owned.begin];
          if (slot != nullptr)
            return Status::Corruption(absl::StrCat("shard ", f.shard, " of table ", t->config().id,
                                                   " listed twice in generation ", m.generation),
                                      m.file);
          slot = &f;
        }
      }
      if (g == 0) {
        for (size_t i = 0; i < by_shard.size(); ++i)
          if (by_shard[i] == nullptr)
            return Status::Corruption(absl::StrCat("shard ", owned.begin + i, " of table ", t->config().id,
                                                   " is missing from the base checkpoint"),
                                      dir);
      }
      FLEET_RETURN_IF_ERROR(ParallelStatus(pool_, by_shard.size(), [&](size_t i) -> Status {
        if (by_shard[i] == nullptr) return Status::OK();
        FLEET_ASSIGN_OR_RETURN(std::string data, ReadVerified(fs_, dir, *by_shard[i]));
        return staging->ApplyShardFile(owned.begin + static_cast<uint32_t>(i), data, JoinPath(dir, by_shard[i]->name));
      }));
    }
    sparse_staging.push_back(std::move(staging));
  }

  // Stage dense tables from the newest generation only (saved whole each time).
  std::vector<std::unique_ptr<DenseTable>> dense_staging;
  for (DenseTable* t : tables.dense) {
    std::unique_ptr<DenseTable> staging = t->NewEmptyLike();
    uint64_t covered = 0;
    for (const Manifest& m : chain.back()) {
      for (const ManifestFile& f : m.Find(t->config().id)->files) {
        if (f.end <= t->range().begin || f.begin >= t->range().end) continue;  // no overlap
        FLEET_ASSIGN_OR_RETURN(std::string data, ReadVerified(fs_, dir, f));
        uint64_t n = 0;
        FLEET_RETURN_IF_ERROR(staging->ApplyFile(data, JoinPath(dir, f.name), &n));
        covered += n;
      }
    }
    if (covered != t->range().size())
      return Status::Corruption(absl::StrCat("dense table ", t->config().id, ": the checkpoint covers ", covered,
                                             " element(s) of the ", t->range().size(), " in [", t->range().begin,
                                             ", ", t->range().end, ")"),
                                dir);
    dense_staging.push_back(std::move(staging));
  }

  // Everything read and verified: switch over. Nothing below can fail.
  const uint32_t gen = chain.back().front().generation;
  for (size_t i = 0; i < tables.sparse.size(); ++i) {
    tables.sparse[i]->SwapRows(*sparse_staging[i]);
    tables.sparse[i]->save_state().SetLast(dir, gen);
  }
  for (size_t i = 0; i < tables.dense.size(); ++i) {
    tables.dense[i]->SwapValues(*dense_staging[i]);
    tables.dense[i]->save_state().SetLast(dir, gen);
  }
  return Status::OK();
}

// ---- .npy export ----

Status ExportDenseNpy(const DenseTable& table, FileSystem* fs, const std::string& path) {
  std::vector<float> values(table.range().size());
  FLEET_RETURN_IF_ERROR(table.Pull(values));
  // Format 1.0: magic, version 1.0, u16 header length, an ASCII dict padded
  // with spaces and ended by '\n' so the data starts 64-byte aligned.
  std::string header = absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': (", values.size(), ",), }");
  const size_t prefix = 10;
  const size_t total = (prefix + header.size() + 1 + 63) / 64 * 64;
  header.append(total - prefix - header.size() - 1, ' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back('\x01');
  out.push_back('\x00');
  ByteWriter w(&out);
  w.Put<uint16_t>(static_cast<uint16_t>(header.size()));
  w.PutBytes(header);
  w.PutFloats(values);
  return WriteFileAtomically(path, out, fs, {.temp_name = AtomicWriteOptions::TempName::kPathDotTmp});
}

}  // namespace fleet::ps
