// PsClient: what every worker uses to talk to the parameter servers. It
// knows the job's tables (the same JobConfig the servers read), so it can
// route each sparse key to the server holding its shard and split dense
// tables into the servers' ranges, and it contacts all servers in parallel.
//
// Sparse requests: keys are de-duplicated before sending (a pull fetches
// each key once and copies it to every position it appears at; a push sums
// the gradients, shows and clicks of duplicate keys). Any key order and
// duplicates are fine; keys in strictly increasing order (sorted, unique:
// what ps-lite demands) skip the de-duplication table, and with one server
// their values move in one block.
//
// Buffer lifetime: the blocking calls are done with caller buffers when they
// return. The *Async calls read `keys`/`grads` before returning, but write
// pull results into `values` until their future is ready: keep `values`
// alive and untouched until then. The Z* calls take SArrays and send dense
// slices without copying (the SArray is shared with the transport until the
// servers have it).
//
// A lost server (crash recovery; server.recovery_dir set and
// Distributed.server_restart_timeout_ms > 0): a request that fails with
// Unavailable because its server, reached before, went away is sent again
// to the same server (a new request id; a late reply to the old one is
// dropped by RpcNode) every 50-500 ms until it is answered or the restart
// window has passed since its first failure; then the call fails with
// Unavailable naming the server, the window and the first failure. A
// blocking call may so block for up to that window more. Resends are never
// applied twice: a sync gradient push is resent as `idempotent` (the server
// knows the steps it applied and the slots it holds); updates and barriers
// carry this client's id and a per-request number that the server records
// (in its push log too, so a restarted server remembers) and answers again
// without applying. Pulls, stats and save/load are resent as they are.
// A peer never reached is not waited for (RpcNodeOptions::connect_timeout).
//
// Errors of every call: Timeout / Unavailable naming the server endpoint and
// the call (see RpcNode), InvalidArgument for sizes that do not fit the
// table (nothing sent), NotFound for an unknown table id, or the status a
// server replied with, prefixed with the call and the server's rank. On a
// failed pull the contents of `values` are unspecified.
//
// Thread safety: every method is thread-safe.
#pragma once

#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/container/btree_set.h"
#include "comm/buffer_pool.h"
#include "ps/ps.pb.h"
#include "comm/rpc.h"
#include "ps/job_config.h"

namespace fleet::ps {

struct PsClientOptions {
  std::vector<std::string> servers;  // "ip:port" of server rank 0, 1, ...
  int worker_rank = 0;
  // Workers of the job; sizes barriers.
  int num_workers = 1;
  // Used in server logs and errors; default "worker:<rank>".
  std::string name;
  // The job's credentials for this client's ZeroMQ traffic
  // (VanOptions::auth: every message authenticated); null: plain TCP.
  // Programs pass PsProcess::transport_auth (ps/ps_process.h).
  std::shared_ptr<const JobAuth> auth;
  // With auth: encrypt too, with ZeroMQ CURVE (VanOptions::encrypt; several
  // times the cost on large values). Both sides of a job must agree.
  bool encrypt = false;
};

// Per-call options. timeout 0 = JobConfig Distributed.timeout_ms.
struct PullOptions {
  std::chrono::milliseconds timeout{0};
};

struct PushOptions {
  std::chrono::milliseconds timeout{0};
  // Sync mode: the step the gradient belongs to (required there, >= 0).
  int64_t step = -1;
  // Sync mode: the slot this push fills in its step (-1: the client's
  // worker_rank) and how many slots a step has (0: the servers' worker
  // count). A heter worker pushes the dense gradient of micro-batch m of
  // CPU worker w's step as slot w * M + m of W * M.
  int contributor = -1;
  int contributors = 0;
  // Sync mode: a second push of the same step and slot is dropped and
  // answered as the first one is, instead of refused (a micro-batch resent
  // after its heter worker failed is applied once).
  bool idempotent = false;
  // CTR accessor: one show and one click count per key (empty = show 1,
  // click 0 for every key).
  std::span<const float> shows;
  std::span<const float> clicks;
};

struct BarrierOptions {
  std::chrono::milliseconds timeout{0};
  // Callers the barrier waits for; 0 = num_workers.
  int size = 0;
};

class PsClient {
 public:
  // Connects (lazily: nothing waits for the servers here).
  // Errors: InvalidArgument for an empty server list, a malformed endpoint,
  // or a table config that cannot be split over that many servers.
  static Result<std::unique_ptr<PsClient>> Create(PsClientOptions options, const JobConfig& job);
  ~PsClient();

  // ---- Sparse ----
  // values: keys.size() * PullDim(table) floats.
  Status PullSparse(uint32_t table, std::span<const uint64_t> keys, std::span<float> values,
                    const PullOptions& options = {});
  std::future<Status> PullSparseAsync(uint32_t table, std::span<const uint64_t> keys,
                                      std::span<float> values, const PullOptions& options = {});
  // grads: keys.size() * PushDim(table) floats.
  Status PushSparseGrad(uint32_t table, std::span<const uint64_t> keys,
                        std::span<const float> grads, const PushOptions& options = {});
  std::future<Status> PushSparseGradAsync(uint32_t table, std::span<const uint64_t> keys,
                                          std::span<const float> grads,
                                          const PushOptions& options = {});
  // Zero-copy pushes (ps-lite's ZPush): when each server's keys are a run
  // of the request (keys in strictly increasing order, with one server or a
  // table of `partition: range`), the frames are segments of `keys` and
  // `grads` themselves, shared with the transport; otherwise they are
  // gathered as above. The caller must not change the arrays' elements
  // until the call returned (blocking) or its future is ready; the SArrays
  // keep the memory alive for the transport, which may hold it a little
  // longer (a lost or timed-out request).
  Status PushSparseGrad(uint32_t table, const SArray<uint64_t>& keys, const SArray<float>& grads,
                        const PushOptions& options = {});
  std::future<Status> ZPushSparseGrad(uint32_t table, const SArray<uint64_t>& keys,
                                      const SArray<float>& grads, const PushOptions& options = {});
  // Geo: value += delta for each key.
  Status PushSparseDelta(uint32_t table, std::span<const uint64_t> keys,
                         std::span<const float> deltas, const PushOptions& options = {});

  // ---- Dense ----
  // values: the whole table (config dim floats).
  Status PullDense(uint32_t table, std::span<float> values, const PullOptions& options = {});
  std::future<Status> PullDenseAsync(uint32_t table, std::span<float> values,
                                     const PullOptions& options = {});
  Status PushDenseGrad(uint32_t table, std::span<const float> grads,
                       const PushOptions& options = {});
  // Zero-copy: each server's slice is a view of `grads`.
  std::future<Status> ZPushDenseGrad(uint32_t table, SArray<float> grads,
                                     const PushOptions& options = {});
  Status PushDenseDelta(uint32_t table, std::span<const float> deltas,
                        const PushOptions& options = {});
  // Sets the table's values (worker 0 does this once, so every worker starts
  // from the model's own initialisation).
  Status InitDense(uint32_t table, std::span<const float> values);

  // ---- Control ----
  // Blocks until `size` callers reached barrier `name` on server 0.
  Status Barrier(const std::string& name, const BarrierOptions& options = {});
  // Every server saves its part into dir (a base, or a delta on the last save).
  Status Save(const std::string& dir, bool delta, std::chrono::milliseconds timeout = {});
  Status Load(const std::string& dir, std::chrono::milliseconds timeout = {});
  // Deletes stale rows of one sparse table (all when table < 0); returns rows deleted.
  Result<uint64_t> Shrink(int table);
  Status EndPass();
  // One reply per server, in server rank order.
  Result<std::vector<pb::PsStatsReply>> Stats();
  // Asks every server to stop (each saves first when its config says so).
  Status StopServers();
  // Ends every call in flight now, and every later one at once, with
  // Unavailable ("rpc node stopped"): for a process told to stop while a
  // call waits on a peer that may never answer (a frozen server). No resend
  // follows. Thread-safe, idempotent; the client is unusable afterwards.
  void Abort();

  // Blocks for a future returned by this client's *Async calls, receiving
  // replies on this thread meanwhile (cheaper than future.get(): see
  // RpcNode::Await). timeout 0 = the job's timeout; it bounds the helping,
  // the future itself completes by its calls' deadlines.
  Status Wait(std::future<Status> f, std::chrono::milliseconds timeout = {}) const;

  size_t PullDim(uint32_t table) const;
  size_t PushDim(uint32_t table) const;
  int num_servers() const { return static_cast<int>(peers_.size()); }
  const JobConfig& job() const { return job_; }

 private:
  struct TableRoute;
  struct Gather;
  // One request, sent (and resent, see above) until it has its answer.
  struct Attempt;
  // Runs delayed resends on its own thread.
  class Resender;

  PsClient(PsClientOptions options, JobConfig job);
  Result<const TableRoute*> Route(uint32_t table, bool sparse) const;
  // Route() of a dense table, and InvalidArgument "<what>: table has N
  // elements, buffer has M" unless buffer_size is the table's size.
  Result<const TableRoute*> DenseRoute(uint32_t table, size_t buffer_size, const char* what) const;
  std::chrono::milliseconds TimeoutOr(std::chrono::milliseconds t) const;
  // A blocking call: issue() makes the calls and returns their future,
  // run inside RpcNode::IssueAndAwait so replies come to this thread.
  Status Blocking(const std::function<std::future<Status>()>& issue,
                  std::chrono::milliseconds timeout) const;
  Message NewRequest(pb::PsCommand command, int table, const pb::PsRequestMeta& meta) const;
  // The same with the meta serialized already (once for a call's requests).
  Message NewRequest(pb::PsCommand command, int table, const std::string& meta) const;
  // The metadata of a gradient or delta push.
  pb::PsRequestMeta PushMeta(const PushOptions& options) const;
  // One request of a call. `part` names it among several to one server
  // in errors (" (part 2 of 4)"), or is empty.
  struct Outgoing {
    int server;
    Message request;
    std::string part;
  };
  // Sends `count` requests, each made by make(i) right before it is sent
  // (so making the later ones overlaps sending the first), and completes
  // the returned future when all answered; on_reply(i, reply) runs for
  // each successful reply to request i (on the thread receiving it;
  // replies may be handled in any order) and its error, if any, becomes
  // the call's.
  std::future<Status> SendAll(size_t count, const std::function<Outgoing(size_t index)>& make,
                              std::chrono::milliseconds timeout, const std::string& what,
                              std::function<Status(size_t index, const Message&)> on_reply);
  // SendAll of one request per server in `requests` (nullopt = skip that
  // server), with on_reply given the server.
  std::future<Status> Broadcast(std::vector<std::optional<Message>> requests,
                                std::chrono::milliseconds timeout, const std::string& what,
                                std::function<Status(int server, const Message&)> on_reply);
  // `shared_keys` / `shared_values` (both or neither): the same arrays as
  // `keys` / `values`, sent without copying when the split allows.
  std::future<Status> SendSparse(pb::PsCommand command, uint32_t table,
                                 std::span<const uint64_t> keys, std::span<const float> values,
                                 const PushOptions& options,
                                 const SArray<uint64_t>* shared_keys = nullptr,
                                 const SArray<float>* shared_values = nullptr);
  std::future<Status> SendDense(pb::PsCommand command, uint32_t table, SArray<float> values,
                                const PushOptions& options);
  // A copy of a blocking call's values that the transport may keep.
  SArray<float> PooledCopy(std::span<const float> values) const;
  // Sends a (again) and hands its outcome to OnAttemptDone.
  void Issue(std::shared_ptr<Attempt> a);
  // Resends a after a lost server while the restart window lasts, else
  // completes it.
  void OnAttemptDone(const std::shared_ptr<Attempt>& a, Result<Message> reply);
  // Gives an update or barrier request this client's id and its number
  // (PsRequestMeta); returns the number, 0 for other commands.
  uint64_t Number(Message* request);
  Status BroadcastControl(pb::PsCommand command, int table, const pb::PsRequestMeta& meta,
                          std::chrono::milliseconds timeout, const std::string& what,
                          std::vector<Message>* replies = nullptr);

  // Fixed after construction.
  const PsClientOptions options_;
  const JobConfig job_;
  std::unique_ptr<RpcNode> rpc_;
  std::vector<int> peers_;  // peer id of server rank r
  std::vector<std::unique_ptr<TableRoute>> routes_;
  const uint64_t client_id_;  // random, non-zero: names this client to servers
  // Null when resends are off (no server.recovery_dir, or a zero window).
  std::unique_ptr<Resender> resender_;
  // Gathered push values of 64 KiB and more (a fresh buffer faults in every
  // page); owns its own synchronisation.
  const std::shared_ptr<BufferPool> push_buffers_ = BufferPool::Create();

  // When each server was first seen lost in its current outage (ms on the
  // steady clock; 0: not lost). Logs the outage once and its end once.
  std::unique_ptr<std::atomic<int64_t>[]> lost_since_ms_;

  // Numbers of update and barrier requests; guarded by seq_mu_.
  std::mutex seq_mu_;
  uint64_t next_seq_ = 1;
  absl::btree_set<uint64_t> outstanding_;  // numbered and not answered yet
};

}  // namespace fleet::ps
