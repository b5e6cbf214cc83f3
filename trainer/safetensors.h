// Safetensors files (Hugging Face's weight format), read and written as
// float32 on the host: what the GPT-2 converter (trainer/models/gpt_hf.h)
// moves weights in and out with.
//
// File format (https://huggingface.co/docs/safetensors):
//   u64 N (little-endian)      length of the header
//   N bytes                    JSON object: per tensor name
//                                {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}
//                              and an optional "__metadata__" object of strings
//   data                       the tensors' bytes, little-endian, row-major;
//                              offsets are relative to the first data byte
//
// Reading checks everything against the file before a byte of data is used:
// the header's length, that it is a JSON object of well-formed entries, each
// dtype known, each shape's element count times the dtype's size equal to
// its data range, every range inside the file and no two overlapping. A
// damaged or hostile file gives Corruption naming the file and the tensor,
// never a crash or an allocation of what the file claims.
//
// Thread safety: a reader is immutable after Open (ReadFloats opens its own
// stream per call); the free functions hold no state.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/status.h"

namespace fleet::trainer {

// The dtypes a safetensors file may hold. Only F32, F16 and BF16 convert to
// float; the others are recognised (so a file holding them is checked and
// its float tensors still read) and refused by ReadFloats.
enum class SafetensorsDtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

// "F32", "BF16", ...
std::string_view SafetensorsDtypeName(SafetensorsDtype dtype);
size_t SafetensorsDtypeBytes(SafetensorsDtype dtype);
// InvalidArgument for anything but F32 / F16 / BF16 in either spelling
// ("F16", "float16", "fp16", "BF16", "bfloat16", "bf16", "F32", "float32", "fp32").
Result<SafetensorsDtype> ParseFloatDtype(std::string_view name);

struct SafetensorsTensor {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  uint64_t file_offset = 0;  // first byte in the file (header included)
  uint64_t bytes = 0;
  int64_t num_elements() const;
};

class SafetensorsReader {
 public:
  // Reads and checks the header of `path` (see the top). NotFound / IOError
  // for a missing or unreadable file; Corruption naming the file (and the
  // tensor) for anything malformed.
  static Result<std::unique_ptr<SafetensorsReader>> Open(const std::string& path);

  const std::string& path() const { return path_; }
  // In data order.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // Null when absent.
  const SafetensorsTensor* Find(std::string_view name) const;

  // Reads tensor `t` (one of tensors()) converted to float32 into out
  // (t.num_elements() floats). InvalidArgument for a dtype other than F32,
  // F16 and BF16; IOError when the read fails (the file changed since Open).
  Status ReadFloats(const SafetensorsTensor& t, std::span<float> out) const;
  // Its bytes as stored. IOError as above.
  Result<std::string> ReadBytes(const SafetensorsTensor& t) const;

 private:
  SafetensorsReader() = default;
  std::string path_;
  std::vector<SafetensorsTensor> tensors_;
};

// One tensor to write: float32 values on the host, stored as the file's dtype.
struct SafetensorsEntry {
  std::string name;
  std::vector<int64_t> shape;
  std::span<const float> values;  // product of shape floats
};

// Writes `entries` in order into `path` atomically (temporary file, sync,
// rename), each converted to `dtype` (F32, F16 or BF16; round to nearest
// even, NaN kept NaN), with `metadata` as the header's __metadata__ (string
// values). The header is padded with spaces to a multiple of 8 bytes, as
// the reference writer does. IOError naming the file on failure (the old
// file, if any, is left). REQUIRES: each entry's values match its shape,
// names are distinct and not "__metadata__", dtype is a float dtype.
Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                        SafetensorsDtype dtype,
                        const std::vector<std::pair<std::string, std::string>>& metadata = {});

// float <-> the 16-bit formats (round to nearest even; NaN stays NaN).
uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t h);
uint16_t FloatToFp16(float f);
float Fp16ToFloat(uint16_t h);

}  // namespace fleet::trainer
