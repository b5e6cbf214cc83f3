// The mlp task: MNIST-format images through the Mlp model, every parameter
// in one PS dense table. Metric: accuracy.
#include <string>

#include "data/idx_reader.h"
#include "data/metrics.h"
#include "trainer/kernels/cpu_backend.h"
#include "trainer/models/mlp.h"
#include "worker/task.h"

namespace fleet::worker {
namespace {

using trainer::CpuBackend;
using trainer::Mlp;
using trainer::MlpConfig;

// This worker's samples (i % world_size == rank, as for text lines), in order.
struct Shard {
  int64_t count = 0;
  int width = 0;
  std::vector<float> pixels;   // [count, width]
  std::vector<int32_t> labels;  // [count]
};

Result<Shard> LoadShard(const std::string& images, const std::string& labels, int num_classes,
                        int expected_width, const WorkerTaskOptions& o) {
  FLEET_ASSIGN_OR_RETURN(data::IdxDataset ds, data::ReadIdxDataset(images, labels, num_classes));
  const int width = ds.images.pixels_per_image();
  if (width != expected_width) {
    return Status::InvalidArgument("images have " + std::to_string(width) +
                                       " pixels but model.sizes[0] is " +
                                       std::to_string(expected_width),
                                   images);
  }
  Shard s;
  s.width = width;
  for (int64_t i = o.rank; i < ds.images.count; i += o.world_size) {
    s.pixels.insert(s.pixels.end(), ds.images.pixels.begin() + i * width,
                    ds.images.pixels.begin() + (i + 1) * width);
    s.labels.push_back(ds.labels[i]);
  }
  s.count = static_cast<int64_t>(s.labels.size());
  return s;
}

class MlpTask final : public WorkerTask {
 public:
  MlpTask(const WorkerConfig& config, std::unique_ptr<CpuBackend> backend,
          std::unique_ptr<Mlp> model, Shard train, Shard test)
      : config_(config),
        backend_(std::move(backend)),
        model_(std::move(model)),
        initial_(model_->arena().ParamsToHost()),
        batch_(config.train.batch_size),
        train_(std::move(train)),
        test_(std::move(test)) {}

  const char* metric_name() const override { return "accuracy"; }
  std::optional<uint32_t> sparse_table() const override { return std::nullopt; }
  size_t dense_param_count() const override { return model_->arena().size(); }
  std::vector<float> InitialDenseParams() const override { return initial_; }
  int64_t num_train_batches() const override { return (train_.count + batch_ - 1) / batch_; }
  size_t batch_samples(int64_t index) const override {
    return static_cast<size_t>(std::min<int64_t>(batch_, train_.count - index * batch_));
  }
  int64_t malformed_lines() const override { return 0; }

  Status TrainStep(int64_t index, Communicator& comm) override {
    FLEET_RETURN_IF_ERROR(comm.Pull({.dense_values = ParamSpan()}));
    model_->arena().ZeroGrad();
    const int64_t first = index * batch_;
    const size_t n = batch_samples(index);
    FLEET_ASSIGN_OR_RETURN(float loss, Forward(train_, first, n));
    model_->Backward();
    std::span<float> grads(model_->arena().grads().data(), model_->arena().size());
    const float scale = static_cast<float>(comm.GradientScale(n));
    if (scale != 1.0f) {
      for (float& g : grads) g *= scale;
    }
    FLEET_RETURN_IF_ERROR(comm.Push({.dense_grads = grads}));
    Accumulate(train_, first, n, loss, &train_sums_);
    return Status::OK();
  }

  double train_loss_sum() const override { return train_sums_[0]; }

  std::vector<float> TakeTrainSums() override {
    std::vector<float> s(train_sums_.begin(), train_sums_.end());
    train_sums_ = {0, 0, 0};
    return s;
  }

  Result<std::vector<float>> EvaluateSums(ps::PsClient& client) override {
    if (config_.data.test_images.empty()) return std::vector<float>{};
    FLEET_RETURN_IF_ERROR(
        client.PullDense(config_.model.dense_table, ParamSpan()).WithContext("evaluation"));
    std::array<double, 3> sums{0, 0, 0};
    for (int64_t first = 0; first < test_.count; first += batch_) {
      const size_t n = static_cast<size_t>(std::min<int64_t>(batch_, test_.count - first));
      FLEET_ASSIGN_OR_RETURN(float loss, Forward(test_, first, n));
      Accumulate(test_, first, n, loss, &sums);
    }
    return std::vector<float>(sums.begin(), sums.end());
  }

  MetricSummary Summarize(std::span<const float> sums) const override {
    MetricSummary m;
    if (sums.size() != 3) return m;
    m.samples = sums[1];
    m.loss = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
    m.metric = sums[1] > 0 ? sums[2] / sums[1] : 0.0;
    return m;
  }

 private:
  std::span<float> ParamSpan() {
    return {model_->arena().params().data(), model_->arena().size()};
  }

  Result<float> Forward(const Shard& s, int64_t first, size_t n) {
    return model_->Forward(
        std::span<const float>(s.pixels.data() + first * s.width, n * s.width),
        std::span<const int32_t>(s.labels.data() + first, n));
  }

  // sums: {loss sum, samples, correct}.
  void Accumulate(const Shard& s, int64_t first, size_t n, float loss,
                  std::array<double, 3>* sums) const {
    std::vector<float> probs = model_->Probabilities();
    (*sums)[0] += static_cast<double>(loss) * n;
    (*sums)[1] += static_cast<double>(n);
    (*sums)[2] += static_cast<double>(data::CountCorrectArgmax(
        probs, model_->num_classes(), std::span<const int32_t>(s.labels.data() + first, n)));
  }

  // Fixed after construction.
  const WorkerConfig config_;
  std::unique_ptr<CpuBackend> backend_;  // declared before model_, which uses it
  std::unique_ptr<Mlp> model_;
  const std::vector<float> initial_;
  const int64_t batch_;
  const Shard train_, test_;

  std::array<double, 3> train_sums_{0, 0, 0};
};

Status CheckMlpConfig(const WorkerConfig& config) {
  if (config.data.train_images.empty() || config.data.train_labels.empty()) {
    return Status::InvalidArgument("required for model.kind mlp",
                                   "data.train_images / data.train_labels");
  }
  if (config.data.test_images.empty() != config.data.test_labels.empty()) {
    return Status::InvalidArgument("give both or neither", "data.test_images / data.test_labels");
  }
  return Status::OK();
}

Result<std::unique_ptr<WorkerTask>> CreateMlpTask(const WorkerConfig& config,
                                                  const ps::JobConfig& /*job*/,
                                                  const WorkerTaskOptions& options) {
  MlpConfig mc;
  mc.sizes = config.model.sizes;
  mc.seed = config.model.seed;
  auto backend = std::make_unique<CpuBackend>();
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<Mlp> model, Mlp::Create(mc, backend.get()));
  const int classes = mc.sizes.back();
  FLEET_ASSIGN_OR_RETURN(Shard train, LoadShard(config.data.train_images, config.data.train_labels,
                                                 classes, mc.sizes.front(), options));
  Shard test;
  if (!config.data.test_images.empty()) {
    FLEET_ASSIGN_OR_RETURN(test, LoadShard(config.data.test_images, config.data.test_labels,
                                           classes, mc.sizes.front(), options));
  }
  return std::unique_ptr<WorkerTask>(std::make_unique<MlpTask>(
      config, std::move(backend), std::move(model), std::move(train), std::move(test)));
}

}  // namespace

// Listed in worker/tasks/registry.cc.
extern const WorkerTaskType kMlpTaskType = {.kind = "mlp",
                                            .default_dense_table = 0,
                                            .check_config = CheckMlpConfig,
                                            .create = CreateMlpTask};

}  // namespace fleet::worker
