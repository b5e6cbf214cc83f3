// PsServer's crash recovery (server.recovery_dir): every update goes
// through ApplyRecord, live (Logged: claimed, applied, appended to the push
// log) or replayed after a restart (Recover: the newest recovery checkpoint,
// its sync steps and its log); RecoveryCheckpointLocked starts a new
// generation; Claim/Applied/Forget recognise resent requests. Dispatch is
// in server.cc, waits for other workers in server_waits.cc.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/byte_io.h"
#include "comm/checksum.h"
#include "ps/server.h"
#include "ps/table/float_rows.h"

namespace fleet::ps {
namespace {

// Recovery files in <recovery_dir>/s<rank>/, next to the Checkpointer's
// (which name every file "...-g<6 digits>..."): generation g's checkpoint,
// the sync steps it holds, and the log of what was applied after it.
std::string StepsFileName(uint32_t gen) { return absl::StrFormat("steps-g%06u.bin", gen); }
std::string LogFileName(uint32_t gen) { return absl::StrFormat("pushlog-g%06u.log", gen); }
std::string InDir(const std::string& dir, const std::string& name) { return absl::StrCat(dir, "/", name); }
// Steps file: magic, u32 count, (u32 table, i64 next step) each, u32
// clients, (u64 client, u64 floor, u32 count, u64 numbers) each (the
// requests applied, so resends are recognised after a restart), u32 crc32.
constexpr std::string_view kStepsMagic = "FPSSTEP2";
using SeenMap = std::map<uint64_t, AppliedRequests>;

// The generation in a recovery file name, if it has one.
std::optional<uint32_t> GenerationOf(const std::string& name) {
  const size_t at = name.find("-g");
  if (at == std::string::npos || name.size() < at + 8) return std::nullopt;
  uint32_t gen = 0;
  for (size_t i = at + 2; i < at + 8; ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    gen = gen * 10 + static_cast<uint32_t>(name[i] - '0');
  }
  return gen;
}

// The newest generation whose manifest exists (Checkpointer of 0 of 1).
Result<std::optional<uint32_t>> NewestRecoveryGen(FileSystem* fs, const std::string& dir) {
  FLEET_ASSIGN_OR_RETURN(std::vector<std::string> names, fs->ListDir(dir));
  std::optional<uint32_t> newest;
  for (const std::string& name : names) {
    if (!name.starts_with("MANIFEST-") || name.ends_with(".tmp")) continue;
    if (auto gen = GenerationOf(name); gen && (!newest || *gen > *newest)) newest = gen;
  }
  return newest;
}

std::string EncodeSteps(const std::map<uint32_t, int64_t>& steps, const SeenMap& seen) {
  std::string out(kStepsMagic);
  ByteWriter w(&out);
  w.Put<uint32_t>(static_cast<uint32_t>(steps.size()));
  for (const auto& [table, step] : steps) {
    w.Put<uint32_t>(table);
    w.Put<int64_t>(step);
  }
  w.Put<uint32_t>(static_cast<uint32_t>(seen.size()));
  for (const auto& [client, applied] : seen) {
    w.Put<uint64_t>(client);
    w.Put<uint64_t>(applied.floor);
    w.Put<uint32_t>(static_cast<uint32_t>(applied.done.size()));
    for (uint64_t seq : applied.done) w.Put<uint64_t>(seq);
  }
  w.Put<uint32_t>(Crc32(out));
  return out;
}

Result<std::map<uint32_t, int64_t>> DecodeSteps(std::string_view data, const std::string& path,
                                                SeenMap* seen) {
  auto bad = [&](const char* why) { return Status::Corruption(absl::StrCat("recovery step file: ", why), path); };
  if (data.size() < kStepsMagic.size() + 8 || !data.starts_with(kStepsMagic)) return bad("bad magic or size");
  const std::string_view body = data.substr(0, data.size() - 4);
  uint32_t crc = 0;
  std::memcpy(&crc, data.data() + body.size(), 4);
  if (crc != Crc32(body))
    return bad("checksum mismatch");
  ByteReader r(body.substr(kStepsMagic.size()));
  uint32_t n = 0;
  std::map<uint32_t, int64_t> steps;
  if (!r.Get(&n)) return bad("truncated");
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t table = 0;
    int64_t step = 0;
    if (!r.Get(&table) || !r.Get(&step) || step < 0) return bad("truncated or negative step");
    steps[table] = step;
  }
  uint32_t clients = 0;
  if (!r.Get(&clients)) return bad("truncated");
  for (uint32_t i = 0; i < clients; ++i) {
    uint64_t client = 0;
    AppliedRequests applied;
    uint32_t count = 0;
    if (!r.Get(&client) || !r.Get(&applied.floor) || !r.Get(&count) ||
        count > r.remaining() / sizeof(uint64_t)) {
      return bad("truncated client numbers");
    }
    for (uint32_t k = 0; k < count; ++k) {
      uint64_t seq = 0;
      if (!r.Get(&seq)) return bad("truncated client numbers");
      applied.done.insert(seq);
    }
    (*seen)[client] = std::move(applied);
  }
  if (r.remaining() != 0) return bad("trailing bytes");
  return steps;
}

// A sync step's merged sparse rows (grad[dim], show, click) applied as a
// gradient push.
Status ApplyMergedSparse(SparseTable* t, std::span<const uint64_t> keys, std::span<const float> merged) {
  const size_t n = keys.size();
  const size_t dim = t->push_dim();
  const size_t width = dim + 2;
  if (merged.size() != n * width) {
    return Status::InvalidArgument(absl::StrCat("merged step of ", n, " keys has ", merged.size(),
                                                " floats, not ", n * width),
                                   absl::StrCat("table ", t->config().id));
  }
  std::vector<float> grads(n * dim), shows(n), clicks(n);
  for (size_t i = 0; i < n; ++i) {
    std::copy_n(merged.data() + i * width, dim, grads.data() + i * dim);
    shows[i] = merged[i * width + dim];
    clicks[i] = merged[i * width + dim + 1];
  }
  return t->PushGrad(keys, grads, shows, clicks);
}

bool IsSyncOp(LogOp op) { return op == LogOp::kSyncSparse || op == LogOp::kSyncDense; }

}  // namespace

Status PsServer::LoadAtStart() {
  const ServerConfig& config = options_.job.server;
  if (options_.restarted && !recovery_dir_.empty()) {
    std::lock_guard<std::mutex> lock(log_mu_);
    FLEET_ASSIGN_OR_RETURN(bool recovered, Recover());
    if (recovered) return Status::OK();
    LOG(WARNING) << "server " << options_.rank << ": restarted, but " << recovery_dir_
                 << " holds no recovery checkpoint; starting as a new server does";
  }
  if (options_.restarted && !config.save_dir.empty()) {
    // What this server (or its job) saved last, e.g. when it was stopped.
    Status s = checkpointer_->Load(config.save_dir, AllTables());
    if (s.ok()) {
      LOG(INFO) << "server " << options_.rank << ": restarted, loaded checkpoint " << config.save_dir;
      return s;
    }
    if (!s.IsNotFound()) return s.WithContext(absl::StrCat("server.save_dir ", config.save_dir));
    LOG(INFO) << "server " << options_.rank << ": restarted, no checkpoint in " << config.save_dir;
  }
  if (config.load_dir.empty()) return Status::OK();
  FLEET_RETURN_IF_ERROR(checkpointer_->Load(config.load_dir, AllTables())
                            .WithContext(absl::StrCat("server.load_dir ", config.load_dir)));
  LOG(INFO) << "server " << options_.rank << ": loaded checkpoint " << config.load_dir;
  return Status::OK();
}

Status PsServer::ApplyRecord(const PushRecordRef& rec, uint64_t* shrunk) {
  const std::string which = absl::StrCat("table ", rec.table);
  auto sparse = [&]() -> Result<SparseTable*> {
    auto it = sparse_.find(rec.table);
    if (it == sparse_.end()) return Status::InvalidArgument("no such sparse table", which);
    return it->second.get();
  };
  auto dense = [&]() -> Result<DenseTable*> {
    auto it = dense_.find(rec.table);
    if (it == dense_.end()) return Status::InvalidArgument("no such dense table", which);
    return it->second.get();
  };
  switch (rec.op) {
    case LogOp::kSparseGrad: {
      FLEET_ASSIGN_OR_RETURN(SparseTable * t, sparse());
      return t->PushGrad(rec.keys, rec.values, rec.shows, rec.clicks);
    }
    case LogOp::kSparseDelta: {
      FLEET_ASSIGN_OR_RETURN(SparseTable * t, sparse());
      return t->PushDelta(rec.keys, rec.values, rec.shows, rec.clicks);
    }
    case LogOp::kSyncSparse: {
      FLEET_ASSIGN_OR_RETURN(SparseTable * t, sparse());
      return ApplyMergedSparse(t, rec.keys, rec.values);
    }
    case LogOp::kDenseGrad:
    case LogOp::kSyncDense: {
      FLEET_ASSIGN_OR_RETURN(DenseTable * t, dense());
      return t->PushGrad(rec.values);
    }
    case LogOp::kDenseDelta: {
      FLEET_ASSIGN_OR_RETURN(DenseTable * t, dense());
      return t->PushDelta(rec.values);
    }
    case LogOp::kDenseAssign: {
      FLEET_ASSIGN_OR_RETURN(DenseTable * t, dense());
      return t->Assign(rec.values);
    }
    case LogOp::kShrink: {
      uint64_t deleted = 0;
      if (rec.table != kAllTables) {
        FLEET_ASSIGN_OR_RETURN(SparseTable * t, sparse());
        deleted = t->Shrink();
      } else {
        for (auto& [id, t] : sparse_) deleted += t->Shrink();
      }
      if (shrunk != nullptr) *shrunk = deleted;
      return Status::OK();
    }
    case LogOp::kEndPass:
      for (auto& [id, t] : sparse_) t->EndPass();
      return Status::OK();
  }
  return Status::InvalidArgument("unknown push log op", which);
}

Status PsServer::Logged(const PushRecordRef& rec, uint64_t* shrunk) {
  if (recovery_dir_.empty()) {
    // A resend whose first copy was applied (its reply was lost) is
    // answered as that one was. Claimed before applying, so a resend that
    // arrives while the first copy is still being applied is answered OK
    // a little early; its caller resent only after losing the first reply.
    if (!Claim(rec.client, rec.seq)) return Status::OK();
    Status s = ApplyRecord(rec, shrunk);
    if (!s.ok()) Unclaim(rec.client, rec.seq);
    return s;
  }
  std::lock_guard<std::mutex> lock(log_mu_);
  if (!Claim(rec.client, rec.seq)) return Status::OK();
  if (log_broken_) {
    // The log's tail is unknown after a failed write or sync: only a new
    // checkpoint (and log) makes further updates recoverable again.
    if (Status s = RecoveryCheckpointLocked(); !s.ok()) {
      Unclaim(rec.client, rec.seq);
      return Status::FailedPrecondition(
          absl::StrCat("update refused: the push log failed and a new recovery checkpoint "
                       "failed too: ", s.ToString()),
          absl::StrCat("server ", options_.rank));
    }
  }
  if (Status s = log_->Append(rec); !s.ok()) {
    log_broken_ = true;
    Unclaim(rec.client, rec.seq);
    return s.WithContext("push log append (update not applied)");
  }
  Status applied = ApplyRecord(rec, shrunk);
  // Replay fails it the same way and does not claim it either.
  if (!applied.ok()) Unclaim(rec.client, rec.seq);
  if (IsSyncOp(rec.op)) next_step_[rec.table] = std::max(next_step_[rec.table], rec.step + 1);
  if (++since_checkpoint_ >= options_.job.server.checkpoint_every ||
      log_->bytes() >= static_cast<uint64_t>(options_.job.server.checkpoint_every_mib) << 20) {
    // This update waits for the checkpoint; it bounds the replay and the log.
    if (Status s = RecoveryCheckpointLocked(); !s.ok()) {
      LOG(WARNING) << "server " << options_.rank << ": recovery checkpoint failed (retried after "
                   << "the next update; the current log stays valid): " << s.ToString();
    }
  }
  return applied;
}

bool PsServer::Claim(uint64_t client, uint64_t seq) {
  if (client == 0) return true;
  std::lock_guard<std::mutex> lock(seen_mu_);
  AppliedRequests& a = seen_[client];
  if (seq < a.floor) return false;
  return a.done.insert(seq).second;
}

bool PsServer::Applied(uint64_t client, uint64_t seq) {
  if (client == 0) return false;
  std::lock_guard<std::mutex> lock(seen_mu_);
  auto it = seen_.find(client);
  return it != seen_.end() && (seq < it->second.floor || it->second.done.contains(seq));
}

void PsServer::Unclaim(uint64_t client, uint64_t seq) {
  if (client == 0) return;
  std::lock_guard<std::mutex> lock(seen_mu_);
  if (auto it = seen_.find(client); it != seen_.end()) it->second.done.erase(seq);
}

void PsServer::Forget(uint64_t client, uint64_t acked_below) {
  if (client == 0) return;
  std::lock_guard<std::mutex> lock(seen_mu_);
  AppliedRequests& a = seen_[client];
  if (acked_below <= a.floor) return;
  a.floor = acked_below;
  a.done.erase(a.done.begin(), a.done.lower_bound(acked_below));
}

Result<bool> PsServer::Recover() {
  FLEET_ASSIGN_OR_RETURN(std::optional<uint32_t> gen, NewestRecoveryGen(fs_, recovery_dir_));
  if (!gen) return false;
  FLEET_RETURN_IF_ERROR(recovery_ckpt_->Load(recovery_dir_, AllTables())
                            .WithContext(absl::StrCat("server.recovery_dir ", recovery_dir_)));
  const std::string steps_path = InDir(recovery_dir_, StepsFileName(*gen));
  auto steps_data = fs_->ReadFile(steps_path);
  if (!steps_data.ok()) {
    return Status::Corruption(
        absl::StrCat("recovery step file of generation ", *gen, ": ", steps_data.status().ToString()),
        steps_path);
  }
  {
    std::lock_guard<std::mutex> lock(seen_mu_);
    seen_.clear();
    FLEET_ASSIGN_OR_RETURN(next_step_, DecodeSteps(*steps_data, steps_path, &seen_));
  }
  const std::map<uint32_t, int64_t> checkpoint_steps = next_step_;
  // No log: the crash came between the checkpoint and its log's creation,
  // when nothing could be applied (log_mu_ was held).
  const std::string log_path = InDir(recovery_dir_, LogFileName(*gen));
  PushLogContents log;
  if (auto read = ReadPushLog(fs_, log_path); read.ok()) {
    log = std::move(read).value();
  } else if (!read.status().IsNotFound()) {
    return read.status();
  }
  std::map<uint32_t, uint64_t> replayed;
  uint64_t failed = 0;
  for (const PushRecord& r : log.records) {
    // Replayed exactly as first applied; an update that failed then (e.g.
    // a full table) fails the same way now and is not an error here.
    Status s = ApplyRecord({.op = r.op, .table = r.table, .step = r.step, .sender = r.sender,
                            .keys = r.keys, .values = r.values, .shows = r.shows,
                            .clicks = r.clicks});
    if (!s.ok()) ++failed;
    // As Logged: a numbered update counts as applied unless it failed.
    if (s.ok()) (void)Claim(r.client, r.seq);
    if (IsSyncOp(r.op)) next_step_[r.table] = std::max(next_step_[r.table], r.step + 1);
    ++replayed[r.table];
  }
  {
    std::lock_guard<std::mutex> lock(sync_mu_);
    for (auto& [id, st] : sync_) st.merger->RestoreNextStep(next_step_[id]);
  }
  auto step_of = [](const std::map<uint32_t, int64_t>& m, uint32_t id) {
    auto it = m.find(id);
    return it == m.end() ? int64_t{0} : it->second;
  };
  std::vector<uint32_t> ids;
  for (auto& [id, t] : sparse_) ids.push_back(id);
  for (auto& [id, t] : dense_) ids.push_back(id);
  for (uint32_t id : ids) {
    // Every acknowledged update was appended before its acknowledgement, so
    // none is lost (push_log_sync none/batch excepted on a machine crash).
    LOG(INFO) << "server " << options_.rank << ": recovered table " << id
              << ": checkpoint step " << step_of(checkpoint_steps, id) << ", replayed "
              << replayed[id] << " pushes, next sync step " << step_of(next_step_, id)
              << ", lost 0 acknowledged updates";
  }
  LOG(INFO) << "server " << options_.rank << ": recovered from " << recovery_dir_
            << " generation " << *gen << ": " << log.records.size() << " log records"
            << (log.dropped_torn_tail ? ", dropped a torn last record (never acknowledged)" : "")
            << (failed ? absl::StrCat(", ", failed, " failed as when first applied") : "");
  return true;
}

Status PsServer::RecoveryCheckpointLocked() {
  FLEET_ASSIGN_OR_RETURN(std::optional<uint32_t> newest, NewestRecoveryGen(fs_, recovery_dir_));
  // Checkpointer::Save picks the generation after the newest manifest too.
  const uint32_t gen = newest ? *newest + 1 : 0;
  // The steps first: once the manifest of gen exists, so does this file.
  std::string steps;
  {
    std::lock_guard<std::mutex> lock(seen_mu_);
    steps = EncodeSteps(next_step_, seen_);
  }
  FLEET_RETURN_IF_ERROR(
      WriteFileAtomically(InDir(recovery_dir_, StepsFileName(gen)), steps, fs_, kCheckpointFileWrite));
  // A snapshot: the job's own base/delta chain in save_dir is not disturbed.
  FLEET_RETURN_IF_ERROR(recovery_ckpt_->SaveSnapshot(recovery_dir_, AllTables()));
  // From here a restart loads gen: nothing may go to the old log any more.
  auto log = PushLog::Create(fs_, InDir(recovery_dir_, LogFileName(gen)),
                             options_.job.server.push_log_sync);
  Status dir_synced = log.ok() ? fs_->SyncDir(recovery_dir_) : log.status();
  if (!dir_synced.ok()) {
    log_broken_ = true;
    return dir_synced.WithContext("push log after a recovery checkpoint");
  }
  if (log_ != nullptr) (void)log_->Close();
  log_ = std::move(log).value();
  log_broken_ = false;
  since_checkpoint_ = 0;
  // Older generations are not needed any more.
  if (auto names = fs_->ListDir(recovery_dir_); names.ok()) {
    for (const std::string& name : *names) {
      if (auto g = GenerationOf(name); g && *g < gen) (void)fs_->Remove(InDir(recovery_dir_, name));
    }
  }
  return Status::OK();
}

void PsServer::RemoveRecoveryFiles() {
  auto names = fs_->ListDir(recovery_dir_);
  if (!names.ok()) {
    LOG(WARNING) << "server " << options_.rank << ": " << names.status().ToString();
    return;
  }
  uint64_t removed = 0;
  for (const std::string& name : *names) {
    if (Status s = fs_->Remove(InDir(recovery_dir_, name)); s.ok()) {
      ++removed;
    } else {
      LOG(WARNING) << "server " << options_.rank << ": " << s.ToString();
    }
  }
  if (::rmdir(recovery_dir_.c_str()) != 0) {
    PLOG(WARNING) << "server " << options_.rank << ": rmdir " << recovery_dir_;
  }
  LOG(INFO) << "server " << options_.rank << ": the job finished; removed its " << removed
            << " recovery files in " << recovery_dir_ << " (server.keep_recovery keeps them)";
}

void PsServer::SyncLog() {
  if (recovery_dir_.empty()) return;
  std::lock_guard<std::mutex> lock(log_mu_);
  if (log_ == nullptr || log_broken_) return;
  if (Status s = log_->SyncPending(); !s.ok()) {
    LOG(ERROR) << "server " << options_.rank << ": push log sync failed: " << s.ToString();
    log_broken_ = true;
  }
}

}  // namespace fleet::ps
