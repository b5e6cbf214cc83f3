#include "examples/mnist_mlp/mnist_mlp.h"

#include <memory>

#include "absl/strings/str_cat.h"

#include "collective/mlp_classifier.h"

namespace fleet::examples {

Result<trainer::MlpConfig> MlpForData(const data::MnistData& data, const std::vector<int>& hidden) {
  constexpr int kClasses = 10;  // LoadMnistData's label range
  const int64_t pixels = data.train.images.pixels_per_image();
  if (pixels != data.test.images.pixels_per_image()) {
    return Status::InvalidArgument(
        "training and test images differ in size",
        absl::StrCat(data.train.images.rows, "x", data.train.images.cols, " vs ",
                     data.test.images.rows, "x", data.test.images.cols));
  }
  trainer::MlpConfig config;
  config.sizes = {static_cast<int>(pixels)};
  for (int width : hidden) {
    if (width < 1) return Status::InvalidArgument("hidden layer widths must be >= 1", absl::StrCat(width));
    config.sizes.push_back(width);
  }
  config.sizes.push_back(kClasses);
  return config;
}

Result<MnistReport> TrainMnist(const MnistOptions& options, const data::MnistData& data,
                               Collective* collective, trainer::Backend* backend,
                               std::ostream* progress) {
  if (backend == nullptr) return Status::InvalidArgument("TrainMnist: no backend");
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<trainer::collective::MlpClassifierTask> task,
                         trainer::collective::MlpClassifierTask::Create(options.model, data.train,
                                                                        data.test, backend));
  return trainer::collective::RunTrainLoop(options, *task, collective, progress);
}

}  // namespace fleet::examples
