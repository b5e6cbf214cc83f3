// The dropout kernels of CudaGptKernels (gpt_cuda_ops.h): each thread draws
// one Philox group (philox.h) and applies it to 4 consecutive elements of a
// sequence, the mask every other twin draws. Written for both nvcc and the
// CPU emulation (cuda_emulatable.h; trainer_gpt_dropout_emulated_test).
#include "trainer/kernels/cuda_emulatable.h"
#include "trainer/kernels/gpt_cuda_device.cuh"
#include "trainer/kernels/gpt_cuda_ops.h"
#include "trainer/kernels/philox.h"

namespace fleet::trainer::cuda::gpt {
namespace {

using namespace dev;  // NOLINT: the kernels' shared device helpers

// out = (residual or 0) + mask * inp over [B, n]; residual may be null.
// `groups` = ceil(n / 4) per sequence.
__global__ void DropoutKernel(float* out, const float* inp, const float* residual, int B, size_t n,
                              size_t groups, DropoutArgs d) {
  const uint32_t threshold = philox::DropoutThreshold(d.p);
  const float scale = 1.0f / (1.0f - d.p);
  for (size_t g = GlobalThread(); g < size_t(B) * groups; g += GridThreads()) {
    const size_t b = g / groups, group = g % groups;
    const philox::Bits4 bits = philox::DropoutGroupBits(d.seed, d.site, d.streams[b], 0u, group);
    for (int k = 0; k < 4; ++k) {
      const size_t i = group * 4 + k;
      if (i >= n) break;
      const size_t at = b * n + i;
      const float kept = bits.v[k] >= threshold ? inp[at] * scale : 0.0f;
      out[at] = residual != nullptr ? residual[at] + kept : kept;
    }
  }
}

}  // namespace

cudaError_t DropoutForward(float* out, const float* inp, const float* residual, int B, size_t n,
                           const DropoutArgs& dropout, cudaStream_t s) {
  if (B <= 0 || n == 0) return cudaSuccess;
  const size_t groups = (n + 3) / 4;
  return FLEET_LAUNCH(DropoutKernel, dim3(GridFor(size_t(B) * groups)), dim3(kThreads), 0, s, out,
                      inp, residual, B, n, groups, dropout);
}

cudaError_t DropoutBackward(float* dinp, const float* dout, int B, size_t n,
                            const DropoutArgs& dropout, cudaStream_t s) {
  return DropoutForward(dinp, dout, nullptr, B, n, dropout, s);
}

}  // namespace fleet::trainer::cuda::gpt
