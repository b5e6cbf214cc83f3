#include "trainer/kernel_types.h"

namespace fleet::trainer {

Result<Precision> ParsePrecision(std::string_view text) {
  if (text == "fp32" || text == "float32") return Precision::kFp32;
  if (text == "bf16" || text == "bfloat16") return Precision::kBf16;
  if (text == "fp16" || text == "float16") return Precision::kFp16;
  return Status::InvalidArgument("precision must be fp32, bf16 or fp16, got", text);
}

std::string_view PrecisionName(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
  }
  return "?";
}

}  // namespace fleet::trainer
