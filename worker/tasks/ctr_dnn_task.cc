// The ctr_dnn task: 26 sparse slots looked up in one PS sparse table and
// sum-pooled per slot, 13 dense features, CtrDnn's FC tower, sigmoid BCE.
// Metric: AUC (bucketed, 2^16 buckets, all-reducible).
#include <cmath>
#include <string>

#include <glog/logging.h>

#include "trainer/data/ctr_reader.h"
#include "trainer/data/file_io.h"
#include "trainer/data/metrics.h"
#include "trainer/models/ctr_dnn.h"
#include "worker/task.h"

namespace fleet::worker {
namespace {

using trainer::CpuBackend;
using trainer::CtrDnn;
using trainer::CtrDnnConfig;
using trainer::EmbeddingBag;
using trainer::Shape;
using trainer::Tensor;

constexpr int kAucBuckets = data::BucketedAuc::kDefaultBuckets;

// Reads this worker's shard of `spec` into batches of batch_size.
Status LoadBatches(const std::string& spec, const WorkerTaskOptions& o, int batch_size,
                   std::vector<data::CtrBatch>* out, int64_t* malformed) {
  FLEET_ASSIGN_OR_RETURN(std::vector<std::string> files, data::ExpandFileSpec(spec));
  data::CtrReaderOptions ro;
  ro.batch_size = batch_size;
  ro.rank = o.rank;
  ro.world_size = o.world_size;
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<data::CtrReader> reader,
                         data::CtrReader::Open(std::move(files), ro));
  while (true) {
    data::CtrBatch b;
    FLEET_ASSIGN_OR_RETURN(size_t n, reader->Next(&b));
    if (n == 0) break;
    out->push_back(std::move(b));
  }
  *malformed += reader->stats().malformed;
  return Status::OK();
}

class CtrDnnTask final : public WorkerTask {
 public:
  // `backend` runs `model` and must be the one it was created with.
  CtrDnnTask(const WorkerConfig& config, std::unique_ptr<CpuBackend> backend,
             std::unique_ptr<CtrDnn> model, std::vector<data::CtrBatch> train,
             std::vector<data::CtrBatch> test, int64_t malformed)
      : config_(config),
        backend_(std::move(backend)),
        model_(std::move(model)),
        initial_(model_->arena().ParamsToHost()),
        dim_(model_->config().embedding_dim),
        train_(std::move(train)),
        test_(std::move(test)),
        malformed_(malformed),
        bags_(data::kCriteoSlots, EmbeddingBag(trainer::kernels::PoolMode::kSum)),
        train_auc_(kAucBuckets) {}

  const char* metric_name() const override { return "auc"; }
  std::optional<uint32_t> sparse_table() const override { return config_.model.sparse_table; }
  size_t dense_param_count() const override { return model_->arena().size(); }
  std::vector<float> InitialDenseParams() const override { return initial_; }
  int64_t num_train_batches() const override { return static_cast<int64_t>(train_.size()); }
  size_t batch_samples(int64_t index) const override { return train_[index].size(); }
  int64_t malformed_lines() const override { return malformed_; }

  // The step in its two parts: the sparse part (pull the batch's rows,
  // pool them; unpool the pooled gradient into row gradients, push) around
  // the dense part (the FC tower's forward and backward).
  Status TrainStep(int64_t index, Communicator& comm) override {
    const data::CtrBatch& b = train_[index];
    FLEET_RETURN_IF_ERROR(Lookup(b, [&](std::span<float> values) {
      return comm.Pull({.sparse_keys = keys_,
                        .sparse_values = values,
                        .dense_values = ParamSpan()});
    }));
    FLEET_ASSIGN_OR_RETURN(float loss, DenseForwardBackward(b));
    UnpoolGradients();
    const float scale = static_cast<float>(comm.GradientScale(b.size()));
    std::span<float> dense_grads(model_->arena().grads().data(), model_->arena().size());
    if (scale != 1.0f) {
      for (float& g : row_grads_) g *= scale;
      for (float& g : dense_grads) g *= scale;
    }
    FLEET_RETURN_IF_ERROR(comm.Push({.sparse_keys = keys_,
                                     .sparse_grads = row_grads_,
                                     .dense_grads = dense_grads}));

    const Tensor& p = model_->probabilities();
    std::span<const float> probs(p.data(), b.size());
    train_loss_.Add(static_cast<double>(loss) * b.size(), static_cast<double>(b.size()));
    train_auc_.Add(probs, b.labels);
    return Status::OK();
  }

  std::vector<float> TakeTrainSums() override {
    std::vector<float> sums = Sums(train_loss_, train_auc_);
    train_loss_.Reset();
    train_auc_.Reset();
    return sums;
  }

  Result<std::vector<float>> EvaluateSums(ps::PsClient& client) override {
    if (config_.data.test.empty()) return std::vector<float>{};
    // One dense read for the whole pass: evaluation happens between epochs,
    // when no worker pushes.
    FLEET_RETURN_IF_ERROR(
        client.PullDense(config_.model.dense_table, ParamSpan()).WithContext("evaluation"));
    data::MeanMetric loss;
    data::BucketedAuc auc(kAucBuckets);
    for (const data::CtrBatch& b : test_) {
      FLEET_RETURN_IF_ERROR(Lookup(b, [&](std::span<float> values) {
        return client.PullSparse(config_.model.sparse_table, keys_, values)
            .WithContext("evaluation");
      }));
      FLEET_ASSIGN_OR_RETURN(float l, model_->Forward(pooled_, b.dense, b.labels));
      const Tensor& p = model_->probabilities();
      loss.Add(static_cast<double>(l) * b.size(), static_cast<double>(b.size()));
      auc.Add(std::span<const float>(p.data(), b.size()), b.labels);
    }
    return Sums(loss, auc);
  }

  MetricSummary Summarize(std::span<const float> sums) const override {
    MetricSummary m;
    if (sums.size() != 2 + 2 * static_cast<size_t>(kAucBuckets)) return m;
    m.samples = sums[1];
    m.loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
    std::vector<double> pos(sums.begin() + 2, sums.begin() + 2 + kAucBuckets);
    std::vector<double> neg(sums.begin() + 2 + kAucBuckets, sums.end());
    m.metric = data::AucFromBuckets(pos, neg);
    return m;
  }

 private:
  static std::vector<float> Sums(data::MeanMetric& loss, const data::BucketedAuc& auc) {
    std::vector<float> v;
    v.reserve(2 + 2 * kAucBuckets);
    v.push_back(static_cast<float>(loss.sums()[0]));
    v.push_back(static_cast<float>(loss.sums()[1]));
    for (double x : auc.positives()) v.push_back(static_cast<float>(x));
    for (double x : auc.negatives()) v.push_back(static_cast<float>(x));
    return v;
  }

  std::span<float> ParamSpan() {
    return {model_->arena().params().data(), model_->arena().size()};
  }

  // The dense part of a step on pooled_: the tower's forward and backward
  // (gradients of the batch-mean loss in the arena and in the model's
  // pooled gradients). Returns the loss.
  Result<float> DenseForwardBackward(const data::CtrBatch& b) {
    model_->arena().ZeroGrad();
    FLEET_ASSIGN_OR_RETURN(float loss, model_->Forward(pooled_, b.dense, b.labels));
    model_->Backward();
    return loss;
  }

  // Row gradients from the pooled gradients, position by position into
  // row_grads_ (the client sums duplicate keys).
  void UnpoolGradients() {
    const int D = dim_;
    row_grads_.assign(keys_.size() * D, 0.0f);
    for (int s = 0; s < data::kCriteoSlots; ++s) {
      const size_t n = slot_begin_[s + 1] - slot_begin_[s];
      Tensor drows(row_grads_.data() + slot_begin_[s] * D, Shape{static_cast<int64_t>(n), D});
      bags_[s].Backward(model_->pooled_grad(s), &drows);
    }
  }

  // Gathers the batch's keys slot after slot into keys_, has `pull` fill
  // their rows, and sum-pools each slot into pooled_ [slots, B, D].
  template <typename PullFn>
  Status Lookup(const data::CtrBatch& b, PullFn&& pull) {
    const int D = dim_;
    const int64_t B = static_cast<int64_t>(b.size());
    keys_.clear();
    slot_begin_.assign(1, 0);
    for (const data::SlotKeys& slot : b.slots) {
      keys_.insert(keys_.end(), slot.keys.begin(), slot.keys.end());
      slot_begin_.push_back(keys_.size());
    }
    rows_.resize(keys_.size() * D);
    FLEET_RETURN_IF_ERROR(pull(std::span<float>(rows_)));
    pooled_.resize(static_cast<size_t>(data::kCriteoSlots) * B * D);
    for (int s = 0; s < data::kCriteoSlots; ++s) {
      const size_t n = slot_begin_[s + 1] - slot_begin_[s];
      offsets_.assign(b.slots[s].offsets.begin(), b.slots[s].offsets.end());
      Tensor rows(rows_.data() + slot_begin_[s] * D, Shape{static_cast<int64_t>(n), D});
      Tensor out(pooled_.data() + s * B * D, Shape{B, D});
      FLEET_RETURN_IF_ERROR(bags_[s].Forward(rows, offsets_, &out));
    }
    return Status::OK();
  }

  // Fixed after construction.
  const WorkerConfig config_;
  std::unique_ptr<CpuBackend> backend_;  // declared before model_, which uses it
  std::unique_ptr<CtrDnn> model_;
  const std::vector<float> initial_;     // the model's initialisation (model.seed)
  const int dim_;                        // embedding width = the sparse table's dim
  const std::vector<data::CtrBatch> train_, test_;  // this worker's shards
  const int64_t malformed_;

  // Per-step scratch.
  std::vector<EmbeddingBag> bags_;  // one per slot (each keeps its offsets for Backward)
  std::vector<uint64_t> keys_;      // the batch's keys, slot after slot
  std::vector<size_t> slot_begin_;  // [slots + 1] positions in keys_
  std::vector<int64_t> offsets_;
  std::vector<float> rows_, row_grads_, pooled_;

  data::MeanMetric train_loss_;
  data::BucketedAuc train_auc_;
};

Status CheckCtrDnnConfig(const WorkerConfig& config) {
  if (config.data.train.empty()) {
    return Status::InvalidArgument("required for model.kind ctr_dnn", "data.train");
  }
  return Status::OK();
}

Result<std::unique_ptr<WorkerTask>> CreateCtrDnnTask(const WorkerConfig& config,
                                                     const ps::JobConfig& job,
                                                     const WorkerTaskOptions& options) {
  const ps::TableConfig* sparse = job.table(config.model.sparse_table);
  if (sparse == nullptr || sparse->kind != ps::TableKind::kSparse ||
      sparse->accessor != ps::AccessorKind::kPlain) {
    return Status::InvalidArgument("ctr_dnn needs a sparse table with accessor plain; no such table",
                                   "model.sparse_table=" + std::to_string(config.model.sparse_table));
  }
  CtrDnnConfig mc;
  mc.num_slots = data::kCriteoSlots;
  mc.num_dense = data::kCriteoDense;
  mc.embedding_dim = static_cast<int>(sparse->dim);
  mc.hidden = config.model.hidden;
  mc.seed = config.model.seed;
  // Element-wise kernels on the calling thread: several workers share the
  // cores, and BLAS has its own threads (train.blas_threads).
  auto backend = std::make_unique<CpuBackend>();
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<CtrDnn> model, CtrDnn::Create(mc, backend.get()));
  std::vector<data::CtrBatch> train, test;
  int64_t malformed = 0;
  FLEET_RETURN_IF_ERROR(
      LoadBatches(config.data.train, options, config.train.batch_size, &train, &malformed)
          .WithContext("data.train"));
  if (!config.data.test.empty()) {
    FLEET_RETURN_IF_ERROR(
        LoadBatches(config.data.test, options, config.train.batch_size, &test, &malformed)
            .WithContext("data.test"));
  }
  return std::unique_ptr<WorkerTask>(std::make_unique<CtrDnnTask>(
      config, std::move(backend), std::move(model), std::move(train), std::move(test), malformed));
}

}  // namespace

// Listed in worker/tasks/registry.cc.
extern const WorkerTaskType kCtrDnnTaskType = {.kind = "ctr_dnn",
                                               .default_dense_table = 1,
                                               .check_config = CheckCtrDnnConfig,
                                               .create = CreateCtrDnnTask};

}  // namespace fleet::worker
