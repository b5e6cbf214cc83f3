// HeterClient: a CPU worker's side of the heter pipeline. It sends each
// micro-batch's dense-section inputs to a heter worker (in turn, starting at
// heter worker `worker_rank % H`, so the micro-batches of all workers spread
// evenly) and hands the replies back in the order the micro-batches were
// submitted, keeping as many in flight as the caller submits (the caller
// keeps at most Distributed.heter.pipeline_depth).
//
// Failures. A call that fails with Unavailable (connection lost: the heter
// worker died, was stopped or missed its heartbeats) or Timeout (its
// deadline passed) marks that heter worker down and resends the micro-batch,
// with attempt + 1, to a reachable one; new micro-batches skip it, except
// for one probe every 200 ms that finds out whether it is back (fleetrun
// --max_restart restarts a dead one on the same endpoint). A heter worker
// that stays down for `down_timeout` fails the pipeline with Unavailable
// naming it (rank, endpoint, log file), its last error and, when its log is
// on this machine, the log's last lines. A resent
// micro-batch's dense gradient is never applied twice (heter.proto,
// HeterTrainMeta.attempt). Any other error (a reply that does not answer
// its request, an error the heter worker replied with) fails the pipeline
// at once.
//
// After an error the client is failed: every later call returns that error.
//
// Thread safety: one thread drives a client (Submit / WaitOldest / Flush);
// the accessors may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "comm/rpc.h"
#include "comm/status.h"
#include "worker/heter_protocol.h"

namespace fleet::heter {

struct HeterClientOptions {
  // "ip:port" of heter worker 0, 1, ... (real ports). At least one.
  std::vector<std::string> heter_workers;
  int worker_rank = 0;
  int num_workers = 1;
  // The dense section's input widths (checked by the heter workers).
  DenseShape shape;
  // Deadline of one micro-batch's call: the dense section's compute plus, in
  // sync mode, the wait for every worker's contribution to the step.
  // Default: Distributed.timeout_ms.
  std::chrono::milliseconds timeout{60000};
  // How long a heter worker may stay unreachable before the job fails
  // (Distributed.heter.down_timeout_ms). Longer rides out slower restarts;
  // shorter fails sooner when one is gone for good.
  std::chrono::milliseconds down_timeout{4000};
  // Heter worker r logs to <log_dir>/heterlog.<r>; named in errors. Empty:
  // not named.
  std::string log_dir;
  // Transport options (busy polling, heartbeats).
  VanOptions van;
};

// A micro-batch and its accepted reply.
struct Completed {
  TrainRequest request;
  TrainReply reply;
  int heter_rank = 0;  // the heter worker that answered
};

class HeterClient {
 public:
  // Connects (lazily: nothing waits for the heter workers here).
  // InvalidArgument for an empty list, a malformed endpoint, bad ranks or
  // timeouts.
  static Result<std::unique_ptr<HeterClient>> Create(HeterClientOptions options);
  ~HeterClient();  // fails the calls still in flight (their replies are dropped)
  // Fails every call in flight now and every later one at once (a worker
  // told to stop). Thread-safe, idempotent; unusable afterwards.
  void Abort();
  HeterClient(const HeterClient&) = delete;
  HeterClient& operator=(const HeterClient&) = delete;

  // Sends the micro-batch (request.attempt must be 0; the client sets the
  // heter worker) and returns without waiting. Takes the request; its arrays
  // are shared with the transport and must not be written any more.
  // Returns the client's error, if it failed before.
  Status Submit(TrainRequest request);

  // Waits for the reply to the oldest micro-batch in flight, resending it
  // (and any other micro-batch whose heter worker failed meanwhile) as the
  // header says, and removes it. Blocks until a reply, or until a heter
  // worker has been down for down_timeout; each call is bounded by its
  // deadline. REQUIRES: in_flight() > 0.
  Result<Completed> WaitOldest();

  // Asks every heter worker to flush its dense communicator (HETER_FLUSH) and
  // waits for all, retrying a down one until down_timeout. Call with nothing
  // in flight, before evaluation or a checkpoint. Errors as WaitOldest.
  Status Flush();

  size_t in_flight() const { return in_flight_.size(); }
  int num_heter_workers() const { return static_cast<int>(heters_.size()); }
  // Time spent blocked in WaitOldest and Flush: the CPU side idle, waiting
  // for the dense side. Thread-safe.
  double blocked_seconds() const;
  // Micro-batches sent again after a failure. Thread-safe.
  int64_t resends() const;

 private:
  using Clock = std::chrono::steady_clock;
  // Where a call's outcome lands; written by the RpcNode's thread under mu_.
  struct Slot {
    bool done = false;
    std::optional<Result<Message>> result;
  };
  struct InFlight {
    TrainRequest request;
    int heter = 0;
    std::shared_ptr<Slot> slot;
    // The slot's outcome was taken into account (heter worker marked up or
    // down); a failed one then waits for a heter worker to resend to.
    bool accounted = false;
  };
  struct Heter {
    std::string endpoint;
    int peer = -1;
    // Since when it has been failing (nullopt: up), and why.
    std::optional<Clock::time_point> down_since;
    Clock::time_point last_failure{};
    Status last_error;
  };

  explicit HeterClient(HeterClientOptions options);
  // The heter worker for the next send. A new micro-batch (no `avoid`) goes
  // to the next one in turn that is up or due for a probe; a resent one to
  // the next one up other than `avoid`, else to `avoid` when it is up again,
  // else to one due for a probe. nullopt when every heter worker is down and
  // was probed recently.
  std::optional<int> PickHeter(std::optional<int> avoid);
  // When the next down heter worker is due for a probe.
  Clock::time_point NextProbe() const;
  // Encodes and sends entry.request to entry.heter with a fresh slot.
  // Must be called without mu_ held (a refused call completes on this thread).
  void Send(InFlight& entry);
  // Marks heter h failed with `why` at `now`.
  void MarkDown(int h, const Status& why, Clock::time_point now);
  // Unavailable naming heter worker h when it has been down too long.
  Status CheckDownTooLong(Clock::time_point now) const;
  std::string Describe(int h) const;  // "heter worker 1 (127.0.0.1:4000, log log/heterlog.1)"
  // "; the last N lines of its log: ..." when heter worker h's log is a file
  // here (simulation), else empty.
  std::string LogTail(int h) const;
  Status Fail(Status s);  // makes s the sticky error and returns it
  // Waits (counting the time as blocked) until pred() or `until`.
  template <typename Pred>
  void BlockUntil(std::unique_lock<std::mutex>& lock, Clock::time_point until, Pred pred);

  // Fixed after construction.
  const HeterClientOptions options_;
  std::unique_ptr<RpcNode> rpc_;

  // Driving thread only.
  std::vector<Heter> heters_;
  std::deque<InFlight> in_flight_;
  int next_ = 0;
  Status error_;

  // Guarded by mu_: the slots' contents, and the counters.
  mutable std::mutex mu_;
  std::condition_variable cv_;  // a slot completed
  double blocked_seconds_ = 0;
  int64_t resends_ = 0;
};

}  // namespace fleet::heter
