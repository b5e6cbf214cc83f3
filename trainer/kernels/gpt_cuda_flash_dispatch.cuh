// The one switch from (tile type, head size) to the compile-time template
// arguments of the tensor-core attention kernels, shared by
// gpt_cuda_flash_tc.cu (wmma) and gpt_cuda_flash_mma.cu (mma.sync). For .cu
// files only (C++17).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "trainer/kernels/gpt_cuda_ops.h"  // TileType

namespace fleet::trainer::cuda::gpt {

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
