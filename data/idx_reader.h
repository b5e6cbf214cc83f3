// Reader for IDX files, the format of MNIST and Fashion-MNIST, plain or
// gzip-compressed (detected by the magic bytes 1f 8b).
//
// IDX layout, all integers big-endian:
//   byte 0-1   zero
//   byte 2     element type; only 0x08 (unsigned byte) is accepted
//   byte 3     number of dimensions: 3 for images (count, rows, cols),
//              1 for labels (count)
//   then one uint32 per dimension, then the elements in row-major order.
// The file must hold exactly the declared number of bytes: fewer gives
// Corruption "truncated" with the expected and found byte counts, more gives
// Corruption too (a different file was probably appended or concatenated).
//
// Functions only; they are thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/status.h"

namespace fleet::data {

struct IdxImages {
  int64_t count = 0;
  int rows = 0;
  int cols = 0;
  std::vector<float> pixels;  // [count, rows * cols], byte / 255 so in [0, 1]

  int pixels_per_image() const { return rows * cols; }
};

struct IdxDataset {
  IdxImages images;
  std::vector<int32_t> labels;  // [images.count], each in [0, num_classes)
};

// Errors: NotFound / IOError from opening or reading the file; Corruption
// (naming the file) for a bad magic, a wrong number of dimensions, a zero row
// or column size, a damaged gzip stream, or a byte count that differs from
// the header's.
Result<IdxImages> ReadIdxImages(const std::string& path);
Result<std::vector<uint8_t>> ReadIdxLabels(const std::string& path);

// Reads an image file and its label file and checks that they hold the same
// number of items (Corruption otherwise) and that every label is below
// num_classes (Corruption naming the first bad index). InvalidArgument when
// num_classes < 1.
Result<IdxDataset> ReadIdxDataset(const std::string& images_path, const std::string& labels_path,
                                  int num_classes);

}  // namespace fleet::data
