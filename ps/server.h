// PsServer: one parameter server. It holds this rank's share of every table
// of the job (sparse: a contiguous block of global shards; dense: a
// contiguous range), answers PsCommand requests (ps/ps.proto) over
// an RpcNode, applies optimizer rules, and saves and loads checkpoints.
//
// Modes (JobConfig::distributed.mode):
//   sync   a gradient push is held until every worker's push for that step
//          and table arrived; then the rank-ordered sum is applied once and
//          all of them are answered (so the next pull sees the step);
//   async  a gradient push is applied on arrival;
//   geo    workers push deltas (value += delta), applied on arrival.
// Delta pushes are applied on arrival in every mode.
//
// Bad requests (unknown table, wrong kind, wrong sizes, keys of shards held
// elsewhere, NaN or Inf in a gradient, delta, show/click count or dense
// init, a sync step more than GradientMerger::kMaxStepsAhead ahead of the
// table's next step, a barrier rank or size outside the job's workers) are
// answered with InvalidArgument naming the problem and the table; the
// tables are unchanged and the server keeps serving. New keys beyond a
// table's max_rows_per_server get FailedPrecondition (sparse_table.h).
//
// Waits for other workers are bounded and explained: a sync push waiting
// for a step's other pushes, and a barrier arrival waiting for the others,
// is answered with Timeout shortly before its caller's deadline (the
// request's, i.e. Distributed.timeout_ms; a tenth of it earlier, at most
// 2 s, at least 20 ms), naming the step or barrier, the worker ranks that
// did not arrive and the bound, instead of leaving the caller to report
// "no reply from server N". The step's contributions are dropped.
//
// Crash recovery (job.server.recovery_dir set; JobConfig documents the
// keys): every update is appended to a push log (ps/push_log.h) before it is
// applied and acknowledged: an async/geo gradient or delta push, a sync
// step's merged gradient (once, when the step completes), init_dense,
// shrink and end_pass. Every server.checkpoint_every updates the server
// writes a private checkpoint of its tables with the sync step counters and
// starts a new log; a PS_LOAD is followed by one too. A server created with
// `restarted` loads the newest such checkpoint, replays the log after it
// through the same apply code, restores each table's next sync step, logs
// "recovered table T: ..." and then serves. Updates are serialised under one
// log mutex per server (the log's order is the replay order); a log write
// that fails refuses that update and the following ones until a checkpoint
// starts a new log.
//
// Resends (PsClient, after a lost server or connection): an update or
// barrier request numbered by its client (PsRequestMeta client_id,
// sequence) is recorded when applied; a second request with the same
// number is answered OK without applying it again. The numbers travel in
// the push log and the recovery checkpoint, so a restarted server still
// knows the ones it applied; each client's numbers below its acked_below
// are dropped. A sync push resent as idempotent is recognised by its step
// and slot (GradientMerger). Barriers: a resent arrival replaces the
// earlier one while the barrier waits, and is answered at once if that
// arrival was released (unless server 0 crashed in between).
//
// Files: server.cc creates the server and dispatches requests (pulls,
// pushes, save/load, stats, stop); server_waits.cc holds the callers that
// wait for other workers (sync steps, barriers, the watchdog);
// server_recovery.cc applies, logs and replays updates (push log, recovery
// checkpoints, resend numbers). server_request.h is what they share.
//
// Thread safety: all public methods are thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "comm/buffer_pool.h"
#include "comm/file_system.h"
#include "ps/ps.pb.h"
#include "comm/rpc.h"
#include "comm/thread_pool.h"
#include "ps/checkpoint.h"
#include "ps/job_config.h"
#include "ps/push_log.h"
#include "ps/table/dense_table.h"
#include "ps/table/gradient_merger.h"
#include "ps/table/row_db.h"
#include "ps/table/sparse_table.h"

namespace fleet::ps {

struct PsServerOptions {
  // "ip:port" to listen on; port 0 picks a free port (see Start()).
  std::string endpoint = "127.0.0.1:0";
  int rank = 0;
  int num_servers = 1;
  // Workers that push in sync mode; a step is applied when all arrived.
  int num_workers = 1;
  JobConfig job;
  // Request handler threads (the RpcNode's pool).
  int handler_threads = 2;
  // Checkpoint I/O; nullptr = the real file system.
  FileSystem* fs = nullptr;
  // A restarted server (fleetrun --max_restart): recover from
  // job.server.recovery_dir when set and holding state (see above), else
  // load the newest checkpoint in job.server.save_dir when there is one,
  // instead of starting empty.
  bool restarted = false;
  // How long Shutdown waits for requests already being handled.
  std::chrono::milliseconds shutdown_grace{std::chrono::seconds(10)};
  // The job's credentials for this server's ZeroMQ traffic
  // (VanOptions::auth: every message authenticated); null: plain TCP.
  // Programs pass PsProcess::transport_auth (ps/ps_process.h).
  std::shared_ptr<const JobAuth> auth;
  // With auth: encrypt too, with ZeroMQ CURVE (VanOptions::encrypt; several
  // times the cost on large values). Both sides of a job must agree.
  bool encrypt = false;
  // The memory a sparse table's default row quota is derived from (see
  // DefaultMaxRowsPerServer); 0: this machine's physical memory. For tests.
  uint64_t memory_bytes = 0;
  // How many of the job's servers share this machine (ps_server counts the
  // --servers entries with this server's host); they share the memory the
  // default row quota is derived from.
  int servers_on_host = 1;
};

// The row quota of a sparse table whose config sets no max_rows_per_server:
// half of `memory_bytes`, shared evenly by the `servers_on_host` servers of
// the machine and each server's `sparse_tables`, over what one row costs
// (`row_floats` floats plus kRowOverheadBytes of key, index and counters).
// At least 1. So a runaway or hostile client creating keys without end gets
// a clear FailedPrecondition long before the machine runs out of memory,
// however many servers it runs.
inline constexpr uint64_t kRowOverheadBytes = 64;
uint64_t DefaultMaxRowsPerServer(uint64_t memory_bytes, int servers_on_host, size_t sparse_tables,
                                 size_t row_floats);

// The numbered requests of one client a server applied (PsServer::Claim).
struct AppliedRequests {
  uint64_t floor = 0;       // every number below counts as applied
  std::set<uint64_t> done;  // numbers >= floor applied
};

class PsServer {
 public:
  // Builds the tables of this rank and loads a checkpoint: when `restarted`
  // the newest one in job.server.save_dir if that holds one, else
  // job.server.load_dir when set; with recovery_dir, a restarted server
  // recovers from it first. Checks that job.server.save_dir and
  // recovery_dir (when set) are writable (CheckWritableDir). Errors:
  // InvalidArgument (rank/num_servers, a table config), IOError (save_dir,
  // recovery_dir), the checkpoint errors of Checkpointer::Load, and
  // Corruption naming the file for a damaged recovery step file or push log
  // (a torn last log record is dropped, not an error).
  static Result<std::unique_ptr<PsServer>> Create(PsServerOptions options);
  ~PsServer();  // Shutdown(/*save=*/false) if still running.

  // Starts serving; returns the bound "ip:port". Errors as RpcNode::Listen.
  Result<std::string> Start();

  // Waits until a PS_STOP request arrives or RequestStop() is called, for
  // at most `timeout`. Returns true when stop was requested.
  bool WaitForStopRequest(std::chrono::milliseconds timeout);
  // Makes WaitForStopRequest return (e.g. on SIGTERM). Never blocks.
  void RequestStop();

  // Stops taking requests, lets those being handled finish (up to
  // shutdown_grace), saves a base checkpoint to job.server.save_dir when
  // `save` (the job finished) and that is set, and closes the transport;
  // then, when `save` and the save succeeded, removes the recovery files
  // (unless server.keep_recovery). Idempotent. Returns the save's status.
  Status Shutdown(bool save);

  // One line for the server's log, about the time since the previous call:
  // requests/s by kind, bytes/s in and out, rows and bytes per table, the
  // process's resident memory, and the push log's records a restart would
  // replay. Thread-safe; ps_server logs it every --status_every_s.
  std::string StatusLine();
  // What a PS_STATS request answers: every table's rows and bytes, and the
  // traffic by request kind since the start (requests, bytes, handling
  // time), the resident memory. Thread-safe; ps_server started with a KV
  // store reports it there for fleetrun's /metrics.
  pb::PsStatsReply StatsReply();
  // The KV store key prefix of those reports: stats/server/<rank>.
  static constexpr std::string_view kStatsKeyPrefix = "stats/server/";

  // In-process access for tests and tools. Tables keep serving meanwhile.
  SparseTable* sparse_table(uint32_t id);
  DenseTable* dense_table(uint32_t id);

 private:
  explicit PsServer(PsServerOptions options);
  Status BuildTables();
  Status LoadAtStart();

  // Recovery. Applies one update to the tables: the code both live requests
  // and log replay run. `shrunk` (kShrink) receives the rows deleted.
  Status ApplyRecord(const PushRecordRef& rec, uint64_t* shrunk = nullptr);
  // Logs rec (recovery on) and applies it; a checkpoint may follow.
  Status Logged(const PushRecordRef& rec, uint64_t* shrunk = nullptr);
  // Loads the newest recovery checkpoint and replays its log; false when
  // the recovery dir holds none.
  Result<bool> Recover();
  // Writes a recovery checkpoint and starts its log. REQUIRES: log_mu_ held.
  Status RecoveryCheckpointLocked();
  // Resent requests. Claim records (client, seq) and returns false when it
  // was recorded before (a resend: not to be applied again); Unclaim undoes
  // it when the update failed. Forget drops a client's numbers below
  // acked_below. No-ops for client 0 (not numbered).
  bool Claim(uint64_t client, uint64_t seq);
  // Whether (client, seq) was claimed, without claiming it.
  bool Applied(uint64_t client, uint64_t seq);
  void Unclaim(uint64_t client, uint64_t seq);
  void Forget(uint64_t client, uint64_t acked_below);
  // kBatch: fsyncs the log (from the watchdog tick).
  void SyncLog();
  // Removes <recovery_dir>/s<rank>/ once the job finished. REQUIRES: log_mu_
  // held and the log closed.
  void RemoveRecoveryFiles();
  void RegisterHandlers();

  // One handler per command.
  Status PullSparse(const Message& req, Message* resp);
  void PushSparse(Message req, Responder r, bool delta);
  Status PullDense(const Message& req, Message* resp);
  void PushDense(Message req, Responder r, bool delta);
  Status InitDense(const Message& req, Message* resp);
  void Barrier(Message req, Responder r);
  // Answers, with a Timeout naming who is missing, the sync steps and
  // barriers whose first waiter's reply time has come. Runs on watchdog_.
  void ExpireWaits(std::chrono::steady_clock::time_point now);
  void WatchWaits();
  Status Save(const Message& req, Message* resp);
  Status Load(const Message& req, Message* resp);
  // InvalidArgument unless `path` lies under a directory the job config
  // names for checkpoints (server.save_dir, train.save_dir; for a load also
  // server.load_dir): PS_SAVE and PS_LOAD go nowhere else.
  Status CheckCheckpointPath(const std::string& path, bool load) const;
  Status Shrink(const Message& req, Message* resp);
  Status EndPass(const Message& req, Message* resp);
  Status Stats(const Message& req, Message* resp);
  Status Stop(const Message& req, Message* resp);

  // Sync mode: hands a contribution to the table's merger; replies to every
  // push of the step once it is applied.
  // `meta` gives the step, the slot (worker_rank), the slot count and
  // whether a second push of the slot is dropped (GradientMerger::AddOptions).
  // `reply_by`: when to answer r with a Timeout if the step is incomplete.
  void AddSyncContribution(uint32_t table, const pb::PsRequestMeta& meta,
                           std::span<const uint64_t> keys, std::span<const float> values,
                           Responder r, std::chrono::steady_clock::time_point reply_by);

  Result<SparseTable*> FindSparse(const Message& req);
  // Whether a sparse pull/push is cheap enough to run on the I/O thread.
  bool IsSmallSparseRequest(const Message& req) const;
  Result<DenseTable*> FindDense(const Message& req);
  ServerTables AllTables();

  // Fixed after construction.
  const PsServerOptions options_;
  std::unique_ptr<FileSystem> owned_fs_;
  FileSystem* fs_ = nullptr;
  std::unique_ptr<ThreadPool> table_pool_;
  // The disk tier's databases (tables with storage.kind ssd), one per path.
  std::unique_ptr<RowDbSet> row_dbs_;
  std::map<uint32_t, std::unique_ptr<SparseTable>> sparse_;
  std::map<uint32_t, std::unique_ptr<DenseTable>> dense_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<RpcNode> rpc_;
  // Pull replies of 64 KiB and more (BufferPool: a fresh buffer faults in
  // every page); owns its own synchronisation.
  const std::shared_ptr<BufferPool> reply_buffers_ = BufferPool::Create();

  // A caller waiting for others: answered by the arrival that completes its
  // step or barrier, or with a Timeout at reply_by (ExpireWaits).
  struct Waiter {
    Responder responder;
    std::chrono::steady_clock::time_point reply_by;
    uint64_t client = 0;  // barriers: the arrival's number (Claim)
    uint64_t seq = 0;
  };

  // Sync mode; guarded by sync_mu_. A step's responders are answered by the
  // contribution that completes it, under the same lock, so none is missed.
  struct SyncTable {
    std::unique_ptr<GradientMerger> merger;
    std::map<int64_t, std::vector<Waiter>> waiting;
  };
  std::mutex sync_mu_;
  std::map<uint32_t, SyncTable> sync_;
  // The step the merger callback is applying (set before GradientMerger::Add).
  int64_t sync_applying_step_ = -1;

  // Recovery (server.recovery_dir); fixed after construction.
  std::string recovery_dir_;  // <recovery_dir>/s<rank>; empty: off
  std::unique_ptr<Checkpointer> recovery_ckpt_;
  // Guarded by log_mu_; every logged update holds it from append to apply.
  std::mutex log_mu_;
  std::unique_ptr<PushLog> log_;
  bool log_broken_ = false;  // a write or sync failed: updates refused
  int64_t since_checkpoint_ = 0;
  std::map<uint32_t, int64_t> next_step_;  // sync tables' next step

  // Numbers of the requests applied, per client (Claim); guarded by
  // seen_mu_, and changed under log_mu_ too when recovery is on, so a
  // recovery checkpoint (under log_mu_) stores them consistently.
  std::mutex seen_mu_;
  std::map<uint64_t, AppliedRequests> seen_;

  // Barriers: name -> callers waiting, by worker rank, and the barrier's
  // size; guarded by barrier_mu_.
  struct BarrierWait {
    int size = 0;
    std::map<int, Waiter> arrived;  // waiting for the others
    // Every rank that arrived in this round, also those already answered at
    // their own deadline: a timeout names only the ranks that never came
    // (it once named a rank answered one watch tick earlier as missing).
    std::set<int> came;
  };
  std::mutex barrier_mu_;
  std::map<std::string, BarrierWait> barriers_;

  // Lifecycle; guarded by stop_mu_.
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_requested_ = false;
  bool shut_down_ = false;

  // The thread running WatchWaits from Start() until Shutdown(); it stops
  // when watch_stop_ is set (guarded by stop_mu_, signalled on watch_cv_).
  std::thread watchdog_;
  std::condition_variable watch_cv_;
  bool watch_stop_ = false;

  std::atomic<uint64_t> served_{0};
  std::atomic<uint64_t> rejected_{0};

  // Traffic by request kind (indexed by pb::PsCommand), for StatusLine.
  struct Traffic {
    std::atomic<uint64_t> requests{0};
    std::atomic<uint64_t> bytes_in{0};
    std::atomic<uint64_t> bytes_out{0};    // replies with a payload (pulls, stats)
    std::atomic<uint64_t> handling_ns{0};  // time in the handlers
  };
  static constexpr int kCommandKinds = pb::PsCommand_ARRAYSIZE;
  std::array<Traffic, kCommandKinds> traffic_;
  // Counts a request handled in `handling` (its reply `resp`, when answered
  // at once).
  void Count(pb::PsCommand command, const Message& req, const Message* resp,
             std::chrono::steady_clock::duration handling);
  // StatusLine's previous snapshot; guarded by status_mu_.
  std::mutex status_mu_;
  std::chrono::steady_clock::time_point status_at_ = std::chrono::steady_clock::now();
  std::array<uint64_t, kCommandKinds> status_requests_{};
  uint64_t status_bytes_in_ = 0, status_bytes_out_ = 0;
};

}  // namespace fleet::ps
