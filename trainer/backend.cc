#include "trainer/backend.h"

#include <charconv>
#include <string>

namespace fleet::trainer {

Result<Device> ParseDevice(std::string_view text) {
  if (text == "cpu") return Device{};
  constexpr std::string_view kCuda = "cuda:";
  if (text.starts_with(kCuda)) {
    const std::string_view num = text.substr(kCuda.size());
    int index = -1;
    auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), index);
    if (ec == std::errc() && end == num.data() + num.size() && !num.empty() && index >= 0) {
      return Device{Device::Kind::kCuda, index};
    }
  }
  return Status::InvalidArgument("device must be \"cpu\" or \"cuda:K\"", text);
}

void Backend::BiasActForward(float* y, const float* bias, int rows, int cols,
                             kernels::Activation act) {
  CHECK(act != kernels::Activation::kRelu) << "this backend has no fused ReLU";
  BiasAddForward(y, bias, rows, cols);
  if (act == kernels::Activation::kTanh) TanhForward(y, y, size_t(rows) * cols);
}

void Backend::BiasActBackward(float* dz, float* dbias, const float* y, const float* dy, int rows,
                              int cols, kernels::Activation act) {
  CHECK(act != kernels::Activation::kRelu) << "this backend has no fused ReLU";
  const size_t n = size_t(rows) * cols;
  if (act == kernels::Activation::kTanh) {
    Fill(dz, n, 0.0f);
    TanhBackward(dz, y, dy, n);
  } else {
    CopyOnDevice(dz, dy, n * sizeof(float));
  }
  BiasBackward(dbias, dz, rows, cols);
}

}  // namespace fleet::trainer
