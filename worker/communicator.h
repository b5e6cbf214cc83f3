// Communicator: how a PS worker reads parameters and hands back gradients,
// one policy per `Distributed.mode`. The worker's step loop is the same for
// every mode:
//
//   FLEET_RETURN_IF_ERROR(comm->Pull(params));       // rows of the batch's keys + dense
//   ... forward / backward, gradients of the batch-mean loss ...
//   scale them by comm->GradientScale(batch_samples)
//   FLEET_RETURN_IF_ERROR(comm->Push(grads));
//   ...
//   FLEET_RETURN_IF_ERROR(comm->Flush());            // before eval, save, exit
//
// A communicator serves at most one sparse and one dense table (the models of
// ps_worker use one of each, or only a dense one).
//
//   SyncCommunicator   Pull reads the servers; Push sends the step's sparse
//                      and dense gradients with PushOptions.step and returns
//                      once every worker's push of that step was applied.
//   AsyncCommunicator  Pull reads the servers; Push copies the gradients into
//                      a bounded queue and returns; a background thread
//                      merges up to max_merge queued batches (per-key sums,
//                      dense sums) and sends them while compute goes on.
//   GeoCommunicator    The worker trains a local copy with the tables' own
//                      optimizer rules; every k_steps Pushes it sends the
//                      deltas (local - last synced) / num_workers and
//                      re-reads fresh values from the servers.
//
// Shows and clicks (CTR accessor) travel with the sparse gradients: sync
// sends them with the step, async sums them per key with the gradients it
// merges, geo sums them per key and sends them with the deltas.
//
// Thread safety: a communicator is driven by one thread (the worker's step
// loop). Internally AsyncCommunicator owns its own sender thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "comm/status.h"
#include "ps/client.h"
#include "ps/table/optimizer.h"

namespace fleet::worker {

struct CommunicatorOptions {
  // The sparse table read and pushed by Pull/Push (nullopt: none), and the
  // dense one. Both must exist in the job config of the client.
  std::optional<uint32_t> sparse_table;
  std::optional<uint32_t> dense_table;
  // Workers of the job (sync gradient scale, geo delta scale). >= 1.
  int num_workers = 1;
  // Samples per batch of one worker as configured (the last batch of an
  // epoch may be smaller). Sync scales by actual / (batch_size * workers).
  int batch_size = 1;
  // Deadline of every wait: PS requests, a full async queue, Flush.
  // Default: Distributed.timeout_ms of the client's job.
  std::chrono::milliseconds timeout{0};
  // Async: batches merged into one send (Distributed.max_merge).
  int max_merge = 10;
  // Async: batches waiting in the queue before Push blocks (back pressure
  // on a worker that computes faster than the servers absorb). Default
  // 2 * max_merge when 0.
  int queue_capacity = 0;
  // Geo: Pushes between two exchanges with the servers (Distributed.k_steps).
  int k_steps = 100;
};

// What one step reads. Spans are the caller's; they must stay valid for the
// call only.
struct PullRequest {
  std::span<const uint64_t> sparse_keys = {};  // any order, duplicates allowed
  std::span<float> sparse_values = {};         // keys.size() * pull dim
  std::span<float> dense_values = {};          // the dense table's dim (empty: skip dense)
};

// Sync mode: where a push made for another worker's step goes (a heter
// worker pushes the dense gradient of each micro-batch it computed as slot
// contributor of the step's contributors; see ps::PushOptions).
struct SyncSlot {
  int64_t step = 0;
  int contributor = 0;
  int contributors = 0;
};

// What one step hands back: gradients already multiplied by GradientScale().
struct PushRequest {
  std::span<const uint64_t> sparse_keys = {};
  std::span<const float> sparse_grads = {};  // keys.size() * push dim
  std::span<const float> dense_grads = {};   // the dense table's dim, or empty when
                                             // the worker had no batch this step
  // CTR accessor: one show and one click count per key (the servers keep
  // them per row; they decide when a row gets its extended embedding and
  // when it is shrunk). Empty: none sent (the servers count show 1, click 0).
  std::span<const float> sparse_shows = {};
  std::span<const float> sparse_clicks = {};
  // Sync mode: set for a push made for another worker's step. It is pushed
  // as idempotent (a resend of the slot is applied once), with zeros for
  // empty dense_grads, and does not count as one of this communicator's own
  // steps. Ignored by async and geo.
  std::optional<SyncSlot> sync_slot = std::nullopt;
};

// A push on its way to the servers; Wait() returns its outcome.
class PendingPush {
 public:
  PendingPush() = default;  // done and OK
  explicit PendingPush(Status done) : done_(std::move(done)) {}
  // The sparse and the dense request of a push (either may be invalid: not
  // sent), waited for through `client` (which must outlive this).
  PendingPush(const ps::PsClient* client, std::future<Status> sparse, std::future<Status> dense,
              std::chrono::milliseconds timeout, std::string context);
  PendingPush(PendingPush&&) = default;
  PendingPush& operator=(PendingPush&&) = default;

  // Blocks until the servers answered (bounded by the requests' deadlines),
  // receiving replies on this thread meanwhile. Call once.
  Status Wait();

 private:
  Status done_;
  const ps::PsClient* client_ = nullptr;
  std::future<Status> sparse_, dense_;
  std::chrono::milliseconds timeout_{0};
  std::string context_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  // Fills the requested values. Blocks at most the timeout (twice for geo:
  // a refresh of unseen keys then nothing more). Errors: those of PsClient
  // (Timeout / Unavailable naming the server, InvalidArgument for sizes);
  // for async, the first error of the sender thread. Values are unspecified
  // on error.
  virtual Status Pull(const PullRequest& request) = 0;

  // Hands over one step's gradients (see each class for when they reach the
  // servers). Every worker of a sync job must call Push once per step, with
  // empty spans when it had no batch. Errors as Pull; async also returns
  // Timeout naming the queue when it stayed full for the whole timeout;
  // InvalidArgument for sizes that do not fit the tables.
  virtual Status Push(const PushRequest& request) = 0;

  // Push without waiting for the servers where the mode would: sync sends
  // the requests and returns (Wait() returns once the step was applied), so
  // a heter worker computes the next micro-batch while a step waits for the
  // others. Async and geo Push() and return a done PendingPush (their Push
  // does not wait for the servers' answer to this step anyway). The request's
  // spans are read before it returns. Push(r) is StartPush(r).Wait().
  virtual PendingPush StartPush(const PushRequest& request) { return PendingPush(Push(request)); }

  // Returns once everything pushed so far reached the servers (async: queue
  // drained and sent; geo: pending deltas sent and the local copy dropped so
  // the next Pull reads the servers). Blocks at most the timeout; Timeout
  // names what was still pending.
  virtual Status Flush() = 0;

  // The factor the worker multiplies the gradients of its batch-mean loss by
  // before Push, given the samples in its batch.
  virtual double GradientScale(size_t batch_samples) const = 0;

  // "sync", "async", "geo" for logs.
  virtual const char* name() const = 0;

  // A restarted worker rejoining a running job (worker/app.h): its next own
  // Push is sync step `step` (the lowest step the servers have not applied),
  // sent idempotent, since its previous life may have delivered that step
  // to some servers before it died. Call before the first Push. Async and
  // geo share no step with the servers: FailedPrecondition.
  virtual Status ResumeAt(int64_t step) {
    return Status::FailedPrecondition(std::string(name()) + " mode has no step to resume at",
                                      "step " + std::to_string(step));
  }
};

// The communicator for the client's `Distributed.mode`. `client` is not
// owned and must outlive it. InvalidArgument when a named table is missing
// or of the wrong kind, num_workers/batch_size < 1, max_merge/k_steps < 1.
Result<std::unique_ptr<Communicator>> CreateCommunicator(ps::PsClient* client,
                                                         CommunicatorOptions options);

// Checks the options against the client's job (shared by the three classes).
Status ValidateCommunicatorOptions(const ps::PsClient& client, CommunicatorOptions* options);

// ---------------------------------------------------------------------------
// Reads the request's sparse rows and dense values from the servers, both
// requests in flight at once; returns only when both finished, so the
// caller's buffers are never written after it returns (sync and async Pull).
Status PullFromServers(ps::PsClient& client, const CommunicatorOptions& options,
                       const PullRequest& request);

// InvalidArgument (naming `what`) unless the request's shows and clicks are
// both empty or both have one count per key.
Status CheckCounts(const PushRequest& request, const char* what);

// Waits for a sparse and a dense request of `client` (either may be
// invalid: not sent) and returns the sparse one's error first.
Status WaitBoth(const ps::PsClient& client, std::future<Status> sparse, std::future<Status> dense,
                std::chrono::milliseconds timeout);

class SyncCommunicator final : public Communicator {
 public:
  // REQUIRES: ValidateCommunicatorOptions(*client, &options) is OK.
  SyncCommunicator(ps::PsClient* client, CommunicatorOptions options);

  Status Pull(const PullRequest& request) override;
  // Sends both tables' pushes at once (empty ones too: the servers count
  // every worker each step) and waits for both. The step number is the
  // count of earlier Pushes without a sync_slot.
  Status Push(const PushRequest& request) override { return StartPush(request).Wait(); }
  PendingPush StartPush(const PushRequest& request) override;
  Status Flush() override { return Status::OK(); }  // every Push is already applied
  // batch_samples / (batch_size * num_workers): the servers' sum over
  // workers is then the gradient of the mean loss over the global batch,
  // the same as one worker with a batch of batch_size * num_workers.
  double GradientScale(size_t batch_samples) const override;
  const char* name() const override { return "sync"; }
  Status ResumeAt(int64_t step) override;

  int64_t step() const { return step_; }

 private:
  // Fixed after construction.
  ps::PsClient* const client_;
  const CommunicatorOptions options_;
  size_t dense_dim_ = 0;
  std::vector<float> zero_dense_;  // pushed when the worker had no batch

  int64_t step_ = 0;  // driving thread only
  int64_t resumed_at_ = -1;  // driving thread only; ResumeAt's step (pushed idempotent)
};

// ---------------------------------------------------------------------------
class AsyncCommunicator final : public Communicator {
 public:
  // Starts the sender thread. REQUIRES: validated options.
  AsyncCommunicator(ps::PsClient* client, CommunicatorOptions options);
  // Flushes (errors are logged) and joins the sender thread.
  ~AsyncCommunicator() override;

  Status Pull(const PullRequest& request) override;
  // Copies the gradients into the queue; blocks while the queue is full, at
  // most the timeout.
  Status Push(const PushRequest& request) override;
  Status Flush() override;
  double GradientScale(size_t) const override { return 1.0; }
  const char* name() const override { return "async"; }

  // Sends made so far (each merges 1..max_merge Pushes). Thread-safe.
  int64_t sends() const;

 private:
  struct Batch {
    std::vector<uint64_t> keys;
    std::vector<float> sparse;
    std::vector<float> shows, clicks;  // empty, or one per key
    std::vector<float> dense;
  };
  void SenderLoop();
  // Merges `batches` (per-key sums, dense sums) and sends them; sender thread.
  Status Send(std::vector<Batch>& batches);

  // Fixed after construction.
  ps::PsClient* const client_;
  const CommunicatorOptions options_;
  size_t push_dim_ = 0;
  size_t dense_dim_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;   // queue changed, a send finished, or stop
  std::deque<Batch> queue_;      // guarded by mu_
  int in_flight_ = 0;            // guarded by mu_; batches taken, not yet sent
  Status error_;                 // guarded by mu_; first send failure
  bool stop_ = false;            // guarded by mu_
  int64_t sends_ = 0;            // guarded by mu_

  std::thread sender_;  // last: started once everything above exists
};

// ---------------------------------------------------------------------------
class GeoCommunicator final : public Communicator {
 public:
  // REQUIRES: validated options.
  GeoCommunicator(ps::PsClient* client, CommunicatorOptions options);

  // Sparse rows come from the local copy; keys it lacks are pulled from the
  // servers first. Dense values are the local copy (pulled on first use).
  Status Pull(const PullRequest& request) override;
  // Applies the gradients to the local copy with each table's optimizer rule
  // (its state is kept locally across exchanges); every k_steps-th Push
  // also exchanges with the servers (see Flush). Keys the local copy lacks
  // (pulled before the last exchange, e.g. by a heter pipeline that pulls
  // steps ahead) are read from the servers first.
  Status Push(const PushRequest& request) override;
  // Sends (local - synced) / num_workers for every row touched since the
  // last exchange and for the dense table, then drops the local sparse rows
  // and re-reads the dense table, so the next Pull sees every worker's work.
  Status Flush() override;
  double GradientScale(size_t) const override { return 1.0; }
  const char* name() const override { return "geo"; }

  int64_t exchanges() const { return exchanges_; }

 private:
  // Reads the keys the local copy lacks from the servers into it.
  Status FetchMissing(std::span<const uint64_t> keys);
  struct Row {
    std::vector<float> value;   // trained locally
    std::vector<float> synced;  // as last read from the servers
    float show = 0, click = 0;  // CTR counts pushed since the exchange
  };

  // Fixed after construction.
  ps::PsClient* const client_;
  const CommunicatorOptions options_;
  size_t sparse_dim_ = 0;
  size_t dense_dim_ = 0;
  std::unique_ptr<ps::OptimizerRule> sparse_rule_;
  std::unique_ptr<ps::OptimizerRule> dense_rule_;

  // Driving thread only.
  std::unordered_map<uint64_t, Row> rows_;                  // touched since the last exchange
  std::unordered_map<uint64_t, std::vector<float>> state_;  // optimizer state per key, kept
  std::vector<float> dense_value_, dense_synced_, dense_state_;
  bool dense_loaded_ = false;
  bool counts_ = false;  // shows and clicks were pushed since the exchange
  int64_t pushes_ = 0;
  int64_t exchanges_ = 0;
};

}  // namespace fleet::worker
