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
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/status.h"
#include "trainer/backend.h"
#include "collective/task.h"
#include "data/idx_reader.h"
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
  void PrefetchBatch(std::span<const int64_t> ids) override;
  Result<float> ForwardBackward(const GradReadyFn& grad_ready, float grad_scale) override;
  // Sums: {correct predictions, samples}.
  Result<std::vector<float>> EvalSums(int rank, int world_size) override;
  double EvalMetric(std::span<const float> sums) const override;
  std::string eval_metric_name() const override { return "test_accuracy"; }
  // Whether LoadBatch reads the training pixels as bytes (see train_bytes_).
  bool uses_byte_pixels() const { return train_bytes_ != nullptr; }

 private:
  MlpClassifierTask(std::unique_ptr<Mlp> model, const data::IdxDataset& train,
                    const data::IdxDataset& test)
      : model_(std::move(model)), train_(train), test_(test) {}

  // Frees train_bytes_ (aligned_alloc'd).
  struct FreeBytes {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  // `pixels` as bytes (see train_bytes_), or null.
  static std::unique_ptr<uint8_t, FreeBytes> PixelBytes(const std::vector<float>& pixels);

  // Fixed after construction.
  std::unique_ptr<Mlp> model_;
  const data::IdxDataset& train_;
  const data::IdxDataset& test_;
  // The training pixels as the IDX file's bytes (pixel = byte * (1/255), as
  // the reader computes it), in memory advised to use 2 MiB pages; null when
  // some pixel is not such a value (then LoadBatch copies the floats). A
  // step's shuffled gather of 64 rows waited on a TLB miss and DRAM for
  // every row of the 188 MB float array: a quarter of the bytes, in huge
  // pages, prefetched before converting, makes it a fraction of that (see
  // bench/README.md).
  std::unique_ptr<uint8_t, FreeBytes> train_bytes_;

  // The ids of the last PrefetchBatch hint, until a LoadBatch of the same
  // span consumes it (and so does not prefetch them again).
  std::span<const int64_t> hinted_ids_;
  // The loaded batch: pixels [B, sizes[0]] and labels [B].
  std::vector<float> batch_x_;
  std::vector<int32_t> batch_labels_;
};

}  // namespace fleet::trainer::collective
