// The CTR task: every CTR model (model.kind dnn / ctr_dnn, wide_deep,
// deepfm, dcn; trainer/models/ctr_model.h). 26 sparse slots looked up in one
// PS sparse table and sum-pooled per slot, 13 dense features, the model's
// parts over them, sigmoid BCE. Metric: AUC (bucketed, 2^16 buckets,
// all-reducible). The sparse table may use the plain accessor (rows of
// `dim`) or the CTR accessor (rows of embed_dim + dim; the task then pushes
// a show and a click per key).
//
// With heter workers (UseHeterWorkers) the task keeps the sparse part of
// each step (read, pull, pool; unpool, push) and sends the dense part of
// each micro-batch to a heter worker (worker/heter_client.h); see StartHeterStep.
#include <glog/logging.h>

#include <chrono>
#include <cmath>
#include <deque>
#include <string>

#include "absl/strings/str_format.h"
#include "comm/file_io.h"
#include "data/ctr_reader.h"
#include "data/metrics.h"
#include "ps/table/accessor.h"
#include "trainer/kernels/cpu_backend.h"
#include "trainer/models/ctr_model.h"
#include "worker/task.h"
#include "worker/tasks/ctr_tower.h"

namespace fleet::worker {
namespace {

using trainer::CpuBackend;
using trainer::CtrModel;
using trainer::CtrModelConfig;
using trainer::EmbeddingBag;
using trainer::Shape;
using trainer::Tensor;

constexpr int kAucBuckets = data::BucketedAuc::kDefaultBuckets;

// Reads this worker's shard of `spec` into batches of batch_size; `what`
// ("data.train") names it in progress lines.
Status LoadBatches(const std::string& what, const std::string& spec, const WorkerTaskOptions& o,
                   int batch_size, uint64_t field_buckets, std::vector<data::CtrBatch>* out,
                   int64_t* malformed) {
  FLEET_ASSIGN_OR_RETURN(std::vector<std::string> files, data::ExpandFileSpec(spec));
  data::CtrReaderOptions ro;
  ro.batch_size = batch_size;
  ro.field_buckets = field_buckets;
  ro.rank = o.rank;
  ro.world_size = o.world_size;
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<data::CtrReader> reader,
                         data::CtrReader::Open(std::move(files), ro));
  using Clock = std::chrono::steady_clock;
  const bool report = o.load_progress && o.load_progress_every.count() > 0;
  const Clock::time_point start = Clock::now();
  Clock::time_point next_report = start + o.load_progress_every;
  while (true) {
    data::CtrBatch b;
    FLEET_ASSIGN_OR_RETURN(size_t n, reader->Next(&b));
    if (n == 0) break;
    out->push_back(std::move(b));
    if (report && Clock::now() >= next_report) {
      const data::CtrReaderStats& st = reader->stats();
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      o.load_progress(absl::StrFormat(
          "loading %s: %d lines of this worker's share read (%d samples, %d malformed), %d "
          "batches, %.0f lines/s",
          what, st.lines, st.samples, st.malformed, out->size(),
          seconds > 0 ? static_cast<double>(st.lines) / seconds : 0.0));
      next_report = Clock::now() + o.load_progress_every;
    }
  }
  *malformed += reader->stats().malformed;
  return Status::OK();
}

// The sparse part of one batch or micro-batch: samples [begin, end) of a
// CtrBatch, their keys slot after slot, the rows pulled for them pooled per
// slot, and what unpooling the pooled gradient needs (each slot's bag
// offsets). One per batch on the CPU path, one per micro-batch in flight on
// the heter path.
class SparsePart {
 public:
  SparsePart() : bags_(data::kCriteoSlots, EmbeddingBag(trainer::kernels::PoolMode::kSum)) {}

  // Gathers the keys of samples [begin, end) of b, has pull(rows) fill
  // their rows (keys().size() * dim floats), and sum-pools each slot into
  // pooled [slots, end - begin, dim]. Also notes each key's click (its
  // sample's label) for the CTR accessor.
  template <typename PullFn>
  Status Lookup(const data::CtrBatch& b, size_t begin, size_t end, int dim, PullFn&& pull,
                std::span<float> pooled) {
    const int64_t n = static_cast<int64_t>(end - begin);
    keys_.clear();
    clicks_.clear();
    slot_begin_.assign(1, 0);
    for (const data::SlotKeys& slot : b.slots) {
      const uint32_t first = slot.offsets[begin];
      keys_.insert(keys_.end(), slot.keys.begin() + first, slot.keys.begin() + slot.offsets[end]);
      for (size_t i = begin; i < end; ++i) {
        clicks_.insert(clicks_.end(), slot.offsets[i + 1] - slot.offsets[i], b.labels[i]);
      }
      slot_begin_.push_back(keys_.size());
    }
    rows_.resize(keys_.size() * dim);
    FLEET_RETURN_IF_ERROR(pull(std::span<float>(rows_)));
    for (int s = 0; s < data::kCriteoSlots; ++s) {
      const data::SlotKeys& slot = b.slots[s];
      offsets_.resize(n + 1);
      for (int64_t i = 0; i <= n; ++i) offsets_[i] = slot.offsets[begin + i] - slot.offsets[begin];
      const int64_t rows = static_cast<int64_t>(slot_begin_[s + 1] - slot_begin_[s]);
      Tensor in(rows_.data() + slot_begin_[s] * dim, Shape{rows, dim});
      Tensor out(pooled.data() + s * n * dim, Shape{n, dim});
      FLEET_RETURN_IF_ERROR(bags_[s].Forward(in, offsets_, &out));
    }
    return Status::OK();
  }

  // Row gradients of keys(), position by position (the client sums
  // duplicate keys), from the pooled gradient [slots, n, dim], scaled, and
  // appended to *row_grads.
  void Unpool(const float* pooled_grad, int dim, float scale, std::vector<float>* row_grads) {
    const size_t base = row_grads->size();
    row_grads->resize(base + keys_.size() * dim, 0.0f);
    const int64_t n = static_cast<int64_t>(offsets_.size()) - 1;
    for (int s = 0; s < data::kCriteoSlots; ++s) {
      const int64_t rows = static_cast<int64_t>(slot_begin_[s + 1] - slot_begin_[s]);
      Tensor drows(row_grads->data() + base + slot_begin_[s] * dim, Shape{rows, dim});
      bags_[s].Backward(Tensor(const_cast<float*>(pooled_grad) + s * n * dim, Shape{n, dim}),
                        &drows);
    }
    if (scale != 1.0f) {
      for (size_t i = base; i < row_grads->size(); ++i) (*row_grads)[i] *= scale;
    }
  }

  const std::vector<uint64_t>& keys() const { return keys_; }
  // One click count per key: its sample's label.
  const std::vector<float>& clicks() const { return clicks_; }

 private:
  std::vector<EmbeddingBag> bags_;  // one per slot (each keeps its offsets for Backward)
  std::vector<uint64_t> keys_;      // the samples' keys, slot after slot
  std::vector<float> clicks_;       // [keys]
  std::vector<size_t> slot_begin_;  // [slots + 1] positions in keys_
  std::vector<int64_t> offsets_;    // the last slot's bag offsets (all slots have n + 1)
  std::vector<float> rows_;
};

class CtrTask final : public WorkerTask {
 public:
  // `backend` runs `model` and must be the one it was created with.
  CtrTask(const WorkerConfig& config, const ps::JobConfig& job, std::unique_ptr<CpuBackend> backend,
          std::unique_ptr<CtrModel> model, std::vector<data::CtrBatch> train,
          std::vector<data::CtrBatch> test, int64_t malformed, int rank, int world_size)
      : config_(config),
        sync_(job.distributed.mode == ps::SyncMode::kSync),
        counts_(job.table(config.model.sparse_table)->accessor == ps::AccessorKind::kCtr),
        rank_(rank),
        world_size_(world_size),
        backend_(std::move(backend)),
        model_(std::move(model)),
        initial_(model_->arena().ParamsToHost()),
        dim_(model_->config().embedding_dim),
        train_(std::move(train)),
        test_(std::move(test)),
        malformed_(malformed),
        train_auc_(kAucBuckets) {}

  const char* metric_name() const override { return "auc"; }
  std::optional<uint32_t> sparse_table() const override { return config_.model.sparse_table; }
  size_t dense_param_count() const override { return model_->arena().size(); }
  std::vector<float> InitialDenseParams() const override { return initial_; }
  int64_t num_train_batches() const override { return static_cast<int64_t>(train_.size()); }
  size_t batch_samples(int64_t index) const override { return train_[index].size(); }
  int64_t malformed_lines() const override { return malformed_; }

  std::optional<heter::DenseShape> heter_shape() const override {
    return heter::DenseShape{data::kCriteoSlots, dim_, data::kCriteoDense};
  }
  void UseHeterWorkers(heter::HeterClient* client, const ps::HeterConfig& config) override {
    heter_ = client;
    heter_config_ = config;
  }

  // The step in its two parts: the sparse part (pull the batch's rows, pool
  // them; unpool the pooled gradient into row gradients, push) around the
  // dense part (the FC tower's forward and backward), here or on heter
  // workers.
  Status TrainStep(int64_t index, Communicator& comm) override {
    if (heter_ != nullptr) return StartHeterStep(&train_[index], comm);
    const data::CtrBatch& b = train_[index];
    FLEET_RETURN_IF_ERROR(Lookup(part_, b, [&](std::span<float> values) {
      return comm.Pull(
          {.sparse_keys = part_.keys(), .sparse_values = values, .dense_values = ParamSpan()});
    }));
    FLEET_ASSIGN_OR_RETURN(float loss, DenseForwardBackward(b));
    const float scale = static_cast<float>(comm.GradientScale(b.size()));
    row_grads_.clear();
    part_.Unpool(model_->pooled_grad().data(), dim_, scale, &row_grads_);
    std::span<float> dense_grads(model_->arena().grads().data(), model_->arena().size());
    if (scale != 1.0f) {
      for (float& g : dense_grads) g *= scale;
    }
    FLEET_RETURN_IF_ERROR(comm.Push(WithCounts(
        {.sparse_keys = part_.keys(), .sparse_grads = row_grads_, .dense_grads = dense_grads},
        part_.clicks())));
    const Tensor& p = model_->probabilities();
    AddTrainMetrics(loss, std::span<const float>(p.data(), b.size()), b.labels);
    return Status::OK();
  }

  Status SkipStep(Communicator& comm) override {
    // Sync mode with heter workers: the step's dense contributions of this
    // worker are empty micro-batches, the heter workers push zeros for them.
    if (heter_ != nullptr && sync_) return StartHeterStep(nullptr, comm);
    return comm.Push({});
  }

  Status Drain(Communicator& comm) override {
    if (heter_ == nullptr || !sent_since_flush_) return Status::OK();
    while (!in_flight_.empty()) FLEET_RETURN_IF_ERROR(CompleteOldest(comm));
    FLEET_RETURN_IF_ERROR(heter_->Flush());
    sent_since_flush_ = false;
    return Status::OK();
  }

  double train_loss_sum() const override { return train_loss_.Mean() * train_loss_.count(); }

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
      FLEET_RETURN_IF_ERROR(Lookup(part_, b, [&](std::span<float> values) {
        return client.PullSparse(config_.model.sparse_table, part_.keys(), values)
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
  // A micro-batch in flight to a heter worker: its sparse part (for
  // unpooling the reply) and the share of its step's gradient it carries.
  struct MicroBatch {
    heter::MicroBatchId id;
    SparsePart part;
    float scale = 1.0f;
  };
  // A step whose micro-batches are not all back: their row gradients and
  // counts gather here and are pushed when the last one is.
  struct Step {
    int64_t step = 0;
    int remaining = 0;
    std::vector<uint64_t> keys;
    std::vector<float> row_grads, shows, clicks;
  };

  static std::vector<float> Sums(data::MeanMetric& loss, const data::BucketedAuc& auc) {
    std::vector<float> v;
    v.reserve(2 + 2 * kAucBuckets);
    v.push_back(static_cast<float>(loss.sums()[0]));
    v.push_back(static_cast<float>(loss.sums()[1]));
    for (double x : auc.positives()) v.push_back(static_cast<float>(x));
    for (double x : auc.negatives()) v.push_back(static_cast<float>(x));
    return v;
  }

  std::span<float> ParamSpan() { return {model_->arena().params().data(), model_->arena().size()}; }

  // The whole batch's sparse part into pooled_.
  template <typename PullFn>
  Status Lookup(SparsePart& part, const data::CtrBatch& b, PullFn&& pull) {
    pooled_.resize(static_cast<size_t>(data::kCriteoSlots) * b.size() * dim_);
    return part.Lookup(b, 0, b.size(), dim_, pull, pooled_);
  }

  // The request's shows and clicks when the sparse table counts them (CTR
  // accessor): show 1 per key, the click its sample's label. `clicks` must
  // outlive the push.
  PushRequest WithCounts(PushRequest r, std::span<const float> clicks) {
    if (!counts_) return r;
    ones_.assign(r.sparse_keys.size(), 1.0f);
    r.sparse_shows = ones_;
    r.sparse_clicks = clicks;
    return r;
  }

  void AddTrainMetrics(float loss, std::span<const float> probs, std::span<const float> labels) {
    train_loss_.Add(static_cast<double>(loss) * labels.size(), static_cast<double>(labels.size()));
    train_auc_.Add(probs, labels);
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

  // Heter path. Cuts batch b (nullptr: none this step) into micro-batches,
  // pulls and pools each, and hands it to a heter worker, completing older
  // micro-batches whenever pipeline_depth are in flight (async, geo). Sync
  // mode sends all of the step's and finishes the step before returning:
  // its successor needs it applied.
  Status StartHeterStep(const data::CtrBatch* b, Communicator& comm) {
    const int M = heter_config_.micro_batches;
    const size_t n = b == nullptr ? 0 : b->size();
    Step step;
    step.step = next_step_++;
    // Each micro-batch's gradient is scaled so that the step's parts sum to
    // what the batch would push as a whole.
    const double batch_scale = n == 0 ? 0.0 : comm.GradientScale(n);
    for (int m = 0; m < M; ++m) {
      const size_t begin = n * m / M, end = n * (m + 1) / M;
      // An empty micro-batch matters only to a sync step's dense slots.
      if (begin == end && !sync_) continue;
      // Sync: the step's micro-batches all go out, whatever the depth: their
      // dense gradients are applied as one step, and no reply comes before
      // the last of them is sent.
      while (!sync_ && static_cast<int>(in_flight_.size()) >= heter_config_.pipeline_depth) {
        FLEET_RETURN_IF_ERROR(CompleteOldest(comm));
      }
      MicroBatch mb;
      mb.id = {rank_, step.step, m, M};
      // (A whole batch keeps the CPU path's factor exactly.)
      mb.scale = static_cast<float>(
          end - begin == n ? batch_scale : batch_scale * static_cast<double>(end - begin) / n);
      heter::TrainRequest r;
      r.id = mb.id;
      r.num_workers = world_size_;
      r.dense_grad_scale = mb.scale;
      r.pooled = SArray<float>::Uninitialized(static_cast<size_t>(data::kCriteoSlots) *
                                              (end - begin) * dim_);
      if (begin < end) {
        FLEET_RETURN_IF_ERROR(mb.part.Lookup(
            *b, begin, end, dim_,
            [&](std::span<float> values) {
              return comm.Pull({.sparse_keys = mb.part.keys(), .sparse_values = values});
            },
            r.pooled.span()));
        r.dense = SArray<float>(b->dense.data() + begin * data::kCriteoDense,
                                (end - begin) * data::kCriteoDense);
        r.labels = SArray<float>(b->labels.data() + begin, end - begin);
      }
      FLEET_RETURN_IF_ERROR(heter_->Submit(std::move(r)));
      sent_since_flush_ = true;
      in_flight_.push_back(std::move(mb));
      ++step.remaining;
    }
    steps_.push_back(std::move(step));
    if (steps_.back().remaining == 0) return PushFinishedSteps(comm);
    while (sync_ && !steps_.empty()) FLEET_RETURN_IF_ERROR(CompleteOldest(comm));
    return Status::OK();
  }

  // Takes the oldest micro-batch's reply: unpools its gradient into its
  // step, counts its metrics, and pushes every step that is complete.
  Status CompleteOldest(Communicator& comm) {
    FLEET_ASSIGN_OR_RETURN(heter::Completed done, heter_->WaitOldest());
    MicroBatch mb = std::move(in_flight_.front());
    in_flight_.pop_front();
    CHECK(done.request.id == mb.id)
        << "heter client returned " << done.request.id.ToString() << " for " << mb.id.ToString();
    Step& step = steps_.front();
    CHECK_EQ(step.step, mb.id.mini_batch);
    if (done.request.batch() > 0) {
      const std::vector<uint64_t>& keys = mb.part.keys();
      step.keys.insert(step.keys.end(), keys.begin(), keys.end());
      mb.part.Unpool(done.reply.pooled_grad.data(), dim_, mb.scale, &step.row_grads);
      if (counts_) {
        step.shows.insert(step.shows.end(), keys.size(), 1.0f);
        step.clicks.insert(step.clicks.end(), mb.part.clicks().begin(), mb.part.clicks().end());
      }
      AddTrainMetrics(done.reply.loss, done.reply.probs.span(), done.request.labels.span());
    }
    --step.remaining;
    return PushFinishedSteps(comm);
  }

  // Pushes the sparse gradients of the complete steps at the front.
  Status PushFinishedSteps(Communicator& comm) {
    while (!steps_.empty() && steps_.front().remaining == 0) {
      Step step = std::move(steps_.front());
      steps_.pop_front();
      FLEET_RETURN_IF_ERROR(comm.Push({.sparse_keys = step.keys,
                                       .sparse_grads = step.row_grads,
                                       .sparse_shows = step.shows,
                                       .sparse_clicks = step.clicks})
                                .WithContext("step " + std::to_string(step.step)));
    }
    return Status::OK();
  }

  // Fixed after construction.
  const WorkerConfig config_;
  const bool sync_;    // Distributed.mode is sync
  const bool counts_;  // the sparse table keeps show/click counts (CTR accessor)
  const int rank_, world_size_;
  std::unique_ptr<CpuBackend> backend_;  // declared before model_, which uses it
  std::unique_ptr<CtrModel> model_;
  const std::vector<float> initial_;                // the model's initialisation (model.seed)
  const int dim_;                                   // embedding width = the sparse table's pull dim
  const std::vector<data::CtrBatch> train_, test_;  // this worker's shards
  const int64_t malformed_;

  // CPU path, per-step scratch.
  SparsePart part_;
  std::vector<float> row_grads_, pooled_, ones_;

  // Heter path (set by UseHeterWorkers).
  heter::HeterClient* heter_ = nullptr;
  ps::HeterConfig heter_config_;
  int64_t next_step_ = 0;             // steps started (the sync step of the next one)
  bool sent_since_flush_ = false;     // the heter workers got work since their last flush
  std::deque<MicroBatch> in_flight_;  // in the client's order
  std::deque<Step> steps_;            // started, not pushed; in order

  data::MeanMetric train_loss_;
  data::BucketedAuc train_auc_;
};

Status CheckCtrConfig(const WorkerConfig& config) {
  if (config.data.train.empty()) {
    return Status::InvalidArgument("required for model.kind " + config.model.kind, "data.train");
  }
  return Status::OK();
}

std::vector<std::string> CtrKinds() {
  std::vector<std::string> kinds;
  for (const trainer::CtrModelKind& k : trainer::CtrModelKinds()) kinds.push_back(k.name);
  return kinds;
}

Result<std::unique_ptr<WorkerTask>> CreateCtrTask(const WorkerConfig& config,
                                                  const ps::JobConfig& job,
                                                  const WorkerTaskOptions& options) {
  FLEET_ASSIGN_OR_RETURN(CtrModelConfig mc, CtrTowerConfig(config, job));
  // Element-wise kernels on the calling thread: several workers share the
  // cores, and BLAS has its own threads (train.blas_threads).
  auto backend = std::make_unique<CpuBackend>();
  Result<std::unique_ptr<CtrModel>> model = CtrModel::Create(mc, backend.get());
  if (!model.ok()) return model.status().WithContext("model.kind " + config.model.kind);
  std::vector<data::CtrBatch> train, test;
  int64_t malformed = 0;
  FLEET_RETURN_IF_ERROR(LoadBatches("data.train", config.data.train, options,
                                    config.train.batch_size, config.data.field_buckets, &train,
                                    &malformed)
                            .WithContext("data.train"));
  if (!config.data.test.empty()) {
    FLEET_RETURN_IF_ERROR(LoadBatches("data.test", config.data.test, options,
                                      config.train.batch_size, config.data.field_buckets, &test,
                                      &malformed)
                              .WithContext("data.test"));
  }
  return std::unique_ptr<WorkerTask>(std::make_unique<CtrTask>(
      config, job, std::move(backend), std::move(model).value(), std::move(train), std::move(test),
      malformed, options.rank, options.world_size));
}

}  // namespace

Result<CtrModelConfig> CtrTowerConfig(const WorkerConfig& config, const ps::JobConfig& job) {
  // ctr_dnn is dnn's first name.
  const std::string kind = config.model.kind == "ctr_dnn" ? "dnn" : config.model.kind;
  const trainer::CtrModelKind* parts = trainer::FindCtrModelKind(kind);
  if (parts == nullptr) {
    std::string names = "ctr_dnn";
    for (const std::string& k : CtrKinds()) names += ", " + k;
    return Status::InvalidArgument("'" + config.model.kind + "' is not a CTR model (" + names + ")",
                                   "model.kind");
  }
  const ps::TableConfig* sparse = job.table(config.model.sparse_table);
  if (sparse == nullptr || sparse->kind != ps::TableKind::kSparse) {
    return Status::InvalidArgument(
        "model.kind " + config.model.kind + " needs a sparse table; no such table",
        "model.sparse_table=" + std::to_string(config.model.sparse_table));
  }
  CtrModelConfig mc;
  mc.num_slots = data::kCriteoSlots;
  mc.num_dense = data::kCriteoDense;
  // What a pull returns per key: `dim` (plain), embed_w then embedx (ctr).
  mc.embedding_dim = static_cast<int>(ps::MakeAccessor(*sparse)->pull_dim());
  mc.wide = parts->wide;
  mc.fm = parts->fm;
  mc.cross_layers = parts->cross ? config.model.cross_layers : 0;
  mc.hidden = parts->deep ? config.model.hidden : std::vector<int>{};
  mc.seed = config.model.seed;
  return mc;
}

// Listed in worker/tasks/registry.cc.
extern const WorkerTaskType kCtrTaskType = {.kind = "ctr_dnn",
                                            .more_kinds = CtrKinds,
                                            .default_dense_table = 1,
                                            .check_config = CheckCtrConfig,
                                            .create = CreateCtrTask};

}  // namespace fleet::worker
