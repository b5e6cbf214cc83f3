// WorkerTask: what one model needs from ps_worker's loop — its data shard in
// memory, one training step through a Communicator, held-out evaluation
// against the servers, and its metrics as sums that an all-reduce merges.
// One class per model (worker_ctr_task.cc, worker_mlp_task.cc); the loop in
// worker_app.cc knows none of them.
//
// Metric sums: a flat float vector laid out as
//   [loss_sum, samples, <model-specific sums>]
// (ctr_dnn: the positives then negatives of a BucketedAuc with 2^16 buckets;
// mlp: the count of correct predictions). Summing the vectors of all workers
// element-wise and calling Summarize gives the global values. Floats count
// exactly to 2^24 per element, far above one log window or one test set.
//
// Thread safety: one thread drives a task.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/status.h"
#include "ps/client.h"
#include "trainer/communicator.h"
#include "trainer/worker_config.h"

namespace fleet::trainer {

struct MetricSummary {
  double loss = 0;     // mean over samples
  double metric = 0;   // AUC or accuracy (NaN when undefined)
  double samples = 0;
};

class WorkerTask {
 public:
  virtual ~WorkerTask() = default;

  // "auc" or "accuracy".
  virtual const char* metric_name() const = 0;
  // Dense parameters of the model (the dense table's required dim), and
  // their initial values (model.seed).
  virtual size_t dense_param_count() const = 0;
  virtual std::vector<float> InitialDenseParams() const = 0;
  // Batches of this worker's training shard per epoch.
  virtual int64_t num_train_batches() const = 0;
  // Samples in local batch `index`. REQUIRES: index < num_train_batches().
  virtual size_t batch_samples(int64_t index) const = 0;
  // Lines skipped as malformed while loading (train + test).
  virtual int64_t malformed_lines() const = 0;

  // One step on local batch `index`: comm.Pull, forward, backward, scale by
  // comm.GradientScale, comm.Push; adds to the training metric sums. Errors
  // of the communicator, or InvalidArgument from the model (bad values).
  virtual Status TrainStep(int64_t index, Communicator& comm) = 0;
  // The training sums since the last call, then resets them.
  virtual std::vector<float> TakeTrainSums() = 0;
  // Forward over this worker's held-out shard with the servers' current
  // parameters (read through `client`); returns its sums, or an empty
  // vector when the config names no held-out data.
  virtual Result<std::vector<float>> EvaluateSums(ps::PsClient& client) = 0;
  virtual MetricSummary Summarize(std::span<const float> sums) const = 0;
};

struct WorkerTaskOptions {
  int rank = 0;
  int world_size = 1;
};

// Builds the model of config.model.kind and loads this worker's shard of the
// data (lines / samples i with i % world_size == rank). Errors: NotFound /
// IOError / Corruption of the data files, InvalidArgument for a model config
// the model refuses or a sparse table that `job` lacks.
Result<std::unique_ptr<WorkerTask>> CreateWorkerTask(const WorkerConfig& config,
                                                     const ps::JobConfig& job,
                                                     const WorkerTaskOptions& options);

// One class per model, created by CreateWorkerTask.
Result<std::unique_ptr<WorkerTask>> CreateCtrDnnTask(const WorkerConfig& config,
                                                     const ps::JobConfig& job,
                                                     const WorkerTaskOptions& options);
Result<std::unique_ptr<WorkerTask>> CreateMlpTask(const WorkerConfig& config,
                                                  const WorkerTaskOptions& options);

}  // namespace fleet::trainer
