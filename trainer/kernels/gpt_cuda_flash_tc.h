// Causal flash attention on tensor cores (FlashAttention-2's loop order, Dao
// 2023) for the bf16 and fp16 precisions of CudaGptKernels: q, k, v and dout
// are read from the float32 buffers, converted to bf16 / fp16 tiles in shared
// memory and multiplied with nvcuda::wmma (16x16x16 fragments, float32
// accumulators); softmax statistics, probabilities' exponentials and every
// output stay float32. Only the B * NH * T row log-sum-exps go between
// forward and backward; no T x T matrix exists in global memory.
//
// A block owns 64 rows (4 warps x 16): queries in forward and dQ, keys in
// dK/dV; the other side streams through in tiles of 64 rows (head size <= 64)
// or 32 (head size 80..128), so shared memory stays under 91 KiB, within the
// 99 KiB a block may have on sm_86/sm_89. dK/dV and dQ are separate kernels,
// each recomputing the probabilities, so every gradient element has one
// writer: no atomics, the same bits on every call.
//
// Used by gpt_cuda_ops.cu for head sizes that are multiples of 16 up to 128
// when TensorCoreAttentionAvailable(); the float32 tile kernels there serve
// every other case. Kept free of C++20 (nvcc compiles it as C++17).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "trainer/kernels/gpt_cuda_ops.h"  // TileType

namespace fleet::trainer::cuda::gpt {

// Head sizes the tensor-core kernels take: multiples of 16 up to this.
inline constexpr int kMaxTensorCoreHeadSize = 128;

// True when `tile` is bf16 or fp16 and `head_size` a multiple of 16 up to
// kMaxTensorCoreHeadSize.
bool TensorCoreAttentionSupports(TileType tile, int head_size);

// True when the current device can run the tensor-core kernels: compute
// capability 8.0 or newer and this build holds code compiled for sm_80 or
// newer (a build for an older architecture alone, JIT-compiled from its PTX,
// would not have them). Queries the device; call once, not per launch.
bool TensorCoreAttentionAvailable();

// Forward over the layout of AttentionForwardKernel's ForwardParams: Tq
// queries per sequence at positions past .. past + Tq - 1 (row stride q_ld,
// sequences q_batch apart), keys and values rows 0 .. past + Tq - 1 (stride
// kv_ld, sequences kv_batch apart); out: [B, Tq, C]; lse: [B, NH, Tq] or null.
// REQUIRES: TensorCoreAttentionSupports(tile, C / NH).
cudaError_t TensorCoreAttentionForward(float* out, float* lse, const float* q, const float* k,
                                       const float* v, size_t q_batch, size_t kv_batch, size_t q_ld,
                                       size_t kv_ld, int B, int Tq, int past, int C, int NH,
                                       TileType tile, cudaStream_t s);

// dqkv += the gradient of AttentionForward over qkv [B, T, 3C]; dots: the
// rows' dout . out [B, NH, T] (computed by the caller), lse the forward's.
// REQUIRES: TensorCoreAttentionSupports(tile, C / NH).
cudaError_t TensorCoreAttentionBackward(float* dqkv, const float* dout, const float* qkv,
                                        const float* lse, const float* dots, int B, int T, int C,
                                        int NH, TileType tile, cudaStream_t s);

}  // namespace fleet::trainer::cuda::gpt
