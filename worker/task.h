// WorkerTask: what one model needs from ps_worker's loop — its data shard in
// memory, one training step through a Communicator, held-out evaluation
// against the servers, and its metrics as sums that an all-reduce merges.
// One class per model, each in its own file under worker/tasks/; the loop in
// worker/app.cc knows none of them and finds them by name (model.kind) in
// the registry below.
//
// Adding a model: write worker/tasks/<name>_task.cc defining
// `extern const WorkerTaskType k<Name>TaskType = {...}` (its name, its
// factory and its config rules), and add it to the list in
// worker/tasks/registry.cc (a declaration and one entry). The list is
// explicit rather than filled by static registrars: objects of a static
// library that nothing references are dropped by the linker, so
// self-registration would silently lose models in any program that links
// fleet_worker without whole-archive, and a global registry filled at
// start-up would be a mutable global.
//
// Metric sums: a flat float vector laid out as
//   [loss_sum, samples, <model-specific sums>]
// (ctr_dnn: the positives then negatives of a BucketedAuc with 2^16 buckets;
// mlp: the count of correct predictions). Summing the vectors of all workers
// element-wise and calling Summarize gives the global values. Floats count
// exactly to 2^24 per element, far above one log window or one test set.
//
// Thread safety: one thread drives a task. The registry is immutable.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/status.h"
#include "worker/heter_client.h"
#include "ps/client.h"
#include "worker/communicator.h"
#include "worker/config.h"

namespace fleet::worker {

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
  // The sparse table the model reads and pushes besides model.dense_table
  // (nullopt: none). The job may hold no other table: a sync step waits for
  // a push to every table.
  virtual std::optional<uint32_t> sparse_table() const = 0;
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
  // With heter workers (UseHeterWorkers) the dense part runs there and, in
  // async and geo mode, the step may still be in flight when this returns
  // (Drain finishes it).
  virtual Status TrainStep(int64_t index, Communicator& comm) = 0;
  // A step this worker has no batch for (its shard is shorter than the
  // longest): what a sync step needs from every worker. Default: an empty
  // comm.Push.
  virtual Status SkipStep(Communicator& comm) { return comm.Push({}); }
  // Finishes every step still in flight and has the heter workers flush
  // their dense communicators, so that comm.Flush() then covers everything
  // trained so far. Default: nothing in flight.
  virtual Status Drain(Communicator& comm) { return Status::OK(); }

  // Heter workers: the dense section's input widths when the model can run
  // its dense part on heter workers, nullopt when it cannot (a job with
  // heter workers is then refused).
  virtual std::optional<heter::DenseShape> heter_shape() const { return std::nullopt; }
  // From now on run the dense part of each step on the heter workers behind
  // `client` (not owned; must outlive the task's use of it), cutting each
  // batch into config.micro_batches and keeping up to config.pipeline_depth
  // in flight. The communicator of TrainStep then serves the sparse table
  // only: the heter workers push the dense table. REQUIRES: heter_shape().
  virtual void UseHeterWorkers(heter::HeterClient* client, const ps::HeterConfig& config) {}
  // The training sums since the last call, then resets them.
  virtual std::vector<float> TakeTrainSums() = 0;
  // The loss sum of the training steps since the last TakeTrainSums (the
  // first of its sums), without resetting it: NaN or Inf once any of those
  // steps' loss was.
  virtual double train_loss_sum() const = 0;
  // Forward over this worker's held-out shard with the servers' current
  // parameters (read through `client`); returns its sums, or an empty
  // vector when the config names no held-out data.
  virtual Result<std::vector<float>> EvaluateSums(ps::PsClient& client) = 0;
  virtual MetricSummary Summarize(std::span<const float> sums) const = 0;
};

struct WorkerTaskOptions {
  int rank = 0;
  int world_size = 1;
  // While a data set loads, `load_progress` gets a line ("data.train: 1.2M
  // lines read, ...") every `load_progress_every`, so a long load is not
  // silent. No callback, or an interval of 0: no lines.
  std::chrono::nanoseconds load_progress_every{0};
  std::function<void(const std::string&)> load_progress = {};
};

// A model ps_worker can train: how model.kind names it, how its config is
// checked, and how it is built.
struct WorkerTaskType {
  // model.kind, e.g. "ctr_dnn".
  const char* kind;
  // Further model.kind names this type trains, or null (the CTR models
  // share one task: dnn, wide_deep, deepfm, dcn).
  std::vector<std::string> (*more_kinds)() = nullptr;
  // model.dense_table when the config does not set it.
  uint32_t default_dense_table;
  // Checks the parts of a parsed config this model requires (e.g. its data
  // keys): InvalidArgument naming the key. Runs inside ParseWorkerConfig.
  Status (*check_config)(const WorkerConfig& config);
  // Builds the model and loads this worker's shard of the data (lines /
  // samples i with i % world_size == rank). Errors: NotFound / IOError /
  // Corruption of the data files, InvalidArgument for a model config the
  // model refuses or a table that `job` lacks.
  Result<std::unique_ptr<WorkerTask>> (*create)(const WorkerConfig& config,
                                                const ps::JobConfig& job,
                                                const WorkerTaskOptions& options);
};

// Every model ps_worker knows, in a fixed order (worker/tasks/registry.cc).
// The types are constants with static storage.
std::span<const WorkerTaskType* const> WorkerTaskTypes();

// The type named `kind`, or nullptr.
const WorkerTaskType* FindWorkerTaskType(std::string_view kind);

// The model names, comma separated ("ctr_dnn, dnn, ..., mlp"), for error messages.
std::string WorkerTaskKinds();

// Builds the task of config.model.kind (see WorkerTaskType::create).
// InvalidArgument naming model.kind for a kind no type has.
Result<std::unique_ptr<WorkerTask>> CreateWorkerTask(const WorkerConfig& config,
                                                     const ps::JobConfig& job,
                                                     const WorkerTaskOptions& options);

}  // namespace fleet::worker
