#include "collective/mlp_classifier.h"

#include <sys/mman.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "data/metrics.h"
#include "trainer/kernels/cpu_kernels.h"

namespace fleet::trainer::collective {
namespace {

// Test-set samples per forward pass during evaluation.
constexpr int64_t kEvalBatch = 1000;

// The reader's pixel value of an IDX byte is byte * kPixelScale
// (data/idx_reader.cc).
constexpr float kPixelScale = 1.0f / 255.0f;
inline float ByteToPixel(uint8_t b) { return static_cast<float>(b) * kPixelScale; }

}  // namespace

Result<std::unique_ptr<MlpClassifierTask>> MlpClassifierTask::Create(const MlpConfig& config,
                                                                     const data::IdxDataset& train,
                                                                     const data::IdxDataset& test,
                                                                     Backend* backend) {
  if (config.sizes.size() < 2) return Status::InvalidArgument("sizes needs an input and an output");
  if (config.sizes.front() != train.images.pixels_per_image() ||
      config.sizes.front() != test.images.pixels_per_image()) {
    return Status::InvalidArgument(
        "input size differs from the images' pixel count",
        absl::StrCat(config.sizes.front(), " vs ", train.images.pixels_per_image(), " (train), ",
                     test.images.pixels_per_image(), " (test)"));
  }
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<Mlp> model, Mlp::Create(config, backend));
  std::unique_ptr<MlpClassifierTask> task(new MlpClassifierTask(std::move(model), train, test));
  task->train_bytes_ = PixelBytes(train.images.pixels);
  return task;
}

std::unique_ptr<uint8_t, MlpClassifierTask::FreeBytes> MlpClassifierTask::PixelBytes(
    const std::vector<float>& pixels) {
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t bytes = (pixels.size() + kHugePage - 1) / kHugePage * kHugePage;
  std::unique_ptr<uint8_t, FreeBytes> out(
      static_cast<uint8_t*>(std::aligned_alloc(kHugePage, std::max(bytes, kHugePage))));
  if (out == nullptr) return nullptr;
  // Before the first touch, so the kernel backs it with huge pages where it
  // can (transparent huge pages in "madvise" mode); only a hint.
  madvise(out.get(), bytes, MADV_HUGEPAGE);
  for (size_t i = 0; i < pixels.size(); ++i) {
    const float v = pixels[i] * 255.0f + 0.5f;
    if (!(v >= 0.0f && v < 256.0f)) return nullptr;
    const uint8_t b = static_cast<uint8_t>(v);
    if (ByteToPixel(b) != pixels[i]) return nullptr;  // not a byte / 255: keep the floats
    out.get()[i] = b;
  }
  return out;
}

Status MlpClassifierTask::LoadBatch(std::span<const int64_t> ids) {
  const int64_t pixels = train_.images.pixels_per_image();
  batch_x_.resize(ids.size() * pixels);
  batch_labels_.resize(ids.size());
  if (train_bytes_ == nullptr) {
    for (size_t i = 0; i < ids.size(); ++i) {
      const int64_t sample = ids[i];
      std::copy_n(train_.images.pixels.begin() + sample * pixels, pixels,
                  batch_x_.begin() + i * pixels);
      batch_labels_[i] = train_.labels[sample];
    }
    return Status::OK();
  }
  // Every row's cache lines requested first, so their misses overlap (unless
  // the loop's PrefetchBatch hint already did it); then each row converted.
  if (ids.data() != hinted_ids_.data() || ids.size() != hinted_ids_.size()) PrefetchBatch(ids);
  hinted_ids_ = {};
  const uint8_t* bytes = train_bytes_.get();
  for (size_t i = 0; i < ids.size(); ++i) {
    kernels::ScaleBytes(batch_x_.data() + i * pixels, bytes + ids[i] * pixels, pixels,
                        kPixelScale);
    batch_labels_[i] = train_.labels[ids[i]];
  }
  return Status::OK();
}

void MlpClassifierTask::PrefetchBatch(std::span<const int64_t> ids) {
  if (train_bytes_ == nullptr) return;
  hinted_ids_ = ids;
  const int64_t pixels = train_.images.pixels_per_image();
  const uint8_t* bytes = train_bytes_.get();
  // Into L2 (locality 2: prefetcht1), not L1: the batch's ~53 KB of rows
  // does not fit in L1 beside the step's data, and on this AMD host lines
  // prefetched into L1 were mostly gone again by LoadBatch (LoadBatch after
  // a prefetch and 100 us: 19 us with prefetcht0, 5.6 us with prefetcht1,
  // 4.7 us when warm).
  constexpr int kRead = 0, kL2 = 2;
  constexpr uintptr_t kLine = 64;
  for (const int64_t sample : ids) {
    // The label too: a shuffled read of the 240 KB label array misses as
    // often as the row does.
    __builtin_prefetch(train_.labels.data() + sample, kRead, kL2);
    const uintptr_t row = reinterpret_cast<uintptr_t>(bytes + sample * pixels);
    for (uintptr_t line = row & ~(kLine - 1); line < row + pixels; line += kLine) {
      __builtin_prefetch(reinterpret_cast<const void*>(line), kRead, kL2);
    }
  }
}

Result<float> MlpClassifierTask::ForwardBackward(const GradReadyFn& grad_ready,
                                                 float grad_scale) {
  FLEET_ASSIGN_OR_RETURN(float loss, model_->Forward(batch_x_, batch_labels_));
  model_->Backward(grad_ready, grad_scale);
  return loss;
}

Result<std::vector<float>> MlpClassifierTask::EvalSums(int rank, int world_size) {
  const int64_t n = test_.images.count;
  const int64_t begin = n * rank / world_size;
  const int64_t end = n * (rank + 1) / world_size;
  const int64_t pixels = test_.images.pixels_per_image();
  std::vector<float> sums = {0.0f, 0.0f};  // correct, count
  for (int64_t b = begin; b < end; b += kEvalBatch) {
    const int64_t e = std::min(end, b + kEvalBatch);
    std::span<const float> x(test_.images.pixels.data() + b * pixels, (e - b) * pixels);
    std::span<const int32_t> labels(test_.labels.data() + b, e - b);
    FLEET_ASSIGN_OR_RETURN(float loss, model_->Forward(x, labels));
    (void)loss;
    const std::vector<float> probs = model_->Probabilities();
    sums[0] += static_cast<float>(data::CountCorrectArgmax(probs, model_->num_classes(), labels));
    sums[1] += static_cast<float>(e - b);
  }
  return sums;
}

double MlpClassifierTask::EvalMetric(std::span<const float> sums) const {
  return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
}

}  // namespace fleet::trainer::collective
