#include "ps/server.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "ps/ps.pb.h"
#include "ps/server_request.h"
#include "ps/table/accessor.h"
#include "ps/table/float_rows.h"
#include "ps/table/partition.h"
#include "ps/table/ssd_sparse_table.h"

namespace fleet::ps {

using internal::Clock;
using internal::ParseMeta;
using internal::ReplyBy;

namespace {

// "PS_PULL_SPARSE" -> "pull_sparse", as status lines and metrics name it.
std::string CommandName(pb::PsCommand command) {
  std::string name = pb::PsCommand_Name(command);
  if (name.rfind("PS_", 0) == 0) name = name.substr(3);
  absl::AsciiStrToLower(&name);
  return name;
}

// The process's resident memory: the second field of /proc/self/statm, in
// pages; 0 when unreadable.
double ResidentBytes() {
  long pages = 0;
  if (std::FILE* statm = std::fopen("/proc/self/statm", "r")) {
    long size = 0;
    if (std::fscanf(statm, "%ld %ld", &size, &pages) != 2) pages = 0;
    std::fclose(statm);
  }
  return pages * static_cast<double>(sysconf(_SC_PAGESIZE));
}

// A sender's gradient, delta, counts or dense values with a NaN or an Inf
// would poison the table for good: refused, naming the table and the
// first bad element. AllFinite is one branch-free pass (hot path).
Status CheckFinite(const Message& req, const char* what,
                   std::initializer_list<std::span<const float>> frames) {
  size_t frame = 0;
  for (std::span<const float> f : frames) {
    if (!AllFinite(f)) {
      const size_t i = FirstNonFinite(f);
      return Status::InvalidArgument(
          absl::StrCat(what, ": non-finite value ", f[i], " at element ", i, " of frame ", frame,
                       "; NaN and Inf are refused"),
          absl::StrCat("table ", req.header.table_id(), " from ", req.header.sender()));
    }
    ++frame;
  }
  return Status::OK();
}

// The frame count a command must carry, checked before any frame is read.
Status ExpectFrames(const Message& req, std::initializer_list<int> allowed, const char* what) {
  for (int n : allowed) {
    if (req.header.frames_size() == n) return Status::OK();
  }
  return Status::InvalidArgument(
      absl::StrCat(what, " carries ", req.header.frames_size(), " payload frames"),
      absl::StrCat("from ", req.header.sender()));
}

}  // namespace

PsServer::PsServer(PsServerOptions options) : options_(std::move(options)) {}

Result<std::unique_ptr<PsServer>> PsServer::Create(PsServerOptions options) {
  if (options.num_servers < 1 || options.rank < 0 || options.rank >= options.num_servers) {
    return Status::InvalidArgument(
        absl::StrCat("server rank ", options.rank, " is not in [0, ", options.num_servers, ")"));
  }
  if (options.num_workers < 1) {
    return Status::InvalidArgument("num_workers must be >= 1", std::to_string(options.num_workers));
  }
  std::unique_ptr<PsServer> server(new PsServer(std::move(options)));
  if (server->options_.fs == nullptr) {
    server->owned_fs_ = std::make_unique<PosixFileSystem>();
    server->fs_ = server->owned_fs_.get();
  } else {
    server->fs_ = server->options_.fs;
  }
  if (const std::string& dir = server->options_.job.server.save_dir; !dir.empty()) {
    // Found now, not when the job ends and the save fails.
    FLEET_RETURN_IF_ERROR(CheckWritableDir(server->fs_, dir).WithContext("server.save_dir"));
  }
  server->table_pool_ = std::make_unique<ThreadPool>(server->options_.job.server.threads);
  FLEET_RETURN_IF_ERROR(server->BuildTables());
  server->checkpointer_ = std::make_unique<Checkpointer>(
      server->fs_, server->options_.rank, server->options_.num_servers, server->table_pool_.get());
  if (const std::string& dir = server->options_.job.server.recovery_dir; !dir.empty()) {
    // The folder itself first: a link planted there is refused, not followed.
    FLEET_RETURN_IF_ERROR(server->fs_->CreateDir(dir).WithContext("server.recovery_dir"));
    server->recovery_dir_ = absl::StrCat(dir, "/s", server->options_.rank);
    FLEET_RETURN_IF_ERROR(
        CheckWritableDir(server->fs_, server->recovery_dir_).WithContext("server.recovery_dir"));
    // Private to this server (saved as server 0 of 1): its checkpoints are
    // taken when its own log calls for one, not at the others' times.
    server->recovery_ckpt_ =
        std::make_unique<Checkpointer>(server->fs_, 0, 1, server->table_pool_.get());
  }
  FLEET_RETURN_IF_ERROR(server->LoadAtStart());
  if (!server->recovery_dir_.empty()) {
    // The state we start from (recovered, loaded or empty) is the first
    // checkpoint of this run; the log starts empty after it.
    std::lock_guard<std::mutex> lock(server->log_mu_);
    FLEET_RETURN_IF_ERROR(
        server->RecoveryCheckpointLocked().WithContext("server.recovery_dir first checkpoint"));
  }
  RpcNodeOptions rpc;
  rpc.name = absl::StrCat("server:", server->options_.rank);
  rpc.handler_threads = server->options_.handler_threads;
  rpc.default_timeout = server->options_.job.distributed.timeout;
  rpc.van = JobVanOptions(server->options_.job, server->options_.auth, server->options_.encrypt);
  FLEET_ASSIGN_OR_RETURN(server->rpc_, RpcNode::Create(rpc));
  server->RegisterHandlers();
  return server;
}

PsServer::~PsServer() { (void)Shutdown(/*save=*/false); }

uint64_t DefaultMaxRowsPerServer(uint64_t memory_bytes, int servers_on_host, size_t sparse_tables,
                                 size_t row_floats) {
  const uint64_t row_bytes = row_floats * sizeof(float) + kRowOverheadBytes;
  return std::max<uint64_t>(1, memory_bytes / 2 / std::max(1, servers_on_host) /
                                   std::max<size_t>(1, sparse_tables) / row_bytes);
}

Status PsServer::BuildTables() {
  const auto& job = options_.job;
  row_dbs_ = std::make_unique<RowDbSet>(options_.rank);
  uint64_t memory = options_.memory_bytes;
  if (memory == 0) {
    memory = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  }
  const size_t sparse_tables = std::count_if(job.tables.begin(), job.tables.end(), [](const TableConfig& c) {
    return c.kind == TableKind::kSparse;
  });
  for (TableConfig config : job.tables) {
    const std::string which = absl::StrCat("table ", config.id);
    // A disk tier's rows are not bounded by memory (storage.cache_rows
    // bounds what it keeps there).
    if (config.kind == TableKind::kSparse && config.max_rows_per_server == 0 &&
        config.storage.kind == StorageKind::kMemory && ValidateTableConfig(config).ok()) {
      const size_t row_floats = MakeAccessor(config)->row_floats();
      config.max_rows_per_server =
          DefaultMaxRowsPerServer(memory, options_.servers_on_host, sparse_tables, row_floats);
      LOG(INFO) << "server " << options_.rank << ": " << which << ": max_rows_per_server not set, "
                << config.max_rows_per_server << " rows (half of " << (memory >> 20) << " MiB over "
                << options_.servers_on_host << " servers on this machine and " << sparse_tables
                << " sparse tables, " << row_floats * sizeof(float) + kRowOverheadBytes
                << " bytes a row)";
    }
    if (config.kind == TableKind::kSparse) {
      auto shards = AssignShards(config.shard_num, options_.num_servers, options_.rank);
      if (!shards.ok()) return shards.status().WithContext(which);
      auto table = CreateSparseTable(config, shards.value(), table_pool_.get(), row_dbs_.get());
      if (!table.ok()) return table.status().WithContext(which);
      if (job.distributed.mode == SyncMode::kSync) {
        const size_t width = table.value()->push_dim() + 2;  // + show, click
        const uint32_t id = config.id;
        // Runs inside Add under sync_mu_, which holds sync_applying_step_.
        sync_[config.id].merger = std::make_unique<GradientMerger>(
            options_.num_workers, width, /*keyed=*/true,
            [this, id](std::span<const uint64_t> keys, std::span<const float> merged) {
              return Logged({.op = LogOp::kSyncSparse, .table = id, .step = sync_applying_step_,
                             .keys = keys, .values = merged});
            });
      }
      sparse_[config.id] = std::move(table).value();
    } else {
      auto range = SplitDenseRange(config.dim, options_.num_servers, options_.rank);
      if (!range.ok()) return range.status().WithContext(which);
      auto table = DenseTable::Create(config, range.value());
      if (!table.ok()) return table.status().WithContext(which);
      if (job.distributed.mode == SyncMode::kSync && range->size() > 0) {
        const uint32_t id = config.id;
        sync_[config.id].merger = std::make_unique<GradientMerger>(
            options_.num_workers, range->size(), /*keyed=*/false,
            [this, id](std::span<const uint64_t>, std::span<const float> merged) {
              return Logged({.op = LogOp::kSyncDense, .table = id, .step = sync_applying_step_,
                             .values = merged});
            });
      }
      dense_[config.id] = std::move(table).value();
    }
  }
  return Status::OK();
}

ServerTables PsServer::AllTables() {
  ServerTables t;
  for (auto& [id, table] : sparse_) t.sparse.push_back(table.get());
  for (auto& [id, table] : dense_) t.dense.push_back(table.get());
  return t;
}

SparseTable* PsServer::sparse_table(uint32_t id) {
  auto it = sparse_.find(id);
  return it == sparse_.end() ? nullptr : it->second.get();
}

DenseTable* PsServer::dense_table(uint32_t id) {
  auto it = dense_.find(id);
  return it == dense_.end() ? nullptr : it->second.get();
}

void PsServer::Count(pb::PsCommand command, const Message& req, const Message* resp,
                     std::chrono::steady_clock::duration handling) {
  Traffic& t = traffic_[command];
  t.requests.fetch_add(1, std::memory_order_relaxed);
  t.handling_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(handling).count(),
                          std::memory_order_relaxed);
  uint64_t in = 0;
  for (const auto& f : req.frames) in += f.size();
  t.bytes_in.fetch_add(in, std::memory_order_relaxed);
  if (resp != nullptr) {
    uint64_t out = 0;
    for (const auto& f : resp->frames) out += f.size();
    t.bytes_out.fetch_add(out, std::memory_order_relaxed);
  }
}

void PsServer::RegisterHandlers() {
  // Each handler is counted as served or rejected by its reply status, and
  // by kind and bytes for the status line.
  auto sync = [this](pb::PsCommand command, auto method) {
    return [this, command, method](const Message& req, Message* resp) {
      const auto start = std::chrono::steady_clock::now();
      Status s = (this->*method)(req, resp);
      (s.ok() ? served_ : rejected_).fetch_add(1, std::memory_order_relaxed);
      Count(command, req, resp, std::chrono::steady_clock::now() - start);
      return s;
    };
  };
  auto counted = [this](pb::PsCommand command, auto handler) {
    return [this, command, handler](Message req, Responder r) {
      const auto start = std::chrono::steady_clock::now();
      uint64_t in = 0;
      for (const auto& f : req.frames) in += f.size();
      handler(std::move(req), r);
      // Counted after: the handler took the request (frames and all).
      Traffic& t = traffic_[command];
      t.requests.fetch_add(1, std::memory_order_relaxed);
      t.bytes_in.fetch_add(in, std::memory_order_relaxed);
      t.handling_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::steady_clock::now() - start)
                                  .count(),
                              std::memory_order_relaxed);
    };
  };
  // A small sparse request takes tens of microseconds of table work, less
  // than handing it to the pool costs; it runs where it was received.
  RpcHandlerOptions small_inline;
  small_inline.run_on_io_thread = true;
  small_inline.io_thread_if = [this](const Message& req) { return IsSmallSparseRequest(req); };
  rpc_->RegisterSync(pb::PS_PULL_SPARSE, sync(pb::PS_PULL_SPARSE, &PsServer::PullSparse), small_inline);
  for (auto [command, method] : {std::pair{pb::PS_PULL_DENSE, &PsServer::PullDense},
                                 std::pair{pb::PS_INIT_DENSE, &PsServer::InitDense},
                                 std::pair{pb::PS_SAVE, &PsServer::Save},
                                 std::pair{pb::PS_LOAD, &PsServer::Load},
                                 std::pair{pb::PS_SHRINK, &PsServer::Shrink},
                                 std::pair{pb::PS_END_PASS, &PsServer::EndPass},
                                 std::pair{pb::PS_STATS, &PsServer::Stats},
                                 std::pair{pb::PS_STOP, &PsServer::Stop}}) {
    rpc_->RegisterSync(command, sync(command, method));
  }
  rpc_->Register(pb::PS_PUSH_SPARSE_GRAD,
                 counted(pb::PS_PUSH_SPARSE_GRAD,
                         [this](Message req, Responder r) { PushSparse(std::move(req), r, false); }),
                 small_inline);
  rpc_->Register(pb::PS_PUSH_SPARSE_DELTA,
                 counted(pb::PS_PUSH_SPARSE_DELTA,
                         [this](Message req, Responder r) { PushSparse(std::move(req), r, true); }),
                 small_inline);
  rpc_->Register(pb::PS_PUSH_DENSE_GRAD,
                 counted(pb::PS_PUSH_DENSE_GRAD,
                         [this](Message req, Responder r) { PushDense(std::move(req), r, false); }));
  rpc_->Register(pb::PS_PUSH_DENSE_DELTA,
                 counted(pb::PS_PUSH_DENSE_DELTA,
                         [this](Message req, Responder r) { PushDense(std::move(req), r, true); }));
  rpc_->Register(pb::PS_BARRIER, counted(pb::PS_BARRIER, [this](Message req, Responder r) {
                   Barrier(std::move(req), r);
                 }));
}

std::string PsServer::StatusLine() {
  std::lock_guard<std::mutex> lock(status_mu_);
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::max(1e-3, std::chrono::duration<double>(now - status_at_).count());
  status_at_ = now;
  std::string kinds;
  uint64_t in = 0, out = 0;
  for (int c = 0; c < kCommandKinds; ++c) {
    in += traffic_[c].bytes_in.load(std::memory_order_relaxed);
    out += traffic_[c].bytes_out.load(std::memory_order_relaxed);
    const uint64_t requests = traffic_[c].requests.load(std::memory_order_relaxed);
    const uint64_t delta = requests - status_requests_[c];
    status_requests_[c] = requests;
    if (delta == 0) continue;
    absl::StrAppendFormat(&kinds, "%s%s %.1f", kinds.empty() ? "" : ", ",
                          CommandName(static_cast<pb::PsCommand>(c)), delta / seconds);
  }
  constexpr double kMiB = 1024.0 * 1024.0;
  std::string line = absl::StrFormat(
      "ps_server %d: requests/s {%s}, in %.2f MiB/s, out %.2f MiB/s", options_.rank,
      kinds.empty() ? std::string("none") : kinds, (in - status_bytes_in_) / kMiB / seconds,
      (out - status_bytes_out_) / kMiB / seconds);
  status_bytes_in_ = in;
  status_bytes_out_ = out;
  for (auto& [id, table] : sparse_) {
    const SparseTableStats s = table->Stats();
    absl::StrAppendFormat(&line, ", table %d: %d rows %.1f MiB", id, s.rows, s.bytes / kMiB);
    if (!table->serves_from_memory()) {
      absl::StrAppendFormat(&line, " (%d rows on disk, %.1f MiB; %d read back)", s.disk_rows,
                            s.disk_bytes / kMiB, s.disk_rows_read);
    }
  }
  for (auto& [id, table] : dense_) {
    absl::StrAppendFormat(&line, ", table %d: %d floats %.1f MiB", id, table->range().size(),
                          table->memory_bytes() / kMiB);
  }
  absl::StrAppendFormat(&line, ", rss %.0f MiB", ResidentBytes() / kMiB);
  // The peak too (VmHWM): what a memory budget must cover.
  if (std::FILE* status = std::fopen("/proc/self/status", "r")) {
    char text[256];
    long peak_kib = -1;
    while (peak_kib < 0 && std::fgets(text, sizeof text, status) != nullptr) {
      if (std::sscanf(text, "VmHWM: %ld kB", &peak_kib) != 1) peak_kib = -1;
    }
    std::fclose(status);
    if (peak_kib >= 0) absl::StrAppendFormat(&line, " (peak %.0f MiB)", peak_kib / 1024.0);
  }
  {
    std::lock_guard<std::mutex> log_lock(log_mu_);
    if (log_ != nullptr) {
      absl::StrAppendFormat(&line, ", push log %d records to replay", since_checkpoint_);
    } else {
      line += ", push log off";
    }
  }
  return line;
}

Result<std::string> PsServer::Start() {
  FLEET_ASSIGN_OR_RETURN(std::string bound, rpc_->Listen(options_.endpoint));
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (!watchdog_.joinable() && !shut_down_) watchdog_ = std::thread([this] { WatchWaits(); });
  }
  LOG(INFO) << "server " << options_.rank << "/" << options_.num_servers << " serving on "
            << bound << " (" << sparse_.size() << " sparse, " << dense_.size()
            << " dense tables, mode " << SyncModeName(options_.job.distributed.mode) << ")";
  return bound;
}

bool PsServer::IsSmallSparseRequest(const Message& req) const {
  // Up to ~2000 keys and 16 Ki floats take <= ~50 us of table work; frame 0
  // holds the keys. Anything odd goes to the pool, whose handler explains.
  auto it = sparse_.find(static_cast<uint32_t>(req.header.table_id()));
  if (it == sparse_.end() || req.frames.empty()) return false;
  // A disk tier may read the disk: never on the I/O thread.
  if (!it->second->serves_from_memory()) return false;
  const size_t keys = req.frames[0].size() / sizeof(uint64_t);
  return keys <= 2048 && keys * it->second->pull_dim() <= 16384;
}

Result<SparseTable*> PsServer::FindSparse(const Message& req) {
  const uint32_t id = static_cast<uint32_t>(req.header.table_id());
  if (auto it = sparse_.find(id); it != sparse_.end()) return it->second.get();
  if (dense_.count(id)) {
    return Status::InvalidArgument("table is dense, request is for a sparse table",
                                   absl::StrCat("table ", req.header.table_id()));
  }
  return Status::NotFound("no such table", absl::StrCat("table ", req.header.table_id()));
}

Result<DenseTable*> PsServer::FindDense(const Message& req) {
  const uint32_t id = static_cast<uint32_t>(req.header.table_id());
  if (auto it = dense_.find(id); it != dense_.end()) return it->second.get();
  if (sparse_.count(id)) {
    return Status::InvalidArgument("table is sparse, request is for a dense table",
                                   absl::StrCat("table ", req.header.table_id()));
  }
  return Status::NotFound("no such table", absl::StrCat("table ", req.header.table_id()));
}

Status PsServer::PullSparse(const Message& req, Message* resp) {
  FLEET_ASSIGN_OR_RETURN(SparseTable * table, FindSparse(req));
  FLEET_RETURN_IF_ERROR(ExpectFrames(req, {1}, "pull_sparse"));
  FLEET_ASSIGN_OR_RETURN(SArray<uint64_t> keys, req.Frame<uint64_t>(0));
  auto values = reply_buffers_->Get<float>(keys.size() * table->pull_dim());
  FLEET_RETURN_IF_ERROR(table->Pull(keys.span(), values.span()));
  resp->AddFrame(values);
  return Status::OK();
}

void PsServer::PushSparse(Message req, Responder r, bool delta) {
  auto reply_error = [&](const Status& s) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    r.ReplyError(s);
  };
  auto table = FindSparse(req);
  if (!table.ok()) return reply_error(table.status());
  const char* what = delta ? "push_sparse_delta" : "push_sparse_grad";
  if (Status s = ExpectFrames(req, {2, 4}, what); !s.ok()) return reply_error(s);
  auto keys = req.Frame<uint64_t>(0);
  auto grads = req.Frame<float>(1);
  if (!keys.ok()) return reply_error(keys.status());
  if (!grads.ok()) return reply_error(grads.status());
  SArray<float> shows, clicks;
  if (req.header.frames_size() == 4) {
    auto s = req.Frame<float>(2);
    auto c = req.Frame<float>(3);
    if (!s.ok()) return reply_error(s.status());
    if (!c.ok()) return reply_error(c.status());
    shows = std::move(s).value();
    clicks = std::move(c).value();
  }
  if (Status s = CheckFinite(req, what, {grads->span(), shows.span(), clicks.span()}); !s.ok()) {
    return reply_error(s);
  }
  SparseTable* t = table.value();
  auto meta = ParseMeta(req);
  if (!meta.ok()) return reply_error(meta.status());
  const bool sync = !delta && options_.job.distributed.mode == SyncMode::kSync;
  if (!sync) {
    Forget(meta->client_id(), meta->acked_below());
    Status s = Logged({.op = delta ? LogOp::kSparseDelta : LogOp::kSparseGrad,
                       .table = t->config().id,
                       .sender = req.header.sender(),
                       .client = meta->client_id(),
                       .seq = meta->sequence(),
                       .keys = keys->span(),
                       .values = grads->span(),
                       .shows = shows.span(),
                       .clicks = clicks.span()});
    if (!s.ok()) return reply_error(s);
    served_.fetch_add(1, std::memory_order_relaxed);
    return r.Reply(Message());
  }
  // Sync: check everything the table would check now, so a bad push is
  // refused alone instead of failing the whole step later.
  const size_t n = keys->size();
  const size_t dim = t->push_dim();
  if (grads->size() != n * dim || (!shows.empty() && (shows.size() != n || clicks.size() != n))) {
    return reply_error(Status::InvalidArgument(
        absl::StrCat(what, ": ", n, " keys need ", n * dim, " gradient floats (dim ", dim,
                     ") and ", n, " shows and clicks; got ", grads->size(), ", ", shows.size(),
                     ", ", clicks.size()),
        absl::StrCat("table ", req.header.table_id())));
  }
  const ShardRange owned = t->owned_shards();
  for (uint64_t key : keys->span()) {
    const uint32_t shard = t->sharder()(key);
    if (!owned.contains(shard)) {
      return reply_error(Status::InvalidArgument(
          absl::StrCat("key ", key, " is in shard ", shard, ", not held by server ",
                       options_.rank),
          absl::StrCat("table ", req.header.table_id())));
    }
  }
  std::vector<float> combined(n * (dim + 2));
  for (size_t i = 0; i < n; ++i) {
    float* row = combined.data() + i * (dim + 2);
    std::copy_n(grads->data() + i * dim, dim, row);
    row[dim] = shows.empty() ? 1.0f : shows[i];
    row[dim + 1] = clicks.empty() ? 0.0f : clicks[i];
  }
  AddSyncContribution(t->config().id, *meta, keys->span(), combined, r,
                      ReplyBy(req, Clock::now()));
}

Status PsServer::PullDense(const Message& req, Message* resp) {
  FLEET_ASSIGN_OR_RETURN(DenseTable * table, FindDense(req));
  FLEET_RETURN_IF_ERROR(ExpectFrames(req, {0}, "pull_dense"));
  auto values = reply_buffers_->Get<float>(table->range().size());
  FLEET_RETURN_IF_ERROR(table->Pull(values.span()));
  resp->AddFrame(values);
  return Status::OK();
}

void PsServer::PushDense(Message req, Responder r, bool delta) {
  auto reply_error = [&](const Status& s) {
    rejected_.fetch_add(1, std::memory_order_relaxed);
    r.ReplyError(s);
  };
  auto table = FindDense(req);
  if (!table.ok()) return reply_error(table.status());
  const char* what = delta ? "push_dense_delta" : "push_dense_grad";
  if (Status s = ExpectFrames(req, {1}, what); !s.ok()) return reply_error(s);
  auto values = req.Frame<float>(0);
  if (!values.ok()) return reply_error(values.status());
  if (Status s = CheckFinite(req, what, {values->span()}); !s.ok()) return reply_error(s);
  DenseTable* t = table.value();
  auto meta = ParseMeta(req);
  if (!meta.ok()) return reply_error(meta.status());
  const bool sync = !delta && options_.job.distributed.mode == SyncMode::kSync;
  if (!sync || t->range().size() == 0) {
    Forget(meta->client_id(), meta->acked_below());
    Status s = Logged({.op = delta ? LogOp::kDenseDelta : LogOp::kDenseGrad,
                       .table = t->config().id,
                       .sender = req.header.sender(),
                       .client = meta->client_id(),
                       .seq = meta->sequence(),
                       .values = values->span()});
    if (!s.ok()) return reply_error(s);
    served_.fetch_add(1, std::memory_order_relaxed);
    return r.Reply(Message());
  }
  if (values->size() != t->range().size()) {
    return reply_error(Status::InvalidArgument(
        absl::StrCat("push_dense_grad: server ", options_.rank, " holds ", t->range().size(),
                     " elements, got ", values->size()),
        absl::StrCat("table ", req.header.table_id())));
  }
  AddSyncContribution(t->config().id, *meta, {}, values->span(), r, ReplyBy(req, Clock::now()));
}

Status PsServer::InitDense(const Message& req, Message* resp) {
  FLEET_ASSIGN_OR_RETURN(DenseTable * table, FindDense(req));
  FLEET_RETURN_IF_ERROR(ExpectFrames(req, {1}, "init_dense"));
  FLEET_ASSIGN_OR_RETURN(SArray<float> values, req.Frame<float>(0));
  FLEET_RETURN_IF_ERROR(CheckFinite(req, "init_dense", {values.span()}));
  FLEET_ASSIGN_OR_RETURN(pb::PsRequestMeta meta, ParseMeta(req));
  Forget(meta.client_id(), meta.acked_below());
  return Logged({.op = LogOp::kDenseAssign,
                 .table = table->config().id,
                 .sender = req.header.sender(),
                 .client = meta.client_id(),
                 .seq = meta.sequence(),
                 .values = values.span()});
}

namespace {

// Whether `path` is `root` or lies below it, after resolving "..", "." and
// the symbolic links of the parts that exist.
bool IsUnder(const std::string& path, const std::string& root) {
  std::error_code ec1, ec2;
  const std::filesystem::path p = std::filesystem::weakly_canonical(path, ec1);
  const std::filesystem::path r = std::filesystem::weakly_canonical(root, ec2);
  if (ec1 || ec2) return false;
  auto pi = p.begin();
  for (auto ri = r.begin(); ri != r.end(); ++ri, ++pi) {
    if (ri->empty()) continue;  // a trailing separator
    if (pi == p.end() || *pi != *ri) return false;
  }
  return true;
}

}  // namespace

Status PsServer::CheckCheckpointPath(const std::string& path, bool load) const {
  // What the job config names: server.save_dir and train.save_dir (the
  // workers' per-epoch saves go below it) for both, server.load_dir for loads.
  const auto& server = options_.job.server;
  std::vector<std::string> roots = {server.save_dir};
  if (load) roots.push_back(server.load_dir);
  try {
    const YAML::Node& root = options_.job.root;
    if (root.IsMap() && root["train"].IsMap() && root["train"]["save_dir"].IsScalar()) {
      roots.push_back(root["train"]["save_dir"].Scalar());
    }
  } catch (const YAML::Exception&) {
    // No train section: the other roots stand.
  }
  for (const std::string& root : roots) {
    if (!root.empty() && IsUnder(path, root)) return Status::OK();
  }
  // A worker holds the job key, not the right to write anywhere the server can.
  return Status::InvalidArgument(
      absl::StrCat(load ? "load" : "save", " refused: the directory is not under the job's ",
                   load ? "server.load_dir, " : "", "server.save_dir or train.save_dir (",
                   absl::StrJoin(roots, ", "), ")"),
      path);
}

Status PsServer::Save(const Message& req, Message* resp) {
  FLEET_ASSIGN_OR_RETURN(pb::PsRequestMeta meta, ParseMeta(req));
  if (meta.path().empty()) return Status::InvalidArgument("save needs a directory");
  FLEET_RETURN_IF_ERROR(CheckCheckpointPath(meta.path(), /*load=*/false));
  // Not at the same time as a recovery checkpoint: both mark the tables'
  // shards while they write them.
  std::unique_lock<std::mutex> lock(log_mu_, std::defer_lock);
  if (!recovery_dir_.empty()) lock.lock();
  return checkpointer_->Save(meta.path(), meta.delta() ? SaveMode::kDelta : SaveMode::kBase,
                             AllTables());
}

Status PsServer::Load(const Message& req, Message* resp) {
  FLEET_ASSIGN_OR_RETURN(pb::PsRequestMeta meta, ParseMeta(req));
  if (meta.path().empty()) return Status::InvalidArgument("load needs a directory");
  FLEET_RETURN_IF_ERROR(CheckCheckpointPath(meta.path(), /*load=*/true));
  if (recovery_dir_.empty()) return checkpointer_->Load(meta.path(), AllTables());
  // The log cannot describe a load: the loaded state becomes a checkpoint.
  std::lock_guard<std::mutex> lock(log_mu_);
  FLEET_RETURN_IF_ERROR(checkpointer_->Load(meta.path(), AllTables()));
  return RecoveryCheckpointLocked();
}

Status PsServer::Shrink(const Message& req, Message* resp) {
  pb::PsShrinkReply reply;
  uint64_t deleted = 0;
  uint32_t which = kAllTables;
  if (req.header.table_id() >= 0) {
    FLEET_ASSIGN_OR_RETURN(SparseTable * table, FindSparse(req));
    which = table->config().id;
  }
  FLEET_ASSIGN_OR_RETURN(pb::PsRequestMeta meta, ParseMeta(req));
  Forget(meta.client_id(), meta.acked_below());
  // A resend of a shrink that was applied reports 0 rows (they are gone).
  FLEET_RETURN_IF_ERROR(Logged({.op = LogOp::kShrink,
                                .table = which,
                                .sender = req.header.sender(),
                                .client = meta.client_id(),
                                .seq = meta.sequence()},
                               &deleted));
  reply.set_rows_deleted(deleted);
  resp->header.set_meta(reply.SerializeAsString());
  return Status::OK();
}

Status PsServer::EndPass(const Message& req, Message* resp) {
  FLEET_ASSIGN_OR_RETURN(pb::PsRequestMeta meta, ParseMeta(req));
  Forget(meta.client_id(), meta.acked_below());
  return Logged({.op = LogOp::kEndPass,
                 .table = kAllTables,
                 .sender = req.header.sender(),
                 .client = meta.client_id(),
                 .seq = meta.sequence()});
}

Status PsServer::Stats(const Message& req, Message* resp) {
  resp->header.set_meta(StatsReply().SerializeAsString());
  return Status::OK();
}

pb::PsStatsReply PsServer::StatsReply() {
  pb::PsStatsReply reply;
  reply.set_server_rank(options_.rank);
  for (int c = 0; c < kCommandKinds; ++c) {
    const Traffic& t = traffic_[c];
    const uint64_t requests = t.requests.load(std::memory_order_relaxed);
    if (requests == 0) continue;
    pb::PsCommandStats* k = reply.add_commands();
    k->set_command(CommandName(static_cast<pb::PsCommand>(c)));
    k->set_requests(requests);
    k->set_bytes_in(t.bytes_in.load(std::memory_order_relaxed));
    k->set_bytes_out(t.bytes_out.load(std::memory_order_relaxed));
    k->set_handling_ns(t.handling_ns.load(std::memory_order_relaxed));
  }
  reply.set_resident_bytes(ResidentBytes());
  reply.set_requests_served(served_.load());
  reply.set_requests_rejected(rejected_.load());
  for (auto& [id, table] : sparse_) {
    const SparseTableStats s = table->Stats();
    auto* t = reply.add_tables();
    t->set_table_id(id);
    t->set_sparse(true);
    t->set_rows(s.rows);
    t->set_bytes(s.bytes);
    t->set_ext_rows(s.ext_rows);
    t->set_pending_keys(s.pending_keys);
    t->set_dropped_pushes(s.dropped_pushes);
  }
  for (auto& [id, table] : dense_) {
    auto* t = reply.add_tables();
    t->set_table_id(id);
    t->set_rows(table->range().size());
    t->set_bytes(table->memory_bytes());
  }
  {
    std::lock_guard<std::mutex> lock(sync_mu_);
    for (pb::PsTableStats& t : *reply.mutable_tables()) {
      auto it = sync_.find(t.table_id());
      t.set_next_sync_step(
          it == sync_.end() || !it->second.merger ? -1 : it->second.merger->next_step());
    }
  }
  return reply;
}

Status PsServer::Stop(const Message& req, Message* resp) {
  LOG(INFO) << "server " << options_.rank << ": stop requested by " << req.header.sender();
  RequestStop();
  return Status::OK();
}

void PsServer::RequestStop() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  stop_requested_ = true;
  stop_cv_.notify_all();
}

bool PsServer::WaitForStopRequest(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(stop_mu_);
  return stop_cv_.wait_for(lock, timeout, [this] { return stop_requested_; });
}

Status PsServer::Shutdown(bool save) {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (shut_down_) return Status::OK();
    shut_down_ = true;
    watch_stop_ = true;
  }
  watch_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  // A server whose Create failed half way has no transport and no
  // checkpointer: destroying it must not crash the program reporting why.
  if (rpc_ == nullptr) return Status::OK();
  Status drained = rpc_->StopServing(options_.shutdown_grace);
  if (!drained.ok()) LOG(WARNING) << "server " << options_.rank << ": " << drained.ToString();
  Status saved;
  const std::string& dir = options_.job.server.save_dir;
  if (save && !dir.empty()) {
    saved = checkpointer_->Save(dir, SaveMode::kBase, AllTables());
    if (saved.ok()) {
      LOG(INFO) << "server " << options_.rank << ": saved checkpoint to " << dir;
    } else {
      LOG(ERROR) << "server " << options_.rank << ": save to " << dir
                 << " failed: " << saved.ToString();
    }
  }
  rpc_->Stop();
  if (!recovery_dir_.empty()) {
    // The recovery checkpoint and log are a consistent state a restart can
    // continue from; once the job finished and its final save is done they
    // are not needed any more.
    std::lock_guard<std::mutex> lock(log_mu_);
    if (log_ != nullptr) {
      if (Status s = log_->Close(); !s.ok()) LOG(WARNING) << "server " << options_.rank << ": " << s.ToString();
      log_.reset();
    }
    if (save && saved.ok() && !options_.job.server.keep_recovery) RemoveRecoveryFiles();
  }
  return saved;
}

}  // namespace fleet::ps
