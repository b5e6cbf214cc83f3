#include "data/mnist.h"

#include <filesystem>

namespace fleet::data {

MnistFiles MnistFilesIn(const std::string& dir) {
  const std::filesystem::path d(dir);
  return MnistFiles{(d / "train-images-idx3-ubyte.gz").string(),
                    (d / "train-labels-idx1-ubyte.gz").string(),
                    (d / "t10k-images-idx3-ubyte.gz").string(),
                    (d / "t10k-labels-idx1-ubyte.gz").string()};
}

Result<MnistData> LoadMnistData(const MnistFiles& files, int64_t max_train_samples) {
  constexpr int kClasses = 10;
  MnistData data;
  FLEET_ASSIGN_OR_RETURN(data.train,
                         ReadIdxDataset(files.train_images, files.train_labels, kClasses));
  FLEET_ASSIGN_OR_RETURN(data.test, ReadIdxDataset(files.test_images, files.test_labels, kClasses));
  if (max_train_samples > 0 && max_train_samples < data.train.images.count) {
    data.train.images.count = max_train_samples;
    data.train.images.pixels.resize(max_train_samples * data.train.images.pixels_per_image());
    data.train.labels.resize(max_train_samples);
  }
  return data;
}

}  // namespace fleet::data
