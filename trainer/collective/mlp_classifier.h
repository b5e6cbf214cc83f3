// MlpClassifierTask: the Mlp model (trainer/models/mlp.h) as a
// CollectiveTask on labelled images (IDX data sets: MNIST, Fashion-MNIST or
// any other in that format). Loss: softmax cross-entropy; evaluation: the
// accuracy over the test set, each rank taking a contiguous slice.
//
// Ownership: the task owns the model; `train` and `test` are borrowed and
// must outlive the task (ranks running as threads share one read-only
// data set). Thread safety: one thread drives a task.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/status.h"
#include "trainer/backend.h"
#include "trainer/collective/task.h"
#include "trainer/data/idx_reader.h"
#include "trainer/models/mlp.h"

namespace fleet::trainer::collective {

class MlpClassifierTask final : public CollectiveTask {
 public:
  // Builds the model of `config` on `backend` (not owned; must outlive the
  // task). InvalidArgument when config.sizes has fewer than two widths, when
  // sizes[0] differs from the images' pixel count, or from Mlp::Create.
  static Result<std::unique_ptr<MlpClassifierTask>> Create(const MlpConfig& config,
                                                           const data::IdxDataset& train,
                                                           const data::IdxDataset& test,
                                                           Backend* backend);

  std::string name() const override { return "mlp"; }
  ParamArena& arena() override { return model_->arena(); }
  int64_t num_train_samples() const override { return train_.images.count; }
  Status LoadBatch(std::span<const int64_t> ids) override;
  Result<float> ForwardBackward(const GradReadyFn& grad_ready) override;
  // Sums: {correct predictions, samples}.
  Result<std::vector<float>> EvalSums(int rank, int world_size) override;
  double EvalMetric(std::span<const float> sums) const override;
  std::string eval_metric_name() const override { return "test_accuracy"; }

 private:
  MlpClassifierTask(std::unique_ptr<Mlp> model, const data::IdxDataset& train,
                    const data::IdxDataset& test)
      : model_(std::move(model)), train_(train), test_(test) {}

  // Fixed after construction.
  std::unique_ptr<Mlp> model_;
  const data::IdxDataset& train_;
  const data::IdxDataset& test_;

  // The loaded batch: pixels [B, sizes[0]] and labels [B].
  std::vector<float> batch_x_;
  std::vector<int32_t> batch_labels_;
};

}  // namespace fleet::trainer::collective
