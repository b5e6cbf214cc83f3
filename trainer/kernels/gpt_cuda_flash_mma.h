// Causal flash attention with the scores and probabilities in registers
// (FlashAttention-2, Dao 2023): the same contract as TensorCoreAttentionForward
// / TensorCoreAttentionBackward (gpt_cuda_flash_tc.h), another implementation.
//
// Where gpt_cuda_flash_tc.cu stages every score and probability tile through
// shared memory between nvcuda::wmma calls, these kernels issue
// mma.sync.aligned.m16n8k16 (bf16 or fp16 operands, float32 accumulators)
// through inline PTX, whose accumulator layout is known: the float32 C
// fragments of two neighbouring 16x8 score tiles, rounded to 16-bit pairs,
// are the A fragment of the next product (P V, P^T dO, dS^T Q, dS K), so
// scores, probabilities and dS never leave registers. Only q, k, v and dout
// tiles (16-bit, some stored transposed so that B operands are contiguous
// pairs) go through shared memory. Softmax statistics and every output stay
// float32; lse is the natural log-sum-exp of the scaled scores, as there.
//
// A block owns 64 rows (4 warps x 16): queries in forward and dQ, keys in
// dK/dV; the other side streams in tiles of 64 rows (head size <= 64) or 32
// (80..128); shared memory at most 71.3 KiB (dK/dV at head size 128). dK/dV
// and dQ are separate kernels: every gradient element has one writer, no
// atomics, the same bits on every call.
//
// STATUS: CudaGptKernels' default tensor-core attention. Written without a
// GPU; its logic passes the CPU emulation of CUDA on every build
// (tests/trainer/gpt_flash_mma_emulated_test.cc), and on an NVIDIA H200
// (2026-12-04, scripts/gpu_check.sh) it passed every attention case of
// trainer_gpt_cuda_kernels_test and took 27.4 ms of a GPT-2 124M step
// (B 16 x T 1024, bf16) against the wmma kernels' 37.9 (bench/README.md).
// MmaTransposes::kLdMatrix (below) has run on the emulation only.
//
// Kept free of C++20 (nvcc compiles it as C++17).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "trainer/kernels/gpt_cuda_ops.h"  // TileType

namespace fleet::trainer::cuda::gpt {

// How the kernels take the mma B operands that need a transpose (V in O +=
// P V, dO and Q in dV and dK, K in dQ). kCopies: every block rounds each
// such tile a second time into a transposed copy in shared memory (float32
// rows read a column at a time). kLdMatrix: from the row-major tiles the
// kernels load anyway, by ldmatrix.trans: no transposed copies, half the
// tile loads of the backward kernels and a quarter of the shared-memory
// loads for those operands. The same products in the same order, so the
// same bits (the emulated test checks it). kLdMatrix has not run on a GPU
// yet; kCopies is what CudaGptKernels' default (kMma) runs.
enum class MmaTransposes { kCopies, kLdMatrix };

// As TensorCoreAttentionForward, same arguments and outputs.
// REQUIRES: TensorCoreAttentionSupports(tile, C / NH) and
// TensorCoreAttentionAvailable() (gpt_cuda_flash_tc.h).
cudaError_t MmaAttentionForward(float* out, float* lse, const float* q, const float* k,
                                const float* v, size_t q_batch, size_t kv_batch, size_t q_ld,
                                size_t kv_ld, int B, int Tq, int past, int C, int NH, TileType tile,
                                MmaTransposes transposes, cudaStream_t s);

// As TensorCoreAttentionBackward: dqkv += the gradient.
// REQUIRES: as MmaAttentionForward.
cudaError_t MmaAttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* lse,
                                 const float* dots, int B, int T, int C, int NH, TileType tile,
                                 MmaTransposes transposes, cudaStream_t s);

}  // namespace fleet::trainer::cuda::gpt
