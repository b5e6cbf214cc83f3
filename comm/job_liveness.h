// JobLiveness: how the processes of a job started by hand (no fleetrun to
// supervise them) learn within seconds that one of them died, failed or
// finished, through the KV store they meet at.
//
// Each process, every `interval`:
//   * sets alive/<role>/<rank> to "<beat>|<host>|<pid>" (beat counts up);
//   * reads every other process's key and job/failed.
// A peer is watched from its first beat on (processes start in any order).
// What the store held before this process's first look (a previous run's
// beats, "done" marks or job/failed, when the store outlives a run) is not
// news: a key counts once it changed.
// It is dead when its pid is gone (same host: noticed within one interval)
// or its beat has not changed for `peer_timeout` (another host, or a frozen
// process). A process that fails sets job/failed to what happened
// (MarkFailed) before it exits; one that finishes sets its key to "done"
// (MarkDone) and is no longer watched. The first dead peer or job/failed
// ends the watch: failure() says why, and on_failure is called once; a dead
// peer found by the watch is also written to job/failed, so the others name
// it rather than this process's exit, its echo.
//
// fleetrun's processes do not use it: fleetrun watches them itself
// (launch/peer_watch.h for hosts). StartedByHand tells which is which.
//
// Thread safety: every method may be called from any thread. The watch
// runs on its own thread; each round makes at most 2 + peers KV requests,
// each bounded by `interval`, so Stop (and the destructor) returns within
// about two intervals.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "comm/cluster.h"
#include "comm/status.h"

namespace fleet {

class KvStoreClient;

struct JobLivenessOptions {
  // This process.
  Role role = Role::kWorker;
  int rank = 0;
  // The job's processes by role (this one included): the peers watched.
  int servers = 0;
  int workers = 0;
  int heter_workers = 0;
  // Between two beats (and two looks at the peers).
  std::chrono::milliseconds interval{500};
  // A peer on another host whose beat has not changed for this long is
  // dead. Longer tolerates longer pauses (a loaded machine, a slow store).
  std::chrono::milliseconds peer_timeout{std::chrono::seconds(5)};
  // Called once, on the watch's thread, with failure()'s text. May be empty.
  std::function<void(const std::string& why)> on_failure;
};

class JobLiveness {
 public:
  // Starts beating and watching through the store `spec` names (with its
  // job id and credentials). InvalidArgument when the spec has no KV store.
  static Result<std::unique_ptr<JobLiveness>> Start(const ClusterSpec& spec,
                                                    JobLivenessOptions options);
  ~JobLiveness();  // Stop()
  JobLiveness(const JobLiveness&) = delete;
  JobLiveness& operator=(const JobLiveness&) = delete;

  // Why the job cannot go on ("worker 1 (host h pid 42) stopped: its process
  // is gone"; "job failed: <what the failing process said>"), or nullopt.
  std::optional<std::string> failure() const;
  // failure(), waiting up to `timeout` for one: a process whose own call
  // failed (a peer's connection lost) asks whether the watch finds the
  // cause before it says what went wrong.
  std::optional<std::string> WaitForFailure(std::chrono::milliseconds timeout) const;
  // Whether every worker marked itself done (a server's cue to finish).
  bool WorkersDone() const;
  // Tells the others this process failed (`why`, e.g. its error), unless
  // the job already failed; best effort, bounded by `interval`.
  void MarkFailed(const std::string& why);
  // Marks this process done; it is no longer watched. Best effort.
  void MarkDone();
  // Ends beating and watching. Idempotent.
  void Stop();

 private:
  struct Peer {
    std::string name;  // "worker 1"
    std::string last;  // its last value
    std::chrono::steady_clock::time_point changed{};
    bool seen = false;
    bool done = false;
    // What its key held at this process's first look (an earlier run's
    // beat or "done" in a store kept across runs; "" for none), and whether
    // it has since held anything else (this run's peer).
    bool looked = false;
    std::string stale;
    bool fresh = false;
  };

  JobLiveness(const ClusterSpec& spec, JobLivenessOptions options);
  void Run();
  void Round();
  // A peer's value seen now: whether that makes it dead (sets why).
  bool Dead(Peer& peer, const std::string& value, std::string* why) const;

  // Fixed after construction.
  const JobLivenessOptions options_;
  const std::string self_key_;
  const std::string host_;
  std::unique_ptr<KvStoreClient> kv_;
  std::map<std::string, Peer> peers_;  // by key; the watch thread's alone

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool stop_ = false;                   // guarded by mu_
  bool done_ = false;                   // guarded by mu_
  bool workers_done_ = false;           // guarded by mu_
  std::optional<std::string> failure_;  // guarded by mu_
  // job/failed at the first round (an earlier run's, in a store kept across
  // runs): not this run's news. Guarded by mu_; unset until the first round.
  std::optional<std::string> stale_failed_;
  int64_t beat_ = 0;                    // the watch thread's alone
  std::thread thread_;
};

// The store keys of the processes' beats, "alive/<role>/<rank>", and what
// one holds: "<beat>|<host>|<pid>", or "done" once the process finished.
inline constexpr std::string_view kAliveKeyPrefix = "alive/";
struct AliveValue {
  bool done = false;
  int64_t beat = 0;
  std::string host;
  int pid = 0;
};
// InvalidArgument naming the text when it is neither form.
Result<AliveValue> ParseAliveValue(const std::string& text);

// Whether this process was started by hand rather than by fleetrun, which
// gives each of its processes FLEET_RESTART_GENERATION (launch/README.md).
bool StartedByHand(const EnvLookup& env);

class ProcessContext;

// The watch of a parameter-server process (ps_server, ps_worker,
// heter_worker) started by hand with a KV store: its peers are the spec's
// servers and heter workers and `workers` workers; a failure is logged as
// "<name>: <why>; stopping" and stops the process (ctx.RequestStop()).
// nullptr under fleetrun or without a KV store. Errors: Start's.
Result<std::unique_ptr<JobLiveness>> WatchPeersByHand(ProcessContext& ctx, const std::string& name,
                                                      int workers);

}  // namespace fleet
