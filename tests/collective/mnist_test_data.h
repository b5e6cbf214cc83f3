// Synthetic MNIST-format data for the mnist_mlp tests: 28x28 (or any side) byte images
// whose label is the argmax of a hidden random linear map, so a small MLP
// learns it, plus a writer of the four IDX files for the process tests.
#pragma once

#include <cstdint>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/mnist.h"

namespace fleet::testing {

inline data::IdxDataset SyntheticIdx(int64_t count, const std::vector<float>& hidden,
                                     std::mt19937_64& rng, int side = 28) {
  const int kPixels = side * side, kClasses = 10;
  data::IdxDataset d;
  d.images.count = count;
  d.images.rows = side;
  d.images.cols = side;
  d.images.pixels.resize(count * kPixels);
  d.labels.resize(count);
  for (int64_t i = 0; i < count; ++i) {
    float* x = d.images.pixels.data() + i * kPixels;
    for (int p = 0; p < kPixels; ++p) {
      // About a third of the pixels lit, as in MNIST; bytes / 255 like the reader.
      const uint64_t r = rng();
      x[p] = (r % 3 == 0) ? static_cast<float>((r >> 8) % 256) / 255.0f : 0.0f;
    }
    int best = 0;
    float best_score = -1e30f;
    for (int c = 0; c < kClasses; ++c) {
      float s = 0;
      for (int p = 0; p < kPixels; ++p) s += hidden[c * kPixels + p] * x[p];
      if (s > best_score) best_score = s, best = c;
    }
    d.labels[i] = best;
  }
  return d;
}

// Same seed, same data. `side` x `side` images (28: MNIST's; 8: sklearn's digits').
inline data::MnistData SyntheticMnist(int64_t train, int64_t test, uint64_t seed = 7,
                                      int side = 28) {
  std::mt19937_64 rng(seed);
  std::vector<float> hidden(10 * side * side);
  for (float& w : hidden) w = static_cast<float>(static_cast<int64_t>(rng() % 2001) - 1000) / 1000.0f;
  data::MnistData data;
  data.train = SyntheticIdx(train, hidden, rng, side);
  data.test = SyntheticIdx(test, hidden, rng, side);
  return data;
}

inline void WriteBigEndian(std::ofstream& out, uint32_t v) {
  const char b[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
  out.write(b, 4);
}

// Writes plain (uncompressed) IDX files into `dir`; returns their paths.
inline data::MnistFiles WriteIdxFiles(const data::MnistData& data, const std::string& dir) {
  data::MnistFiles files{dir + "/train-images", dir + "/train-labels", dir + "/test-images",
                         dir + "/test-labels"};
  auto write = [](const data::IdxDataset& d, const std::string& images, const std::string& labels) {
    std::ofstream img(images, std::ios::binary);
    img.write("\0\0\x08\x03", 4);
    WriteBigEndian(img, static_cast<uint32_t>(d.images.count));
    WriteBigEndian(img, static_cast<uint32_t>(d.images.rows));
    WriteBigEndian(img, static_cast<uint32_t>(d.images.cols));
    for (float p : d.images.pixels) img.put(static_cast<char>(static_cast<int>(p * 255.0f + 0.5f)));
    std::ofstream lab(labels, std::ios::binary);
    lab.write("\0\0\x08\x01", 4);
    WriteBigEndian(lab, static_cast<uint32_t>(d.labels.size()));
    for (int32_t l : d.labels) lab.put(static_cast<char>(l));
    if (!img || !lab) throw std::runtime_error("cannot write IDX files in " + images);
  };
  write(data.train, files.train_images, files.train_labels);
  write(data.test, files.test_images, files.test_labels);
  return files;
}

}  // namespace fleet::testing
