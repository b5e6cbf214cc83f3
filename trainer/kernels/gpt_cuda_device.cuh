// Device helpers of the GPT CUDA kernels that are not tensor-core code
// (gpt_cuda_ops.cu, gpt_cuda_attention_tiles.cu, gpt_cuda_dropout.cu):
// launch shapes of grid-stride loops, warp reductions by xor shuffles (every
// lane gets the same bits), and the attention tiles' element conversions.
// For .cu files only (C++17); they also compile on the CPU emulation
// (cuda_emulation.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

namespace fleet::trainer::cuda::gpt::dev {

inline constexpr int kThreads = 256;
inline constexpr int kWarpsPerBlock = kThreads / 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

// Grid of a grid-stride loop over n elements.
inline unsigned GridFor(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min<size_t>(std::max<size_t>(blocks, 1), 65535));
}

__device__ __forceinline__ size_t GlobalThread() {
  return size_t(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ size_t GridThreads() { return size_t(gridDim.x) * blockDim.x; }

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ double WarpSum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Tile element conversions.
__device__ __forceinline__ void StoreTile(float& dst, float x) { dst = x; }
__device__ __forceinline__ void StoreTile(__nv_bfloat16& dst, float x) {
  dst = __float2bfloat16(x);
}
__device__ __forceinline__ void StoreTile(__half& dst, float x) { dst = __float2half(x); }
__device__ __forceinline__ float LoadTile(float x) { return x; }
__device__ __forceinline__ float LoadTile(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float LoadTile(__half x) { return __half2float(x); }

}  // namespace fleet::trainer::cuda::gpt::dev
