// The MNIST distribution's four IDX files (train/test images and labels) as
// one data set: where Debian installs Fashion-MNIST, the standard file
// names, and reading all four (idx_reader.h does the format).
//
// Functions only; they are thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <string>

#include "comm/status.h"
#include "data/idx_reader.h"

namespace fleet::data {

// Where the Debian package fashion-mnist puts the data.
inline constexpr char kDefaultMnistDir[] = "/usr/share/datasets/fashion-mnist";

struct MnistFiles {
  std::string train_images;
  std::string train_labels;
  std::string test_images;
  std::string test_labels;
};

// The four standard file names (train-images-idx3-ubyte.gz, ...) in `dir`.
MnistFiles MnistFilesIn(const std::string& dir);

struct MnistData {
  IdxDataset train;
  IdxDataset test;
};

// Reads the four files (plain or gzip), labels in [0, 10).
// `max_train_samples` > 0 keeps only the first that many training samples
// (for short runs). Errors are those of ReadIdxDataset (NotFound, IOError,
// Corruption naming the file, or a label >= 10).
Result<MnistData> LoadMnistData(const MnistFiles& files, int64_t max_train_samples = 0);

}  // namespace fleet::data
