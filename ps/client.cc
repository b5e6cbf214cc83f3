#include "ps/client.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <map>
#include <random>
#include <thread>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ps/key_dedup.h"
#include "ps/table/accessor.h"
#include "ps/table/float_rows.h"
#include "ps/table/partition.h"

namespace fleet::ps {
namespace {

// The future of a call refused before anything was sent.
std::future<Status> Ready(Status s) {
  std::promise<Status> p;
  p.set_value(std::move(s));
  return p.get_future();
}

using Clock = std::chrono::steady_clock;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
      .count();
}

uint64_t RandomClientId() {
  std::random_device rd;
  uint64_t id = 0;
  while (id == 0) id = (uint64_t{rd()} << 32) ^ rd();
  return id;
}

// Commands whose resend the server must recognise (PsRequestMeta::sequence):
// updates applied on arrival, and barriers (a resent arrival at a barrier
// that was released meanwhile is answered, not counted for the next round).
// Sync gradient pushes are recognised by step and slot instead; numbering
// them too is harmless.
bool IsNumbered(uint32_t command) {
  switch (command) {
    case pb::PS_PUSH_SPARSE_GRAD:
    case pb::PS_PUSH_SPARSE_DELTA:
    case pb::PS_PUSH_DENSE_GRAD:
    case pb::PS_PUSH_DENSE_DELTA:
    case pb::PS_INIT_DENSE:
    case pb::PS_SHRINK:
    case pb::PS_END_PASS:
    case pb::PS_BARRIER:
      return true;
    default:
      return false;
  }
}

// Sync mode applies a gradient to the step it names.
Status RequireStepInSyncMode(bool sync, const PushOptions& options, uint32_t table) {
  if (sync && options.step < 0) {
    return Status::InvalidArgument("sync mode needs PushOptions.step >= 0",
                                   absl::StrCat("table ", table));
  }
  return Status::OK();
}

}  // namespace

// Where a table's data lives.
struct PsClient::TableRoute {
  uint32_t id = 0;
  bool sparse = false;
  size_t pull_dim = 0;
  size_t push_dim = 0;
  std::optional<KeySharder> sharder;      // sparse: key -> global shard
  std::vector<uint16_t> server_of_shard;  // sparse: global shard -> server rank
  // Sparse with the range partition: server rank -> its smallest key (the
  // servers' key ranges follow each other in rank order).
  std::vector<uint64_t> first_key_of_server;
  std::vector<DenseRange> ranges;         // dense: server rank -> range
};

// Completion of one request per server: the future is set when the last
// reply (or error) arrived, with the first error seen.
struct PsClient::Gather {
  std::promise<Status> promise;
  std::atomic<int> remaining{0};
  // Checks one reply (by the request's index), or null: kept once for the
  // call rather than copied into each request (a copy is an allocation).
  // Called from several threads at once, on distinct indices.
  std::function<Status(size_t index, const Message&)> on_reply;
  std::mutex mu;
  Status first_error;             // guarded by mu
  bool error_unanswered = false;  // guarded by mu: first_error is a server's silence

  // Reports the first error, but a server that did not answer (`unanswered`:
  // no reply by the deadline, connection lost) outranks one that answered
  // with an error: a live server's "sync step: no push from worker K" comes
  // a tenth before the deadline and is often only the consequence of worker
  // K waiting on the silent server, which the job's message must name.
  void Finish(const Status& s, bool unanswered = false) {
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (first_error.ok() || (unanswered && !error_unanswered)) {
        first_error = s;
        error_unanswered = unanswered;
      }
    }
    if (remaining.fetch_sub(1) == 1) {
      std::lock_guard<std::mutex> lock(mu);
      promise.set_value(first_error);
    }
  }

  // The outcome of request `index`, named `what` in errors.
  void Complete(size_t index, const std::string& what, const Result<Message>& reply) {
    if (!reply.ok()) {
      // The rpc layer's own errors (no reply by the deadline, lost
      // connection) already start with the call's name; a server's error
      // reply does not.
      const Status& s = reply.status();
      const bool unanswered = absl::StartsWith(s.message(), what);
      Finish(unanswered ? s : s.WithContext(what), unanswered);
      return;
    }
    Finish(on_reply ? on_reply(index, reply.value()) : Status::OK());
  }
};

struct PsClient::Attempt {
  int server = 0;
  Message request;  // kept for resends (its frames are shared, not copied)
  RpcOptions rpc;
  uint64_t seq = 0;  // Number(); 0: not numbered
  int resends = 0;
  Clock::time_point lost_at;  // first failure (valid when resends > 0)
  Status first_failure;
  // The call this request is part of, and its index there.
  std::shared_ptr<Gather> gather;
  size_t index = 0;
};

class PsClient::Resender {
 public:
  Resender() : thread_([this] { Run(); }) {}
  ~Resender() { Stop(); }

  // Runs fn(true) on the resend thread at `due`, or fn(false) from Stop()
  // if that comes first. False (fn not kept) once stopped.
  bool Schedule(Clock::time_point due, std::function<void(bool run)> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return false;
      queue_.emplace(due, std::move(fn));
    }
    cv_.notify_one();
    return true;
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    cv_.notify_one();
    thread_.join();
    // The thread is gone and Schedule refuses: the queue is ours.
    for (auto& [due, fn] : queue_) fn(false);
    queue_.clear();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopped_) {
      // Idle waits are bounded too; nothing is due then.
      const Clock::time_point due =
          queue_.empty() ? Clock::now() + std::chrono::seconds(1) : queue_.begin()->first;
      if (due > Clock::now()) {
        cv_.wait_until(lock, due);
        continue;
      }
      auto fn = std::move(queue_.begin()->second);
      queue_.erase(queue_.begin());
      lock.unlock();
      fn(true);
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<Clock::time_point, std::function<void(bool run)>> queue_;  // guarded by mu_
  bool stopped_ = false;                                                   // guarded by mu_
  std::thread thread_;  // last: starts once the rest is built
};

PsClient::PsClient(PsClientOptions options, JobConfig job)
    : options_(std::move(options)), job_(std::move(job)), client_id_(RandomClientId()) {}

PsClient::~PsClient() { Abort(); }

void PsClient::Abort() {
  // Queued resends fail first; then stopping the node fails the calls in
  // flight, whose OnAttemptDone finds the resender stopped and completes them.
  if (resender_) resender_->Stop();
  if (rpc_) rpc_->Stop();
}

Result<std::unique_ptr<PsClient>> PsClient::Create(PsClientOptions options, const JobConfig& job) {
  if (options.servers.empty()) return Status::InvalidArgument("no parameter servers given");
  if (options.servers.size() > 65535) return Status::InvalidArgument("more than 65535 servers");
  if (options.name.empty()) options.name = absl::StrCat("worker:", options.worker_rank);
  std::unique_ptr<PsClient> client(new PsClient(std::move(options), job));
  const int num_servers = static_cast<int>(client->options_.servers.size());
  for (const TableConfig& config : job.tables) {
    auto route = std::make_unique<TableRoute>();
    route->id = config.id;
    route->sparse = config.kind == TableKind::kSparse;
    const std::string which = absl::StrCat("table ", config.id);
    if (route->sparse) {
      if (Status s = ValidateTableConfig(config); !s.ok()) return s.WithContext(which);
      route->sharder.emplace(config.shard_num, config.partition);
      const auto accessor = MakeAccessor(config);
      route->pull_dim = accessor->pull_dim();
      route->push_dim = accessor->push_dim();
      route->server_of_shard.resize(config.shard_num);
      for (int r = 0; r < num_servers; ++r) {
        auto shards = AssignShards(config.shard_num, num_servers, r);
        if (!shards.ok()) return shards.status().WithContext(which);
        for (uint32_t s = shards->begin; s < shards->end; ++s) route->server_of_shard[s] = r;
        if (config.partition == Partition::kRange)
          route->first_key_of_server.push_back(FirstKeyOfShard(shards->begin, config.shard_num));
      }
    } else {
      route->pull_dim = route->push_dim = 1;
      for (int r = 0; r < num_servers; ++r) {
        auto range = SplitDenseRange(config.dim, num_servers, r);
        if (!range.ok()) return range.status().WithContext(which);
        route->ranges.push_back(range.value());
      }
    }
    client->routes_.push_back(std::move(route));
  }
  RpcNodeOptions rpc;
  rpc.name = client->options_.name;
  rpc.handler_threads = 1;  // a client serves nothing
  rpc.default_timeout = job.distributed.timeout;
  rpc.van = JobVanOptions(job, client->options_.auth, client->options_.encrypt);
  FLEET_ASSIGN_OR_RETURN(client->rpc_, RpcNode::Create(rpc));
  for (const std::string& endpoint : client->options_.servers) {
    auto peer = client->rpc_->Connect(endpoint);
    if (!peer.ok()) return peer.status().WithContext("parameter server list");
    client->peers_.push_back(peer.value());
  }
  client->lost_since_ms_ = std::make_unique<std::atomic<int64_t>[]>(num_servers);
  for (int s = 0; s < num_servers; ++s) client->lost_since_ms_[s].store(0);
  // Waiting for a lost server only makes sense when it comes back holding
  // every acknowledged update; without recovery it would come back empty.
  if (!job.server.recovery_dir.empty() && job.distributed.server_restart_timeout.count() > 0) {
    client->resender_ = std::make_unique<Resender>();
  }
  return client;
}

Result<const PsClient::TableRoute*> PsClient::Route(uint32_t table, bool sparse) const {
  for (const auto& r : routes_) {
    if (r->id != table) continue;
    if (r->sparse != sparse) {
      return Status::InvalidArgument(
          sparse ? "table is dense, call is for a sparse table"
                 : "table is sparse, call is for a dense table",
          absl::StrCat("table ", table));
    }
    return r.get();
  }
  return Status::NotFound("no such table in the job config", absl::StrCat("table ", table));
}

Result<const PsClient::TableRoute*> PsClient::DenseRoute(uint32_t table, size_t buffer_size,
                                                         const char* what) const {
  FLEET_ASSIGN_OR_RETURN(const TableRoute* r, Route(table, /*sparse=*/false));
  if (buffer_size != r->ranges.back().end) {
    return Status::InvalidArgument(absl::StrCat(what, ": table has ", r->ranges.back().end,
                                                " elements, buffer has ", buffer_size),
                                   absl::StrCat("table ", table));
  }
  return r;
}

size_t PsClient::PullDim(uint32_t table) const {
  for (const auto& r : routes_) {
    if (r->id == table) return r->pull_dim;
  }
  return 0;
}

size_t PsClient::PushDim(uint32_t table) const {
  for (const auto& r : routes_) {
    if (r->id == table) return r->push_dim;
  }
  return 0;
}

Status PsClient::Blocking(const std::function<std::future<Status>()>& issue,
                          std::chrono::milliseconds timeout) const {
  return rpc_->IssueAndAwait(issue, TimeoutOr(timeout));
}

Status PsClient::Wait(std::future<Status> f, std::chrono::milliseconds timeout) const {
  return rpc_->Await(std::move(f), TimeoutOr(timeout));
}

std::chrono::milliseconds PsClient::TimeoutOr(std::chrono::milliseconds t) const {
  return t.count() > 0 ? t : job_.distributed.timeout;
}

Message PsClient::NewRequest(pb::PsCommand command, int table,
                             const pb::PsRequestMeta& meta) const {
  return NewRequest(command, table, meta.SerializeAsString());
}

Message PsClient::NewRequest(pb::PsCommand command, int table, const std::string& meta) const {
  Message m;
  m.header.set_command(command);
  m.header.set_table_id(table);
  m.header.set_meta(meta);
  return m;
}

pb::PsRequestMeta PsClient::PushMeta(const PushOptions& options) const {
  pb::PsRequestMeta meta;
  meta.set_worker_rank(options.contributor >= 0 ? options.contributor : options_.worker_rank);
  meta.set_step(options.step);
  meta.set_contributors(options.contributors);
  meta.set_idempotent(options.idempotent);
  return meta;
}

std::future<Status> PsClient::SendAll(
    size_t count, const std::function<Outgoing(size_t index)>& make,
    std::chrono::milliseconds timeout, const std::string& what,
    std::function<Status(size_t index, const Message&)> on_reply) {
  auto gather = std::make_shared<Gather>();
  gather->on_reply = std::move(on_reply);
  auto future = gather->promise.get_future();
  if (count == 0) {
    gather->promise.set_value(Status::OK());
    return future;
  }
  gather->remaining.store(static_cast<int>(count));
  for (size_t index = 0; index < count; ++index) {
    Outgoing out = make(index);
    auto a = std::make_shared<Attempt>();
    a->server = out.server;
    a->request = std::move(out.request);
    a->rpc.timeout = timeout;
    a->rpc.what = absl::StrCat(what, " on server ", out.server, out.part);
    if (resender_) a->seq = Number(&a->request);
    a->gather = gather;
    a->index = index;
    Issue(std::move(a));
  }
  return future;
}

uint64_t PsClient::Number(Message* request) {
  if (!IsNumbered(request->header.command())) return 0;
  pb::PsRequestMeta numbering;
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(seq_mu_);
    seq = next_seq_++;
    outstanding_.insert(seq);
    numbering.set_acked_below(*outstanding_.begin());
  }
  numbering.set_client_id(client_id_);
  numbering.set_sequence(seq);
  // Appended to the serialized meta rather than parsed and serialized
  // again: a parser merges the fields of concatenated messages, a later
  // value of a field replacing an earlier one, so the result reads as the
  // meta with these three set, without a parse and a second serialization
  // per request (numbered requests: with a recovery_dir only).
  numbering.AppendToString(request->header.mutable_meta());
  return seq;
}

void PsClient::Issue(std::shared_ptr<Attempt> a) {
  // Without resends the request is sent once and need not be kept.
  Message m = resender_ ? a->request : std::move(a->request);
  const int peer = peers_[a->server];
  // Not a copy: CallAsync reads it before `done` (which owns `a`) may run.
  const RpcOptions& rpc = a->rpc;
  rpc_->CallAsync(peer, std::move(m), rpc,
                  [this, a = std::move(a)](Result<Message> reply) mutable {
                    OnAttemptDone(a, std::move(reply));
                  });
}

void PsClient::OnAttemptDone(const std::shared_ptr<Attempt>& a, Result<Message> reply) {
  const int server = a->server;
  const std::string& endpoint = options_.servers[server];
  // Only a server reached before and lost since is waited for: one never
  // reached is a wrong address or a server that did not start, reported at
  // once as before.
  if (resender_ && !reply.ok() && reply.status().IsUnavailable() &&
      rpc_->PeerEverReached(peers_[server])) {
    const auto now = Clock::now();
    const auto window = job_.distributed.server_restart_timeout;
    if (a->resends == 0) {
      a->lost_at = now;
      a->first_failure = reply.status();
      int64_t up = 0;
      if (lost_since_ms_[server].compare_exchange_strong(up, NowMs())) {
        LOG(WARNING) << options_.name << ": parameter server " << server << " (" << endpoint
                     << ") lost: " << reply.status().ToString() << "; resending its calls for up to "
                     << window.count() << " ms (Distributed.server_restart_timeout_ms)";
      }
      // A sync push may have been merged, or its step applied, before the
      // reply was lost: the resend must be answered, not refused or re-added.
      pb::PsRequestMeta meta;
      if (meta.ParseFromString(a->request.header.meta())) {
        meta.set_idempotent(true);
        a->request.header.set_meta(meta.SerializeAsString());
      }
    }
    if (now - a->lost_at < window) {
      // Backoff 50, 100, 200, 400, then 500 ms: a restart takes a second or
      // more, and while the connection is down each try fails at once.
      const auto delay = std::min(std::chrono::milliseconds(50 << std::min(a->resends, 4)),
                                  std::chrono::milliseconds(500));
      ++a->resends;
      if (resender_->Schedule(now + delay, [this, a](bool run) {
            if (run) {
              Issue(a);
            } else {
              OnAttemptDone(a, Status::Unavailable("ps client shut down while resending",
                                                   options_.servers[a->server]));
            }
          })) {
        return;
      }
      // The client is shutting down: complete with this failure.
    } else {
      reply = Status::Unavailable(
          absl::StrCat("parameter server ", server, " did not come back within ", window.count(),
                       " ms (Distributed.server_restart_timeout_ms) after it was lost (",
                       a->first_failure.ToString(), "); ", a->resends, " resends"),
          endpoint);
    }
  } else if (a->resends > 0 && reply.ok()) {
    if (const int64_t since = lost_since_ms_[server].exchange(0); since != 0) {
      LOG(WARNING) << options_.name << ": parameter server " << server << " (" << endpoint
                   << ") answers again " << NowMs() - since << " ms after it was lost";
    }
  }
  if (a->seq != 0) {
    std::lock_guard<std::mutex> lock(seq_mu_);
    outstanding_.erase(a->seq);
  }
  a->gather->Complete(a->index, a->rpc.what, reply);
}

std::future<Status> PsClient::Broadcast(
    std::vector<std::optional<Message>> requests, std::chrono::milliseconds timeout,
    const std::string& what, std::function<Status(int server, const Message&)> on_reply) {
  std::vector<Outgoing> outgoing;
  std::vector<int> server_of;
  for (size_t server = 0; server < requests.size(); ++server) {
    if (!requests[server]) continue;
    outgoing.push_back({static_cast<int>(server), std::move(*requests[server]), ""});
    server_of.push_back(static_cast<int>(server));
  }
  std::function<Status(size_t, const Message&)> by_index;
  if (on_reply) {
    by_index = [on_reply, server_of = std::move(server_of)](size_t index, const Message& reply) {
      return on_reply(server_of[index], reply);
    };
  }
  return SendAll(
      outgoing.size(), [&](size_t index) { return std::move(outgoing[index]); }, timeout, what,
      std::move(by_index));
}

namespace {

// Keys of one request grouped by server, each distinct key once.
struct SparseSplit {
  // Per server: the distinct keys it gets, frame-ready.
  std::vector<SArray<uint64_t>> keys;
  // For each key of the request: its server and its position in
  // keys[server]. Positions are handed out in order of first occurrence.
  // Only when a key repeats (`source` says the same otherwise).
  std::vector<uint16_t> server;
  std::vector<uint32_t> position;
  // No key repeated, and each server's keys one run of the request (one
  // server; or the range partition and keys in increasing order): server s
  // gets the request's keys [run_bounds[s], run_bounds[s + 1]), in order,
  // and values move between the request and the frames in blocks. keys[s]
  // may be left empty (the caller sends segments of its own array).
  bool runs = false;
  // Inline for the usual few servers: no allocation a request.
  absl::InlinedVector<uint32_t, 9> run_bounds;

  // No key repeated, not runs: the request index of each server's keys,
  // server after server (source[first_source[s] + pos] is that of
  // keys[s][pos]; a one-pass split leaves gaps between the servers' regions),
  // so a piece's values move between the request and its frame by walking
  // the piece alone. Empty when a key repeats.
  SArray<uint32_t> source;
  std::vector<uint32_t> first_source;
  const uint32_t* sources_of(size_t s) const { return source.data() + first_source[s]; }

  // Distinct keys of server s.
  size_t count(size_t s) const { return runs ? run_bounds[s + 1] - run_bounds[s] : keys[s].size(); }
};

// SparseSplit::source of a de-duplicated split whose keys were all distinct.
void FillSources(SparseSplit* split) {
  split->first_source.resize(split->keys.size());
  uint32_t first = 0;
  for (size_t s = 0; s < split->keys.size(); ++s) {
    split->first_source[s] = first;
    first += static_cast<uint32_t>(split->keys[s].size());
  }
  split->source = SArray<uint32_t>::Uninitialized(split->server.size());
  uint32_t* const source = split->source.data();
  const uint32_t* const first_source = split->first_source.data();
  for (size_t i = 0; i < split->server.size(); ++i)
    source[first_source[split->server[i]] + split->position[i]] = static_cast<uint32_t>(i);
}

// A split of keys without repeats over several servers in one pass: each
// server's keys and request indices go to a region of their own, sized for
// an even share of hashed keys with a margin of four standard deviations
// (a server's count is binomial), in one allocation that every server's
// key array and `source` share. False, with `split` untouched, when some
// server gets more keys than its region holds (keys that hash unevenly), or
// when the regions would be far larger than the request (a few keys over
// many servers).
// Against the two passes below, in a scratch benchmark of 990 sorted keys:
// 2.9 against 4.7 ns a key with 2 servers, 3.1 against 5.7 with 16.
bool SplitIncreasingInOnePass(std::span<const uint64_t> keys,
                              const std::vector<uint16_t>& server_of_shard,
                              const KeySharder& sharder, int num_servers, SparseSplit* split) {
  const size_t n = keys.size();
  const auto servers = static_cast<size_t>(num_servers);
  const double share = static_cast<double>(n) / static_cast<double>(servers);
  const size_t region = std::min(n, static_cast<size_t>(share + 4.0 * std::sqrt(share)) + 16);
  // Keys first (8-byte aligned), then the request indices.
  const size_t key_slots = servers * region;
  if (key_slots > 4 * n + 256) return false;
  SArray<uint64_t> buffer = SArray<uint64_t>::Uninitialized(key_slots + (key_slots + 1) / 2);
  uint64_t* const region_keys = buffer.data();
  uint32_t* const region_sources = reinterpret_cast<uint32_t*>(region_keys + key_slots);
  // Kept in a vector for any server count; written once a key.
  std::vector<uint32_t> count(servers, 0);
  uint32_t* const counts = count.data();
  const uint16_t* const server_of = server_of_shard.data();
  // Locals, so that the compiler knows the stores below leave them alone
  // (through the caller's objects it reloaded the divider and the key
  // array after every store: 43 instructions a key against 37).
  const KeySharder shard_of = sharder;
  const uint64_t* const request = keys.data();
  for (size_t i = 0; i < n; ++i) {
    const uint64_t key = request[i];
    const size_t s = server_of[shard_of(key)];
    const uint32_t pos = counts[s]++;
    if (pos == region) [[unlikely]] return false;
    region_keys[s * region + pos] = key;
    region_sources[s * region + pos] = static_cast<uint32_t>(i);
  }
  split->first_source.resize(servers);
  for (size_t s = 0; s < servers; ++s) {
    split->keys[s] = buffer.Segment(s * region, s * region + counts[s]);
    split->first_source[s] = static_cast<uint32_t>(s * region);
  }
  split->source = SArray<uint32_t>(region_sources, key_slots, buffer.owner());
  return true;
}

// The same in two passes, for any spread of keys over servers: each key's
// server (and each server's count), then each key and its request index
// written straight to their places. The request is cut into four lanes
// walked side by side, each with its own counts and write positions: with
// few servers, one lane's consecutive keys often go to the same server and
// each would wait for the store of the one before (a lane's keys still land
// in request order).
void SplitIncreasingInTwoPasses(std::span<const uint64_t> keys,
                                const std::vector<uint16_t>& server_of_shard,
                                const KeySharder& sharder, int num_servers, SparseSplit* split) {
  constexpr size_t kLanes = 4;
  const size_t n = keys.size();
  const size_t lane_len = (n + kLanes - 1) / kLanes;
  const auto servers = static_cast<size_t>(num_servers);
  auto interleaved = [&](auto&& fn) {
    for (size_t j = 0; j < lane_len; ++j) {
      for (size_t lane = 0; lane < kLanes; ++lane) {
        const size_t i = lane * lane_len + j;
        if (i < n) fn(lane * servers, i);
      }
    }
  };
  thread_local std::vector<uint16_t> server_of_key;
  server_of_key.resize(n);
  // Per lane (lane after lane) and server: the lane's key count, then,
  // from the loop below, the lane's next position in keys[server].
  std::vector<uint32_t> next(kLanes * servers, 0);
  interleaved([&](size_t lane_base, size_t i) {
    const uint16_t s = server_of_shard[sharder(keys[i])];
    server_of_key[i] = s;
    ++next[lane_base + s];
  });
  split->first_source.resize(servers);
  uint32_t first = 0;
  for (size_t s = 0; s < servers; ++s) {
    split->first_source[s] = first;
    uint32_t at = 0;
    for (size_t lane = 0; lane < kLanes; ++lane) {
      const uint32_t count = next[lane * servers + s];
      next[lane * servers + s] = at;
      at += count;
    }
    // Uninitialised (every element is written below): zero-filling these
    // cost ~13 instructions a key of the request.
    split->keys[s] = SArray<uint64_t>::Uninitialized(at);
    first += at;
  }
  split->source = SArray<uint32_t>::Uninitialized(n);
  interleaved([&](size_t lane_base, size_t i) {
    const uint16_t s = server_of_key[i];
    const uint32_t pos = next[lane_base + s]++;
    split->keys[s][pos] = keys[i];
    split->source[split->first_source[s] + pos] = static_cast<uint32_t>(i);
  });
  if (server_of_key.capacity() > (size_t{1} << 20)) server_of_key = {};
}

// Keys in increasing order whose servers hold consecutive key ranges (one
// server, or the range partition): each server's run starts at the first
// key at or above the server's smallest key (first_key_of_server, empty
// with one server), found by binary search.
void SplitIntoRuns(std::span<const uint64_t> keys, std::span<const uint64_t> first_key_of_server,
                   int num_servers, SparseSplit* split) {
  split->runs = true;
  split->run_bounds.assign(num_servers + 1, 0);
  for (int s = 1; s < num_servers; ++s) {
    split->run_bounds[s] =
        static_cast<uint32_t>(std::lower_bound(keys.begin() + split->run_bounds[s - 1], keys.end(),
                                               first_key_of_server[s]) -
                              keys.begin());
  }
  split->run_bounds[num_servers] = static_cast<uint32_t>(keys.size());
}

// `copy_runs`: whether a split into runs copies each run's keys into
// keys[s] (a caller that sends segments of the request's own keys leaves
// them empty). first_key_of_server: TableRoute's (empty unless the range
// partition).
SparseSplit SplitKeys(std::span<const uint64_t> keys, const std::vector<uint16_t>& server_of_shard,
                      const KeySharder& sharder, std::span<const uint64_t> first_key_of_server,
                      int num_servers, bool copy_runs = true) {
  SparseSplit split;
  split.keys.resize(num_servers);
  const bool unique = StrictlyIncreasing(keys);
  if (unique && (num_servers == 1 || sharder.partition() == Partition::kRange)) {
    SplitIntoRuns(keys, first_key_of_server, num_servers, &split);
    if (copy_runs) {
      for (int s = 0; s < num_servers; ++s) {
        if (split.count(s) > 0)
          split.keys[s] = SArray<uint64_t>(keys.data() + split.run_bounds[s], split.count(s));
      }
    }
    return split;
  }
  if (unique) {
    if (SplitIncreasingInOnePass(keys, server_of_shard, sharder, num_servers, &split)) return split;
    SplitIncreasingInTwoPasses(keys, server_of_shard, sharder, num_servers, &split);
    return split;
  }
  // Room for an even share (and a margin): no regrowth while filling.
  const size_t share = num_servers == 1 ? keys.size() : keys.size() / num_servers * 5 / 4 + 16;
  std::vector<std::vector<uint64_t>> distinct_keys(num_servers);
  for (auto& server_keys : distinct_keys) server_keys.reserve(share);
  split.server.resize(keys.size());
  split.position.resize(keys.size());
  // One table per thread, reused: see KeyDeduper.
  thread_local KeyDeduper seen;
  seen.Reset(keys.size());
  // A large request's table outgrows the caches; prefetching a batch of
  // slots before inserting overlaps their misses.
  constexpr size_t kBatch = 16;
  uint64_t hashes[kBatch];
  for (size_t b = 0; b < keys.size(); b += kBatch) {
    const size_t n = std::min(keys.size() - b, kBatch);
    for (size_t j = 0; j < n; ++j) {
      hashes[j] = Mix64(keys[b + j]);
      seen.Prefetch(hashes[j]);
    }
    for (size_t j = 0; j < n; ++j) {
      const size_t i = b + j;
      // With one server there is nothing to route (and the modulo is not free).
      const uint16_t s = num_servers == 1 ? 0 : server_of_shard[sharder.Of(keys[i], hashes[j])];
      bool inserted;
      split.position[i] = seen.FindOrInsert(
          keys[i], hashes[j], static_cast<uint32_t>(distinct_keys[s].size()), &inserted);
      if (inserted) distinct_keys[s].push_back(keys[i]);
      split.server[i] = s;
    }
  }
  // Keep a few MiB per thread between requests, not the peak of a huge one.
  if (seen.bytes() > (size_t{64} << 20)) seen.Release();
  size_t distinct = 0;
  for (size_t s = 0; s < distinct_keys.size(); ++s) {
    distinct += distinct_keys[s].size();
    split.keys[s] = SArray<uint64_t>(std::move(distinct_keys[s]));
  }
  if (distinct == keys.size()) FillSources(&split);
  return split;
}

// Each server's distinct keys (pieces are segments of them); split.keys is
// left empty. (A split into runs of the caller's own SArray sends segments
// of that instead.)
std::vector<SArray<uint64_t>> TakeServerKeys(SparseSplit& split) {
  return std::exchange(split.keys, {});
}

// A server's part of a sparse call, sent as one request: its distinct keys
// [first, first + count) (positions in SparseSplit::keys[server]), piece
// `part` of `parts` for that server.
struct Piece {
  int server;
  uint32_t first;
  uint32_t count;
  uint32_t part;
  uint32_t parts;
};

// Cuts each server's keys into pieces of at most max_bytes of values
// (`width` floats per key), or one piece each when `whole` or max_bytes is
// 0. Servers without keys get an empty piece when `every_server`, else
// none. keys_per_piece (optional) gets each server's piece length.
std::vector<Piece> CutPieces(const SparseSplit& split, size_t width, size_t max_bytes, bool whole,
                             bool every_server, std::vector<uint32_t>* keys_per_piece = nullptr) {
  std::vector<Piece> pieces;
  if (keys_per_piece) keys_per_piece->assign(split.keys.size(), 1);
  const size_t key_bytes = std::max<size_t>(width, 1) * sizeof(float);
  for (size_t s = 0; s < split.keys.size(); ++s) {
    const size_t n = split.count(s);
    if (n == 0) {
      if (every_server) pieces.push_back({static_cast<int>(s), 0, 0, 0, 1});
      continue;
    }
    const size_t per = whole || max_bytes == 0 || n * key_bytes <= max_bytes
                           ? n
                           : std::max<size_t>(1, max_bytes / key_bytes);
    if (keys_per_piece) (*keys_per_piece)[s] = static_cast<uint32_t>(per);
    const auto parts = static_cast<uint32_t>((n + per - 1) / per);
    for (uint32_t k = 0; k < parts; ++k) {
      const size_t first = k * per;
      pieces.push_back({static_cast<int>(s), static_cast<uint32_t>(first),
                        static_cast<uint32_t>(std::min(per, n - first)), k, parts});
    }
  }
  return pieces;
}

// Names a piece among its server's in errors: " (part 2 of 4)", or "".
std::string PartName(const Piece& p) {
  return p.parts > 1 ? absl::StrCat(" (part ", p.part + 1, " of ", p.parts, ")") : std::string();
}

}  // namespace

Status PsClient::PullSparse(uint32_t table, std::span<const uint64_t> keys,
                            std::span<float> values, const PullOptions& options) {
  return Blocking([&] { return PullSparseAsync(table, keys, values, options); }, options.timeout);
}

std::future<Status> PsClient::PullSparseAsync(uint32_t table, std::span<const uint64_t> keys,
                                              std::span<float> values, const PullOptions& options) {
  auto route = Route(table, /*sparse=*/true);
  if (!route.ok()) return Ready(route.status());
  const TableRoute& r = *route.value();
  if (values.size() != keys.size() * r.pull_dim) {
    return Ready(Status::InvalidArgument(
        absl::StrCat("pull_sparse: ", keys.size(), " keys of dim ", r.pull_dim, " need ",
                     keys.size() * r.pull_dim, " floats, got ", values.size()),
        absl::StrCat("table ", table)));
  }
  auto split = std::make_shared<SparseSplit>(
      SplitKeys(keys, r.server_of_shard, *r.sharder, r.first_key_of_server, num_servers()));
  const size_t dim = r.pull_dim;
  std::vector<uint32_t> keys_per_piece;
  auto pieces = std::make_shared<const std::vector<Piece>>(
      CutPieces(*split, dim, static_cast<size_t>(job_.distributed.max_request_bytes),
                /*whole=*/false, /*every_server=*/false, &keys_per_piece));
  // With a key repeated: the positions of the request (in request order)
  // grouped by piece, so each reply is scattered by walking only its own
  // keys. (With one piece that is every position: no list, null. Without
  // repeats, split->source says the same.)
  std::shared_ptr<std::vector<std::vector<uint32_t>>> by_piece;
  if (pieces->size() > 1 && !split->runs && split->source.empty()) {
    std::vector<uint32_t> first_piece(num_servers(), 0);
    for (size_t g = pieces->size(); g-- > 0;)
      first_piece[(*pieces)[g].server] = static_cast<uint32_t>(g);
    by_piece = std::make_shared<std::vector<std::vector<uint32_t>>>(pieces->size());
    for (uint32_t i = 0; i < keys.size(); ++i) {
      const int s = split->server[i];
      (*by_piece)[first_piece[s] + split->position[i] / keys_per_piece[s]].push_back(i);
    }
  }
  const std::vector<SArray<uint64_t>> server_keys = TakeServerKeys(*split);
  pb::PsRequestMeta meta;
  meta.set_worker_rank(options_.worker_rank);
  const std::string serialized_meta = meta.SerializeAsString();  // once for every piece
  auto make = [&](size_t g) -> Outgoing {
    const Piece& p = (*pieces)[g];
    Message m = NewRequest(pb::PS_PULL_SPARSE, static_cast<int>(table), serialized_meta);
    m.AddFrame(server_keys[p.server].Segment(p.first, p.first + p.count));
    return {p.server, std::move(m), PartName(p)};
  };
  const std::string what = absl::StrCat("pull_sparse table ", table);
  return SendAll(
      pieces->size(), make, TimeoutOr(options.timeout), what,
      [split, pieces, by_piece, values, dim, what](size_t g, const Message& reply) -> Status {
        const Piece& p = (*pieces)[g];
        auto got = reply.Frame<float>(0);
        if (!got.ok()) return got.status().WithContext(what);
        if (got->size() != size_t{p.count} * dim) {
          return Status::Corruption(absl::StrCat(what, ": server ", p.server, " sent ", got->size(),
                                                 " floats for ", p.count, " keys of dim ", dim));
        }
        const float* reply_values = got->data();
        if (split->runs) {
          // The piece's keys are the request's from its run's start + first on.
          const size_t from = size_t{split->run_bounds[p.server]} + p.first;
          std::memcpy(values.data() + from * dim, reply_values, got->size() * sizeof(float));
          return Status::OK();
        }
        if (!split->source.empty()) {
          ScatterRows(reply_values, dim, split->sources_of(p.server) + p.first, p.count,
                      values.data());
          return Status::OK();
        }
        auto scatter = [&](size_t i) {
          CopyFloats(reply_values + static_cast<size_t>(split->position[i] - p.first) * dim, dim,
                     values.data() + i * dim);
        };
        if (by_piece == nullptr) {
          for (size_t i = 0; i < split->position.size(); ++i) scatter(i);
        } else {
          for (uint32_t i : (*by_piece)[g]) scatter(i);
        }
        return Status::OK();
      });
}

std::future<Status> PsClient::SendSparse(pb::PsCommand command, uint32_t table,
                                         std::span<const uint64_t> keys,
                                         std::span<const float> values, const PushOptions& options,
                                         const SArray<uint64_t>* shared_keys,
                                         const SArray<float>* shared_values) {
  const bool delta = command == pb::PS_PUSH_SPARSE_DELTA;
  const char* what = delta ? "push_sparse_delta" : "push_sparse_grad";
  auto route = Route(table, /*sparse=*/true);
  if (!route.ok()) return Ready(route.status());
  const TableRoute& r = *route.value();
  const size_t dim = r.push_dim;
  const bool with_counts = !options.shows.empty() || !options.clicks.empty();
  if (values.size() != keys.size() * dim ||
      (with_counts && (options.shows.size() != keys.size() || options.clicks.size() != keys.size()))) {
    return Ready(Status::InvalidArgument(
        absl::StrCat(what, ": ", keys.size(), " keys of dim ", dim, " need ", keys.size() * dim,
                     " floats", with_counts ? " and as many shows and clicks as keys" : "",
                     "; got ", values.size(), ", ", options.shows.size(), ", ",
                     options.clicks.size()),
        absl::StrCat("table ", table)));
  }
  const bool sync = !delta && job_.distributed.mode == SyncMode::kSync;
  if (Status s = RequireStepInSyncMode(sync, options, table); !s.ok()) return Ready(s);
  // Shared arrays are sent as they are when the split leaves them whole.
  const bool zero_copy = shared_keys != nullptr && shared_values != nullptr;
  SparseSplit split = SplitKeys(keys, r.server_of_shard, *r.sharder, r.first_key_of_server,
                                num_servers(), /*copy_runs=*/!zero_copy);
  const bool send_shared = zero_copy && split.runs;
  // Sync mode: the server merges exactly one push per worker and step, so
  // a server's part is never cut; and every server waits for every
  // worker's push of a step, so servers without keys from us still get an
  // (empty) push.
  const std::vector<Piece> pieces =
      CutPieces(split, dim, static_cast<size_t>(job_.distributed.max_request_bytes), /*whole=*/sync,
                /*every_server=*/sync);
  // One row per distinct key, per server: the first occurrence is copied,
  // duplicates are added to it.
  // Inline for a few servers: three allocations a push less.
  absl::InlinedVector<SArray<float>, 4> grads(num_servers()), shows(num_servers()),
      clicks(num_servers());
  std::vector<SArray<uint64_t>> server_keys;  // shared: segments of the caller's keys
  for (int s = 0; s < num_servers(); ++s) {
    if (send_shared) {
      const size_t first = split.run_bounds[s], end = split.run_bounds[s + 1];
      server_keys.push_back(shared_keys->Segment(first, end));
      grads[s] = shared_values->Segment(first * dim, end * dim);
    } else {
      grads[s] = push_buffers_->Get<float>(split.count(s) * dim);
    }
    if (with_counts) {
      shows[s] = SArray<float>::Uninitialized(split.count(s));
      clicks[s] = SArray<float>::Uninitialized(split.count(s));
    }
  }
  // Without repeated keys each row has one source (split.source), and a
  // piece is gathered right before it is sent: the first pieces are on the
  // wire while the later ones are gathered.
  if (split.runs) {
    // Each server's rows are a run of the request's, in order: each piece
    // is copied in one block right before it is sent (or not at all when
    // shared).
  } else if (!split.source.empty()) {
    // Gathered piece by piece in `make`.
  } else {
    // Walking the request in order, a key's first occurrence is the one
    // whose position is the next unused one of its server.
    std::vector<uint32_t> next_position(num_servers(), 0);
    for (size_t i = 0; i < keys.size(); ++i) {
      const int s = split.server[i];
      const size_t pos = split.position[i];
      const bool first = pos == next_position[s];
      if (first) ++next_position[s];
      float* out = grads[s].data() + pos * dim;
      const float* in = values.data() + i * dim;
      if (first) {
        CopyFloats(in, dim, out);
      } else {
        AddFloats(in, dim, out);
      }
      if (with_counts) {
        shows[s][pos] = first ? options.shows[i] : shows[s][pos] + options.shows[i];
        clicks[s][pos] = first ? options.clicks[i] : clicks[s][pos] + options.clicks[i];
      }
    }
  }
  if (!send_shared) server_keys = TakeServerKeys(split);
  const std::string meta = PushMeta(options).SerializeAsString();  // once for every piece
  auto make = [&](size_t g) -> Outgoing {
    const Piece& p = pieces[g];
    const size_t end = size_t{p.first} + p.count;
    if (split.runs) {
      // The piece's keys are the request's from its run's start + first on.
      // Shared: the values frame is a segment of the caller's array.
      const size_t from = size_t{split.run_bounds[p.server]} + p.first;
      if (!send_shared) {
        std::memcpy(grads[p.server].data() + p.first * dim, values.data() + from * dim,
                    p.count * dim * sizeof(float));
      }
      if (with_counts) {
        std::copy_n(options.shows.data() + from, p.count, shows[p.server].data() + p.first);
        std::copy_n(options.clicks.data() + from, p.count, clicks[p.server].data() + p.first);
      }
    } else if (!split.source.empty()) {
      const uint32_t* source = split.sources_of(p.server) + p.first;
      GatherRows(values.data(), dim, source, p.count, grads[p.server].data() + p.first * dim);
      if (with_counts) {
        GatherRows(options.shows.data(), 1, source, p.count, shows[p.server].data() + p.first);
        GatherRows(options.clicks.data(), 1, source, p.count, clicks[p.server].data() + p.first);
      }
    }
    Message m = NewRequest(command, static_cast<int>(table), meta);
    m.AddFrame(server_keys[p.server].Segment(p.first, end));
    m.AddFrame(grads[p.server].Segment(p.first * dim, end * dim));
    if (with_counts) {
      m.AddFrame(shows[p.server].Segment(p.first, end));
      m.AddFrame(clicks[p.server].Segment(p.first, end));
    }
    return {p.server, std::move(m), PartName(p)};
  };
  return SendAll(pieces.size(), make, TimeoutOr(options.timeout),
                 absl::StrCat(what, " table ", table), nullptr);
}

Status PsClient::PushSparseGrad(uint32_t table, std::span<const uint64_t> keys,
                                std::span<const float> grads, const PushOptions& options) {
  return Blocking([&] { return SendSparse(pb::PS_PUSH_SPARSE_GRAD, table, keys, grads, options); },
                  options.timeout);
}

std::future<Status> PsClient::PushSparseGradAsync(uint32_t table, std::span<const uint64_t> keys,
                                                  std::span<const float> grads,
                                                  const PushOptions& options) {
  return SendSparse(pb::PS_PUSH_SPARSE_GRAD, table, keys, grads, options);
}

Status PsClient::PushSparseGrad(uint32_t table, const SArray<uint64_t>& keys,
                                const SArray<float>& grads, const PushOptions& options) {
  return Blocking(
      [&] {
        return SendSparse(pb::PS_PUSH_SPARSE_GRAD, table, keys.span(), grads.span(), options, &keys,
                          &grads);
      },
      options.timeout);
}

std::future<Status> PsClient::ZPushSparseGrad(uint32_t table, const SArray<uint64_t>& keys,
                                              const SArray<float>& grads,
                                              const PushOptions& options) {
  return SendSparse(pb::PS_PUSH_SPARSE_GRAD, table, keys.span(), grads.span(), options, &keys,
                    &grads);
}

Status PsClient::PushSparseDelta(uint32_t table, std::span<const uint64_t> keys,
                                 std::span<const float> deltas, const PushOptions& options) {
  return Blocking(
      [&] { return SendSparse(pb::PS_PUSH_SPARSE_DELTA, table, keys, deltas, options); },
      options.timeout);
}

Status PsClient::PullDense(uint32_t table, std::span<float> values, const PullOptions& options) {
  return Blocking([&] { return PullDenseAsync(table, values, options); }, options.timeout);
}

std::future<Status> PsClient::PullDenseAsync(uint32_t table, std::span<float> values,
                                             const PullOptions& options) {
  auto route = DenseRoute(table, values.size(), "pull_dense");
  if (!route.ok()) return Ready(route.status());
  const TableRoute& r = *route.value();
  std::vector<std::optional<Message>> requests(num_servers());
  for (int s = 0; s < num_servers(); ++s) {
    if (r.ranges[s].size() == 0) continue;
    requests[s] = NewRequest(pb::PS_PULL_DENSE, static_cast<int>(table), pb::PsRequestMeta());
  }
  return Broadcast(std::move(requests), TimeoutOr(options.timeout),
                   absl::StrCat("pull_dense table ", table),
                   [ranges = r.ranges, values, table](int server, const Message& reply) -> Status {
                     auto got = reply.Frame<float>(0);
                     if (!got.ok()) return got.status();
                     if (got->size() != ranges[server].size()) {
                       return Status::Corruption(
                           absl::StrCat("pull_dense: server ", server, " sent ", got->size(),
                                        " floats for a range of ", ranges[server].size()),
                           absl::StrCat("table ", table));
                     }
                     std::copy_n(got->data(), got->size(), values.data() + ranges[server].begin);
                     return Status::OK();
                   });
}

std::future<Status> PsClient::SendDense(pb::PsCommand command, uint32_t table,
                                        SArray<float> values, const PushOptions& options) {
  auto route = DenseRoute(table, values.size(), "dense push");
  if (!route.ok()) return Ready(route.status());
  const bool sync = command == pb::PS_PUSH_DENSE_GRAD && job_.distributed.mode == SyncMode::kSync;
  if (Status s = RequireStepInSyncMode(sync, options, table); !s.ok()) return Ready(s);
  const TableRoute& r = *route.value();
  const pb::PsRequestMeta meta = PushMeta(options);
  std::vector<std::optional<Message>> requests(num_servers());
  for (int s = 0; s < num_servers(); ++s) {
    if (r.ranges[s].size() == 0) continue;
    Message m = NewRequest(command, static_cast<int>(table), meta);
    m.AddFrame(values.Segment(r.ranges[s].begin, r.ranges[s].end));
    requests[s] = std::move(m);
  }
  return Broadcast(std::move(requests), TimeoutOr(options.timeout),
                   absl::StrCat(pb::PsCommand_Name(command), " table ", table), nullptr);
}

SArray<float> PsClient::PooledCopy(std::span<const float> values) const {
  SArray<float> copy = push_buffers_->Get<float>(values.size());
  std::copy(values.begin(), values.end(), copy.data());
  return copy;
}

Status PsClient::PushDenseGrad(uint32_t table, std::span<const float> grads,
                               const PushOptions& options) {
  return Blocking(
      [&] {
        return SendDense(pb::PS_PUSH_DENSE_GRAD, table, PooledCopy(grads),
                         options);
      },
      options.timeout);
}

std::future<Status> PsClient::ZPushDenseGrad(uint32_t table, SArray<float> grads,
                                             const PushOptions& options) {
  return SendDense(pb::PS_PUSH_DENSE_GRAD, table, std::move(grads), options);
}

Status PsClient::PushDenseDelta(uint32_t table, std::span<const float> deltas,
                                const PushOptions& options) {
  return Blocking(
      [&] {
        return SendDense(pb::PS_PUSH_DENSE_DELTA, table,
                         PooledCopy(deltas), options);
      },
      options.timeout);
}

Status PsClient::InitDense(uint32_t table, std::span<const float> values) {
  return Blocking(
      [&] {
        return SendDense(pb::PS_INIT_DENSE, table, PooledCopy(values), {});
      },
      {});
}

Status PsClient::BroadcastControl(pb::PsCommand command, int table, const pb::PsRequestMeta& meta,
                                  std::chrono::milliseconds timeout, const std::string& what,
                                  std::vector<Message>* replies) {
  std::vector<std::optional<Message>> requests(num_servers());
  for (int s = 0; s < num_servers(); ++s) requests[s] = NewRequest(command, table, meta);
  if (replies) replies->assign(num_servers(), Message());
  auto f = Broadcast(std::move(requests), TimeoutOr(timeout), what,
                     [replies](int server, const Message& reply) {
                       if (replies) (*replies)[server] = reply;
                       return Status::OK();
                     });
  return Wait(std::move(f), timeout);
}

Status PsClient::Barrier(const std::string& name, const BarrierOptions& options) {
  pb::PsRequestMeta meta;
  meta.set_worker_rank(options_.worker_rank);
  meta.set_barrier_name(name);
  meta.set_barrier_size(options.size > 0 ? options.size : options_.num_workers);
  std::vector<std::optional<Message>> requests(num_servers());
  requests[0] = NewRequest(pb::PS_BARRIER, -1, meta);
  return Wait(Broadcast(std::move(requests), TimeoutOr(options.timeout),
                        absl::StrCat("barrier '", name, "' of ", meta.barrier_size()), nullptr),
              options.timeout);
}

Status PsClient::Save(const std::string& dir, bool delta, std::chrono::milliseconds timeout) {
  pb::PsRequestMeta meta;
  meta.set_path(dir);
  meta.set_delta(delta);
  return BroadcastControl(pb::PS_SAVE, -1, meta, timeout, absl::StrCat("save to ", dir));
}

Status PsClient::Load(const std::string& dir, std::chrono::milliseconds timeout) {
  pb::PsRequestMeta meta;
  meta.set_path(dir);
  return BroadcastControl(pb::PS_LOAD, -1, meta, timeout, absl::StrCat("load from ", dir));
}

Result<uint64_t> PsClient::Shrink(int table) {
  std::vector<Message> replies;
  FLEET_RETURN_IF_ERROR(BroadcastControl(pb::PS_SHRINK, table, {}, {}, "shrink", &replies));
  uint64_t deleted = 0;
  for (const Message& m : replies) {
    pb::PsShrinkReply r;
    if (!r.ParseFromString(m.header.meta())) return Status::Corruption("shrink reply does not parse");
    deleted += r.rows_deleted();
  }
  return deleted;
}

Status PsClient::EndPass() { return BroadcastControl(pb::PS_END_PASS, -1, {}, {}, "end_pass"); }

Result<std::vector<pb::PsStatsReply>> PsClient::Stats() {
  std::vector<Message> replies;
  FLEET_RETURN_IF_ERROR(BroadcastControl(pb::PS_STATS, -1, {}, {}, "stats", &replies));
  std::vector<pb::PsStatsReply> stats(replies.size());
  for (size_t i = 0; i < replies.size(); ++i) {
    if (!stats[i].ParseFromString(replies[i].header.meta())) {
      return Status::Corruption("stats reply does not parse", absl::StrCat("server ", i));
    }
  }
  return stats;
}

Status PsClient::StopServers() { return BroadcastControl(pb::PS_STOP, -1, {}, {}, "stop"); }

}  // namespace fleet::ps
