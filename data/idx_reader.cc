#include "data/idx_reader.h"

#include <cstdio>
#include <cstring>
#include <memory>

#include "comm/file_io.h"

namespace fleet::data {
namespace {

constexpr uint8_t kTypeUnsignedByte = 0x08;
// No real IDX file comes near this; a larger declared size means a damaged
// header, and refusing it avoids a huge allocation.
constexpr uint64_t kMaxElements = uint64_t{1} << 36;

struct IdxArray {
  std::vector<uint32_t> dims;
  std::string bytes;  // whole file; elements start at data_offset
  size_t data_offset = 0;
};

uint32_t BigEndian32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return (uint32_t{u[0]} << 24) | (uint32_t{u[1]} << 16) | (uint32_t{u[2]} << 8) | uint32_t{u[3]};
}

std::string DimsText(const std::vector<uint32_t>& dims) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) s += 'x';
    s += std::to_string(dims[i]);
  }
  return s;
}

// Reads the whole file and validates magic, dimensions and byte count.
Result<IdxArray> ReadIdxArray(const std::string& path, int want_dims) {
  FLEET_ASSIGN_OR_RETURN(std::unique_ptr<InputFile> file, InputFile::Open(path));
  IdxArray a;
  FLEET_ASSIGN_OR_RETURN(a.bytes, file->ReadAll());
  const std::string& b = a.bytes;
  if (b.size() < 4) {
    return Status::Corruption(
        "truncated IDX file: expected a 4-byte magic, found " + std::to_string(b.size()) + " bytes",
        path);
  }
  if (b[0] != 0 || b[1] != 0 || static_cast<uint8_t>(b[2]) != kTypeUnsignedByte ||
      b[3] != want_dims) {
    char magic[32];
    std::snprintf(magic, sizeof(magic), "%02x %02x %02x %02x", static_cast<uint8_t>(b[0]),
                  static_cast<uint8_t>(b[1]), static_cast<uint8_t>(b[2]),
                  static_cast<uint8_t>(b[3]));
    return Status::Corruption(std::string("bad IDX magic ") + magic + ", expected 00 00 08 0" +
                                  std::to_string(want_dims) + " (unsigned bytes, " +
                                  std::to_string(want_dims) + " dimensions)",
                              path);
  }
  a.data_offset = 4 + 4 * static_cast<size_t>(want_dims);
  if (b.size() < a.data_offset) {
    return Status::Corruption("truncated IDX header: expected " + std::to_string(a.data_offset) +
                                  " bytes, found " + std::to_string(b.size()),
                              path);
  }
  uint64_t elements = 1;
  for (int d = 0; d < want_dims; ++d) {
    a.dims.push_back(BigEndian32(b.data() + 4 + 4 * d));
    elements *= a.dims.back();
    if (elements > kMaxElements) {
      return Status::Corruption("IDX header declares an implausible size " + DimsText(a.dims),
                                path);
    }
  }
  const uint64_t expected = a.data_offset + elements;
  if (b.size() < expected) {
    return Status::Corruption("truncated IDX file: header declares " + DimsText(a.dims) +
                                  " so expected " + std::to_string(expected) + " bytes, found " +
                                  std::to_string(b.size()),
                              path);
  }
  if (b.size() > expected) {
    return Status::Corruption("IDX file longer than declared: header declares " + DimsText(a.dims) +
                                  " so expected " + std::to_string(expected) + " bytes, found " +
                                  std::to_string(b.size()),
                              path);
  }
  return a;
}

}  // namespace

Result<IdxImages> ReadIdxImages(const std::string& path) {
  FLEET_ASSIGN_OR_RETURN(IdxArray a, ReadIdxArray(path, 3));
  if (a.dims[1] == 0 || a.dims[2] == 0) {
    return Status::Corruption("IDX images with zero rows or columns (" + DimsText(a.dims) + ")",
                              path);
  }
  IdxImages img;
  img.count = a.dims[0];
  img.rows = static_cast<int>(a.dims[1]);
  img.cols = static_cast<int>(a.dims[2]);
  const size_t n = a.bytes.size() - a.data_offset;
  img.pixels.resize(n);
  const auto* src = reinterpret_cast<const unsigned char*>(a.bytes.data() + a.data_offset);
  constexpr float kScale = 1.0f / 255.0f;
  for (size_t i = 0; i < n; ++i) img.pixels[i] = static_cast<float>(src[i]) * kScale;
  return img;
}

Result<std::vector<uint8_t>> ReadIdxLabels(const std::string& path) {
  FLEET_ASSIGN_OR_RETURN(IdxArray a, ReadIdxArray(path, 1));
  const auto* src = reinterpret_cast<const uint8_t*>(a.bytes.data() + a.data_offset);
  return std::vector<uint8_t>(src, src + a.dims[0]);
}

Result<IdxDataset> ReadIdxDataset(const std::string& images_path, const std::string& labels_path,
                                  int num_classes) {
  if (num_classes < 1) {
    return Status::InvalidArgument("num_classes must be >= 1, got " + std::to_string(num_classes));
  }
  IdxDataset ds;
  FLEET_ASSIGN_OR_RETURN(ds.images, ReadIdxImages(images_path));
  FLEET_ASSIGN_OR_RETURN(std::vector<uint8_t> labels, ReadIdxLabels(labels_path));
  if (static_cast<int64_t>(labels.size()) != ds.images.count) {
    return Status::Corruption("label file holds " + std::to_string(labels.size()) +
                                  " labels but image file " + images_path + " holds " +
                                  std::to_string(ds.images.count) + " images",
                              labels_path);
  }
  ds.labels.reserve(labels.size());
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= num_classes) {
      return Status::Corruption("label " + std::to_string(labels[i]) + " at index " +
                                    std::to_string(i) + " is not below num_classes " +
                                    std::to_string(num_classes),
                                labels_path);
    }
    ds.labels.push_back(labels[i]);
  }
  return ds;
}

}  // namespace fleet::data
