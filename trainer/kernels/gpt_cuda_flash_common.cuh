// What the two tensor-core attention implementations, gpt_cuda_flash_tc.cu
// (wmma) and gpt_cuda_flash_mma.cu (mma.sync), share: the block shape, the
// one switch from (tile type, head size) to their template arguments, the
// carving of dynamic shared memory and the rounding to the tile type. For
// .cu files only (C++17).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "trainer/kernels/gpt_cuda_attention_tiles.h"  // ForwardParams
#include "trainer/kernels/gpt_cuda_ops.h"              // TileType

namespace fleet::trainer::cuda::gpt {

// The kernels' arguments: those of TensorCoreAttentionForward and
// TensorCoreAttentionBackward (gpt_cuda_flash_tc.h), and scale = 1 / sqrt(hs).
// The forward's are the float tiles' (gpt_cuda_attention_tiles.h).
using ForwardArgs = ForwardParams;

struct BackwardArgs {
  float* dqkv;
  const float* dout;
  const float* qkv;
  const float* lse;
  const float* dots;
  int T, C, NH;
  float scale;
};

// A block owns kOwn rows (queries, or keys in dK/dV): kWarps warps of 16.
inline constexpr int kOwn = 64;
inline constexpr int kWarps = kOwn / 16;
inline constexpr int kThreads = kWarps * 32;
inline constexpr unsigned kFullMask = 0xffffffffu;

// The blocks of kOwn rows that `rows` rows take.
__host__ __device__ constexpr unsigned RowTiles(int rows) {
  return static_cast<unsigned>((rows + kOwn - 1) / kOwn);
}

__host__ __device__ constexpr size_t Align128(size_t bytes) { return (bytes + 127) / 128 * 128; }

// Regions of dynamic shared memory, each 128-byte aligned.
struct SmemCarver {
  unsigned char* at;
  template <typename T>
  __device__ T* Take(size_t n) {
    T* p = reinterpret_cast<T*>(at);
    at += Align128(n * sizeof(T));
    return p;
  }
};

// x rounded to the tile type.
template <typename TT>
__device__ __forceinline__ TT ToTile(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 ToTile<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <>
__device__ __forceinline__ __half ToTile<__half>(float x) {
  return __float2half(x);
}

// Returns f.template operator()<TT, HS>() for TT = __nv_bfloat16 / __half
// (tile kBf16 / kFp16) and HS = hs; cudaErrorInvalidValue for any other tile
// or a head size that is not a multiple of 16 up to 128.
template <typename F>
cudaError_t WithTensorCoreTile(TileType tile, int hs, F&& f) {
  const auto with_head_size = [&](auto tile_zero) -> cudaError_t {
    using TT = decltype(tile_zero);
    switch (hs) {
      case 16:
        return f.template operator()<TT, 16>();
      case 32:
        return f.template operator()<TT, 32>();
      case 48:
        return f.template operator()<TT, 48>();
      case 64:
        return f.template operator()<TT, 64>();
      case 80:
        return f.template operator()<TT, 80>();
      case 96:
        return f.template operator()<TT, 96>();
      case 112:
        return f.template operator()<TT, 112>();
      case 128:
        return f.template operator()<TT, 128>();
      default:
        return cudaErrorInvalidValue;
    }
  };
  switch (tile) {
    case TileType::kBf16:
      return with_head_size(__nv_bfloat16{});
    case TileType::kFp16:
      return with_head_size(__half{});
    case TileType::kFloat:
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace fleet::trainer::cuda::gpt
