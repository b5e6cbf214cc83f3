// Types the Backend interface (backend.h) and every kernel family share,
// kept below both so that includes run one way: trainer/ root -> kernels/
// -> layers/ and models/.
#pragma once

#include <string_view>

#include "comm/status.h"

namespace fleet::trainer {

// The number format GEMMs and attention compute in (weights and optimizer
// state stay float32). GptKernels twins are built for one.
enum class Precision { kFp32, kBf16, kFp16 };
// "fp32"/"float32", "bf16"/"bfloat16", "fp16"/"float16". InvalidArgument
// otherwise (naming the text).
Result<Precision> ParsePrecision(std::string_view text);
std::string_view PrecisionName(Precision precision);

}  // namespace fleet::trainer

namespace fleet::trainer::kernels {

// The activation fused with a bias (BiasActForward / BiasActBackward).
enum class Activation { kNone, kTanh, kRelu };

struct AdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // L2 added to the gradient (PyTorch Adam's weight_decay)
};

}  // namespace fleet::trainer::kernels
