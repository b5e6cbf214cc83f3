// ps_worker: trains the model of a job config against the parameter servers.
// RunPsWorker is the whole program as a library call (tests run several in
// threads of one process); PsWorkerMain adds flags, env and signals.
//
//   ps_worker --config=job.yaml [--override='a.b=1;c=2'] --rank=R --world_size=W
//             --servers=ip:port,... [--kv_endpoint=host:port --job_id=J]
//
// Every flag falls back to its FLEET_* variable (comm/cluster.h,
// ps/job_config.h); fleetrun passes both. The config sections the worker
// reads are described in worker/config.h.
//
// What a run does, in order:
//   1. loads this worker's shard of the data into memory (line / sample i
//      belongs to rank i % W), builds the model, and checks the config: the
//      dense table's dim must equal the model's parameter count, and the
//      job may hold no table the model does not use (a sync step waits for
//      a push to every table);
//   2. joins the metrics group (sums and maxima through the KV store, which
//      a restarted worker can rejoin; a world of one needs neither) and
//      agrees on the steps per epoch: the largest shard's batch count, so
//      every worker takes part in every sync step (a worker whose shard is
//      done pushes empty gradients) and in every reduction;
//   2b. a restarted worker (restart_generation > 0) whose earlier life
//      passed step 3 rejoins: sync asks the servers which step they hold
//      and pushes that step again (applied once); async and geo resume
//      after its newest progress line (the steps after it are taken again).
//      It skips step 3 and the batches of the steps done, logging
//      "rejoined at step S (skipped N batches ...); lost 0 updates". Heter
//      workers and a restart at an epoch's end get FailedPrecondition;
//   3. worker 0 writes the model's initialisation into the dense table,
//      unless server.load_dir is set (the servers loaded a checkpoint);
//      then all workers meet at a PS barrier;
//   3b. with heter workers (--heter_workers / FLEET_HETER_WORKERS) the model's
//      dense part runs there: the task cuts each batch into
//      Distributed.heter.micro_batches, keeps up to pipeline_depth of them
//      in flight (worker/heter_client.h), and the communicator serves the sparse
//      table only (the heter workers train the dense table);
//   4. per epoch: steps through the Communicator of Distributed.mode; every
//      train.log_interval steps one line with epoch, step, loss and AUC or
//      accuracy over all workers since the last line, and samples/s; at
//      the end Flush, barrier, held-out evaluation over all workers, and,
//      when due, worker 0 asks the servers to save;
//   5. a summary line: held-out metric (with the oracle AUC when data.oracle
//      names one), samples/s, skipped malformed lines over all workers.
//
// Sync-mode determinism: worker w's k-th batch holds lines {j*W + w : j in
// [k*B, (k+1)*B)}, so at step k the W workers together hold exactly the
// lines [k*W*B, (k+1)*W*B) that one worker with batch W*B holds. Each worker
// scales its batch-mean gradients by b/(B*W) and the servers sum them in
// rank order, giving the gradient of the mean loss over the global batch:
// the same parameters as one worker with batch W*B, up to float rounding.
// (Malformed lines shift the batches and break this; the data sets it is
// claimed for have none.)
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/job_auth.h"
#include "comm/process_context.h"
#include "comm/status.h"
#include "ps/job_config.h"

namespace fleet::worker {

struct PsWorkerOptions {
  int rank = 0;
  int num_workers = 1;
  // "ip:port" of server 0, 1, ... (real ports).
  std::vector<std::string> servers;
  // "host:port" of the KV store for the metrics group; empty = none, which
  // is only allowed for num_workers == 1.
  std::string kv_endpoint;
  std::string job_id = "default";
  // Restart generation (ClusterSpec::restart_generation): > 0 means this
  // worker was restarted and rejoins the running job (step 2b above).
  int restart_generation = 0;
  // The job's credentials: kv_auth signs KV store requests; auth is the
  // credentials of its ZeroMQ traffic (servers, heter workers). Null:
  // unsigned / plain TCP. ps_worker sets kv_auth from its ProcessContext
  // and auth from PsProcess::transport_auth (ps/ps_process.h).
  std::shared_ptr<const JobAuth> kv_auth;
  std::shared_ptr<const JobAuth> auth;
  ps::JobConfig job;
  // "ip:port" of heter worker 0, 1, ... (real ports); empty = none, the
  // worker runs the whole model itself.
  std::vector<std::string> heter_workers;
  // Where the job's processes log (heter worker r: <log_dir>/heterlog.<r>),
  // named in errors about a heter worker. Empty: not named.
  std::string log_dir;
  // When it becomes true the worker finishes its current step, flushes and
  // returns (report.stopped). Not owned; may be null.
  const std::atomic<bool>* stop = nullptr;
  // Set to true once the worker is past its start-up (data loaded, config
  // checked against the tables, start barrier passed): an error before it
  // is the input's (ps_worker exits 2 for InvalidArgument), one after it is
  // the job's (exit 1). Not owned; may be null.
  std::atomic<bool>* started = nullptr;
  // Fault injection for tests: called after each step's push with the
  // step's number (from 0 over all epochs); true makes the worker return
  // Internal there at once, as if killed between its push and its part of
  // the metrics round. Empty: never.
  std::function<bool(int64_t step)> die_after_push_for_test;
  // Worker 0 writes TensorBoard event files here (empty: none): train/loss,
  // train/<metric_name> (auc or accuracy) and train/samples_per_sec at each
  // progress line, eval/loss and eval/<metric_name> at each evaluation, by
  // global step. ps_worker: --tensorboard_dir, else <log_dir>/tb under
  // fleetrun (tensorboard::TensorBoardDir).
  std::string tensorboard_dir;
};

struct EpochReport {
  int epoch = 0;        // 1-based
  double heldout_loss = 0;
  double heldout_metric = 0;  // NaN when no held-out data / undefined
};

struct PsWorkerReport {
  std::string metric_name;                 // "auc" or "accuracy"
  std::vector<EpochReport> epochs;         // one per evaluation
  double heldout_metric = 0;               // the last evaluation's (NaN if none)
  double oracle_auc = 0;                   // from data.oracle; NaN when not given
  double train_samples_per_sec = 0;        // all workers together, excluding evaluation
  int64_t steps = 0;                       // steps this worker took part in
  int64_t malformed_lines = 0;             // over all workers
  bool stopped = false;                    // stop was requested
  // The training loss of every progress line (all workers; one per
  // train.log_interval steps and one at each epoch's end), in order.
  std::vector<double> train_losses;
  // With heter workers: this worker's training time spent waiting for the
  // dense side (HeterClient::blocked_seconds), as a fraction of its
  // training time (0 without heter workers).
  double heter_idle_fraction = 0;
  int64_t heter_resends = 0;  // micro-batches resent after a heter worker failed
};

// Runs the job as worker `options.rank`. Blocks until done or stopped; each
// wait on a server or peer is bounded by Distributed.timeout_ms.
// Errors: InvalidArgument (config, with the key; the dense table dim with
// the number required), NotFound/IOError/Corruption (data files), Timeout /
// Unavailable (servers or peers), each naming what failed.
Result<PsWorkerReport> RunPsWorker(const PsWorkerOptions& options);

// The program: exit 0 on success or a requested stop, 1 when training
// failed, 2 for bad flags or config.
int PsWorkerMain(int argc, char** argv);

// What every worker process (ps_worker, a Python script over the fleetps
// module) does before it reads data: several workers need a KV store
// (InvalidArgument saying how to give one), and the process claims its
// worker rank there (ProcessContext::ClaimRank as "<host> pid <pid>"), so
// two given the same rank are told now rather than failing later. Blocks
// up to 10 s reading the holder's name.
Status JoinAsWorker(const ProcessContext& ctx);

}  // namespace fleet::worker
