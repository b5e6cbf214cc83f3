// HeterWorker: one heter worker. It serves the heter protocol
// (worker/heter_protocol.h) to the CPU workers of the job: for each micro-batch it
// runs the dense section (heter/dense_section.h) on its device, answers with
// the gradient of the pooled embeddings, the loss and the predictions, and
// trains the dense table on the parameter servers through a dense-only
// Communicator of Distributed.mode (worker/communicator.h):
//
//   sync   parameters are pulled once per step (every micro-batch of step k
//          sees step k-1 applied: a CPU worker starts step k only once its
//          step k-1 was); the micro-batch's scaled gradient is pushed as
//          slot (worker, micro-batch) of its step, idempotently, and the
//          reply is sent once the step was applied. The push does not hold
//          up the next micro-batch (Communicator::StartPush).
//   async  parameters are pulled for every micro-batch; the gradient goes
//          to the communicator's background sender.
//   geo    the dense table is trained on a local copy, the deltas / number
//          of heter workers are exchanged every Distributed.k_steps
//          micro-batches.
//
// A micro-batch resent after its first heter worker failed (attempt > 0) is
// computed and answered; in async and geo its dense gradient is not pushed
// (the failed one may have pushed it: at most once), in sync the servers
// keep one contribution per slot (exactly once).
//
// Threads: the RpcNode's I/O thread queues requests; one compute thread
// runs them in arrival order (one device, one model); one reply thread
// waits for each micro-batch's push and answers it.
//
// Thread safety: all public methods are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/rpc.h"
#include "comm/status.h"
#include "heter/dense_section.h"
#include "ps/client.h"
#include "ps/job_config.h"
#include "worker/communicator.h"

namespace fleet::heter {

struct HeterWorkerOptions {
  // "ip:port" to listen on; port 0 picks a free one (Start() returns it).
  std::string endpoint = "127.0.0.1:0";
  int rank = 0;
  // Heter workers of the job (geo: the servers get each one's delta /
  // this). >= 1.
  int num_heter_workers = 1;
  // "ip:port" of server 0, 1, ... (real ports).
  std::vector<std::string> servers;
  ps::JobConfig job;
  // Where the dense section runs: "cpu" or "cuda:K".
  trainer::Device device;
  // Threads of the element-wise kernels on the CPU (besides BLAS's own:
  // train.blas_threads). 0: the compute thread does them.
  int pool_threads = 0;
  // The job's credentials for this heter worker (serving and as a PS client)'s ZeroMQ traffic
  // (VanOptions::auth); null: plain TCP. Programs pass
  // PsProcess::transport_auth (ps/ps_process.h).
  std::shared_ptr<const JobAuth> auth;
};

class HeterWorker {
 public:
  // Builds the dense section and connects to the servers (lazily).
  // InvalidArgument for a config without a dense section (DenseSection) or
  // bad options; Unavailable for a device that cannot be used.
  static Result<std::unique_ptr<HeterWorker>> Create(HeterWorkerOptions options);
  ~HeterWorker();  // Shutdown()

  // Starts serving; returns the bound "ip:port". Errors as RpcNode::Listen.
  Result<std::string> Start();

  // Stops taking requests, computes and answers the ones received (up to
  // `grace`), flushes the dense communicator (async: its queue; geo: its
  // pending deltas) and closes the transport. Idempotent; returns the
  // flush's status.
  Status Shutdown(std::chrono::milliseconds grace = std::chrono::seconds(10));

  const DenseSection& section() const { return *section_; }
  // Micro-batches computed (and answered or failed) so far.
  int64_t micro_batches() const { return computed_.load(); }

 private:
  struct Work {
    Message request;
    Responder responder;
  };
  struct Reply {
    worker::PendingPush push;
    Message message;  // sent when the push succeeded
    Responder responder;
    MicroBatchId id;   // a failed push is answered for it (EncodeFailureReply)
    std::string what;  // names the micro-batch in errors
  };

  explicit HeterWorker(HeterWorkerOptions options);
  void ComputeLoop();
  void ReplyLoop();
  // Runs one HETER_TRAIN request; queues its reply (or answers its error).
  void Train(Work work);
  // Pulls the dense parameters the micro-batch of `step` must see.
  Status LoadParams(int64_t step);
  void QueueReply(Reply reply);

  // Fixed after construction.
  const HeterWorkerOptions options_;
  const std::string name_;  // "heter worker 0"
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<DenseSection> section_;
  std::unique_ptr<ps::PsClient> client_;
  std::unique_ptr<worker::Communicator> comm_;
  std::unique_ptr<RpcNode> rpc_;

  // Compute thread only.
  std::vector<float> dense_grad_;
  int64_t params_step_ = -1;  // sync: the step whose parameters are loaded

  std::mutex mu_;
  std::condition_variable work_cv_, reply_cv_;
  std::deque<Work> work_;        // guarded by mu_
  std::deque<Reply> replies_;    // guarded by mu_
  bool stopping_ = false;        // guarded by mu_: no more work will come
  bool computing_done_ = false;  // guarded by mu_: the compute thread has left
  bool shut_down_ = false;       // guarded by mu_
  std::atomic<int64_t> computed_{0};

  std::thread compute_thread_, reply_thread_;
};

// The program: heter_worker --endpoint=ip:port --config=job.yaml, with the
// cluster flags / FLEET_* environment of comm/cluster.h (role heter_worker,
// rank, servers, kv_endpoint, job_id, device). Publishes the bound endpoint
// at EndpointKey(heter_worker, rank) when there is a KV store. SIGTERM /
// SIGINT stop it gracefully. Exit 0 when stopped, 1 when serving failed, 2
// for bad flags or config.
int HeterWorkerMain(int argc, char** argv);

}  // namespace fleet::heter
